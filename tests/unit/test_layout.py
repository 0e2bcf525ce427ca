"""The package's layers import one way (README, "Layout"), and only the Triton glue knows Triton."""

from __future__ import annotations

import ast

import pytest

from switchboard.paths import ROOT

LEAVES = {
    "switchboard.wire",
    "switchboard.paths",
    "switchboard.nice",
    "switchboard.console",
    "switchboard.redis_conn",
}
# layer -> the switchboard modules or packages it may import (besides its own)
ALLOWED = {
    "switchboard.wire": set(),
    "switchboard.paths": set(),
    "switchboard.nice": set(),
    "switchboard.redis_conn": set(),
    "switchboard.console": {"switchboard.paths"},
    "switchboard.artifact": LEAVES,
    "switchboard.kv": LEAVES | {"switchboard.artifact"},
    "switchboard.serving": LEAVES | {"switchboard.artifact"},
    "switchboard.engine": LEAVES | {"switchboard.artifact"},
    "switchboard.triton": LEAVES
    | {"switchboard.artifact", "switchboard.serving", "switchboard.engine", "switchboard.kv"},
    "switchboard.client": {"switchboard.wire"},
    # The HTTP front end: the SDK to reach chat, and chat's own request rules to check messages alike.
    "switchboard.gateway": LEAVES | {"switchboard.client", "switchboard.serving"},
}
FOLDERS = {
    "switchboard": "switchboard",
    "client": "switchboard.client",
    "export": "switchboard.export",
    "perf": "switchboard.perf",
}


def _modules():
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([package, *parts]), path


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "switchboard":  # from switchboard import paths
                yield from (f"switchboard.{a.name}" for a in node.names)
            else:
                yield node.module


def _layer(module: str) -> str | None:
    return next((layer for layer in ALLOWED if module == layer or module.startswith(layer + ".")), None)


MODULES = list(_modules())


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_point_one_way(module, path):
    layer = _layer(module)
    for name in _imports(path):
        if name == "triton_python_backend_utils":
            assert layer == "switchboard.triton", f"{module}: only switchboard.triton imports {name}"
        if layer is None or not name.startswith("switchboard"):
            continue
        target = _layer(name) or name
        assert target == layer or target in ALLOWED[layer], f"{module} imports {name}: {layer} may not import it"


def test_every_folder_of_the_package_is_a_layer_of_the_layout():
    packages = {p.name for p in (ROOT / "switchboard").iterdir() if (p / "__init__.py").is_file()}
    assert packages == {"artifact", "kv", "serving", "engine", "triton", "ops", "training", "gateway"}

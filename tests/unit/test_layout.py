"""The package's layers import one way (README, "Layout"), and only the Triton glue knows Triton."""

from __future__ import annotations

import ast

import pytest

from switchboard.paths import ROOT

LEAVES = {
    "switchboard.wire",
    "switchboard.codec",
    "switchboard.paths",
    "switchboard.nice",
    "switchboard.console",
    "switchboard.redis_conn",
}
# layer -> the switchboard modules or packages it may import (besides its own)
ALLOWED = {
    "switchboard.wire": set(),
    "switchboard.codec": set(),  # Triton's gRPC messages, for the SDK and chat's streams to its pools
    "switchboard.paths": set(),
    "switchboard.nice": set(),
    "switchboard.redis_conn": set(),
    "switchboard.console": {"switchboard.paths"},
    "switchboard.artifact": LEAVES,
    "switchboard.kv": LEAVES | {"switchboard.artifact"},
    "switchboard.serving": LEAVES | {"switchboard.artifact"},
    "switchboard.engine": LEAVES | {"switchboard.artifact"},
    # Speech: audio, features, batching and decoding of the recognizer pool (on the engine's
    # runtime helpers and chat's incremental detokenizer).
    "switchboard.asr": LEAVES | {"switchboard.artifact", "switchboard.engine", "switchboard.serving"},
    "switchboard.triton": LEAVES
    | {"switchboard.artifact", "switchboard.serving", "switchboard.engine", "switchboard.kv", "switchboard.asr"},
    "switchboard.client": {"switchboard.wire", "switchboard.codec"},
    # The HTTP front end: the SDK to reach chat, and chat's own request rules to check messages alike.
    "switchboard.gateway": LEAVES | {"switchboard.client", "switchboard.serving", "switchboard.asr"},
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
    assert packages == {"artifact", "kv", "serving", "engine", "triton", "ops", "training", "gateway", "asr"}


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at module level or inside functions (a lazy
    import only hides a circle until both modules change together). ``from a import b`` points
    at ``a.b`` when that is a module."""
    known = {m for m, _ in MODULES}
    graph = {}
    for module, path in MODULES:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package ``level - 1`` above this one
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            targets.update(n for n in names if n in known and n != module)
        graph[module] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, f"import circles (module-level or inside functions): {cycles}"


def test_the_cycle_check_sees_function_level_imports():
    graph = {"a": {"b"}, "b": set(), "c": set()}
    assert _cycles(graph) == []
    graph["b"].add("a")
    assert _cycles(graph) == [["a", "b"]]
    real = _graph()
    assert "switchboard.ops.balancer" in real["switchboard.ops.launch"]  # imported inside _up_replicas


def test_the_readme_stays_a_front_page():
    """Detail and measurement history belong in docs/; the README says what it is and how to start."""
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 12_000, f"README.md is {size} bytes: move detail to docs/"

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
    "switchboard.stamp",
}
# layer -> the switchboard modules or packages it may import (besides its own). Read bottom up:
# the leaves; artifact and the model repository; the runtime pieces; speech; the Triton glue,
# the client and the gateway; then the tools that build and run it: training, export, ops.
ALLOWED = {
    "switchboard.wire": set(),
    "switchboard.codec": set(),  # Triton's gRPC messages, for the SDK and chat's streams to its pools
    "switchboard.paths": set(),
    "switchboard.nice": set(),
    "switchboard.redis_conn": set(),
    "switchboard.console": {"switchboard.paths"},
    # Build steps skipped when their inputs are unchanged (training, converters, export).
    "switchboard.stamp": {"switchboard.console"},
    "switchboard.artifact": LEAVES,
    # The model repository: what each config says and how a model reads it, rendering,
    # installing, versions. Triton-free: export, ops and the Triton glue all use it.
    "switchboard.repository": LEAVES | {"switchboard.artifact"},
    # What both channels use and neither owns: detokenizer, breaker, tallies, response streams,
    # traces.
    "switchboard.common": LEAVES,
    # Which runtime runs a model, and ONNX Runtime's and PyTorch's settings, for both channels.
    "switchboard.runtime": LEAVES,
    "switchboard.kv": LEAVES | {"switchboard.artifact"},
    "switchboard.serving": LEAVES | {"switchboard.artifact", "switchboard.common"},
    "switchboard.engine": LEAVES | {"switchboard.artifact", "switchboard.common", "switchboard.runtime"},
    # Speech: audio, features, batching and decoding of the recognizer pool (on the engine's
    # runtime layer).
    "switchboard.asr": LEAVES | {"switchboard.artifact", "switchboard.common", "switchboard.runtime"},
    "switchboard.triton": LEAVES
    | {
        "switchboard.artifact",
        "switchboard.repository",
        "switchboard.common",
        "switchboard.runtime",
        "switchboard.serving",
        "switchboard.engine",
        "switchboard.kv",
        "switchboard.asr",
    },
    "switchboard.client": {"switchboard.wire", "switchboard.codec"},
    # The HTTP front end: the SDK to reach chat, and chat's own request rules to check messages alike;
    # its requests' spans (common's tracing).
    "switchboard.gateway": LEAVES
    | {"switchboard.client", "switchboard.serving", "switchboard.asr", "switchboard.common"},
    # What models are made from: the corpus (with the demo tools its conversations offer), its speech.
    "switchboard.data": LEAVES | {"switchboard.serving"},
    # What the exported models are judged on: answers, tool calls, the agent's checks.
    "switchboard.evaluation": LEAVES
    | {"switchboard.data", "switchboard.artifact", "switchboard.engine", "switchboard.serving"},
    # Checkpoints that train nothing: converted (Whisper from CTranslate2) or random-weight shapes.
    "switchboard.checkpoints": LEAVES | {"switchboard.data"},
    # The trainers: the chat model, the recognizer, the Gemma agent; a trained model is checked
    # on the engine's runtime and with chat's prompt and demo tools.
    "switchboard.training": LEAVES
    | {"switchboard.data", "switchboard.artifact", "switchboard.engine", "switchboard.serving", "switchboard.asr"},
    # Checkpoints become artifacts, calibrated on the corpus, judged by the evaluation's checks
    # on the runtimes, installed through the repository.
    "switchboard.export": LEAVES
    | {
        "switchboard.artifact",
        "switchboard.engine",
        "switchboard.asr",
        "switchboard.data",
        "switchboard.evaluation",
        "switchboard.repository",
    },
    # Running the stack: processes, probes through the SDK and the pools' wire, versions rolled
    # out through the repository. What it must build, it runs (``python -m switchboard.export.asr``).
    "switchboard.ops": LEAVES
    | {
        "switchboard.artifact",
        "switchboard.asr",
        "switchboard.client",
        "switchboard.serving",
        "switchboard.repository",
    },
}
# What runs from the checkout and is no layer: the bench suite and the developer tools may import
# the package; the package imports neither, and the suite does not import the tools.
UNLAYERED = {"perf", "tools"}
# Imports that break the layers today, each (module, imported module), until the change that owns
# the module removes it (issue 67): the test below fails once one is gone, so the list only shrinks.
PENDING = {
    # a checkpoint converter filed under export/, used by the Gemma trainer (training's converters)
    ("switchboard.training.gemma", "switchboard.export.gguf"),
}
# folder -> package: what the wheel ships, then what runs from the checkout
PACKAGE_FOLDERS = {
    "switchboard": "switchboard",
    "client": "switchboard.client",
    "export": "switchboard.export",
}
FOLDERS = {**PACKAGE_FOLDERS, "perf": "perf", "tools": "tools"}


def _modules():
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([package, *parts]), path


MODULES = list(_modules())
KNOWN = {m for m, _ in MODULES}


def _imports(module: str, source: str, is_package: bool = False) -> set[str]:
    """What ``module`` imports, at module level or inside functions (a lazy import only hides an
    edge until both modules change together), relative imports resolved. ``from a import b``
    names ``a.b`` when that is a module of the package, else ``a``."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package ``level - 1`` above this one
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in KNOWN else base for a in node.names)
    return found


IMPORTS = {module: _imports(module, path.read_text(), path.name == "__init__.py") for module, path in MODULES}


def _layer(module: str) -> str | None:
    return next((layer for layer in ALLOWED if module == layer or module.startswith(layer + ".")), None)


def _part(module: str) -> str:
    """The layer or unlayered part a module belongs to (itself when none)."""
    parts = [*ALLOWED, *UNLAYERED]
    return next((p for p in parts if module == p or module.startswith(p + ".")), module)


@pytest.mark.parametrize("module", [m for m, _ in MODULES])
def test_imports_point_one_way(module):
    layer = _layer(module)
    for name in sorted(IMPORTS[module]):
        if name == "triton_python_backend_utils":
            assert layer == "switchboard.triton", f"{module}: only switchboard.triton imports {name}"
        top = name.split(".")[0]
        if module.startswith("switchboard"):
            assert top not in ("perf", "tools"), f"{module} imports {name}: the product imports only itself"
        if module.startswith("perf"):
            assert top != "tools", f"{module} imports {name}: the bench suite does not import tools"
        if layer is None or not name.startswith("switchboard") or (module, name) in PENDING:
            continue
        target = _part(name)
        assert target == layer or target in ALLOWED[layer], f"{module} imports {name}: {layer} may not import it"


def test_the_layer_check_sees_function_level_and_relative_imports():
    source = "import os\n\ndef f():\n    from switchboard.ops import rollout\n    from .install import x\n"
    found = _imports("switchboard.repository.render", source)
    assert found == {"os", "switchboard.ops.rollout", "switchboard.repository.install"}


def test_every_part_of_the_package_is_a_layer_of_the_layout():
    packages = {f"switchboard.{p.name}" for p in (ROOT / "switchboard").iterdir() if (p / "__init__.py").is_file()}
    packages |= {package for folder, package in FOLDERS.items() if folder != "switchboard"}
    top = {f"switchboard.{p.stem}" for p in (ROOT / "switchboard").glob("*.py") if p.stem != "__init__"}
    assert packages == set(ALLOWED) - LEAVES | UNLAYERED
    assert top == LEAVES


def test_the_layers_form_an_order():
    declared = {layer: {t for t in allowed if t in ALLOWED} for layer, allowed in ALLOWED.items()}
    assert not _cycles(declared), "ALLOWED lets two layers import each other"


def test_the_pending_exceptions_are_still_needed():
    gone = sorted(edge for edge in PENDING if edge[1] not in IMPORTS.get(edge[0], set()))
    assert not gone, f"no longer imported, remove them from PENDING: {gone}"


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``_imports``)."""
    return {module: {n for n in IMPORTS[module] if n in KNOWN and n != module} for module in IMPORTS}


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


def test_no_import_cycles_between_parts():
    """Between the package's parts too (export, ops, training, perf, each package of
    switchboard/): export -> ops -> export is a circle even when no module imports itself back."""
    parts: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        edges = {_part(t) for t in targets if (module, t) not in PENDING}
        parts.setdefault(_part(module), set()).update(edges - {_part(module)})
    for targets in list(parts.values()):
        for t in targets:
            parts.setdefault(t, set())
    cycles = _cycles(parts)
    assert not cycles, f"import circles between parts: {cycles}"


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

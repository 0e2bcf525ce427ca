"""The two locks: requirements.lock is what Switchboard runs on (all the image installs),
requirements-dev.lock the tests', benchmarks' and lint's packages on top. Every direct need is
pinned in its own lock, the locks do not overlap, and nothing the image runs imports a package
only the dev lock pins: the image's build (SETUP_TEST_TOOLS=0) would install the code but not it.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys

import pytest
from packaging.requirements import Requirement

from switchboard.paths import ROOT

# What the image runs: the package, the model repository's glue, the export, and the build's
# smoke (perf.cold_start, with the perf modules it imports).
IMAGE_CODE = ["switchboard", "model_repository", "export"]
IMAGE_ENTRY = ["perf/cold_start.py"]


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def pins(lock: str) -> dict[str, str]:
    out = {}
    for line in (ROOT / lock).read_text().splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            out[_name(name)] = version.strip()
    return out


def needs(spec: str) -> list[str]:
    """The direct needs a requirements .in file names (options such as ``-c`` skipped)."""
    out = []
    for line in (ROOT / spec).read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text and not text.startswith("-"):
            out.append(_name(Requirement(text).name))
    return out


def imported(path) -> set[str]:
    """Top-level names ``path`` imports anywhere (a function's lazy import counts: it runs too)."""
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def image_files():
    files = [p for d in IMAGE_CODE for p in sorted((ROOT / d).rglob("*.py"))]
    todo = [ROOT / e for e in IMAGE_ENTRY]
    seen = set()
    while todo:  # the perf modules the entry points import, and theirs
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        files.append(path)
        for name in imported(path):
            if name.split(".")[0] == "perf":
                module = ROOT / (name.replace(".", "/") + ".py")
                todo += [module] if module.exists() else []
    return files


def test_each_direct_need_is_pinned_in_its_own_lock():
    run, dev = pins("requirements.lock"), pins("requirements-dev.lock")
    assert run and dev
    assert not set(run) & set(dev), "a package pinned in both locks"
    assert [n for n in needs("requirements.in") if n not in run] == []
    assert [n for n in needs("requirements-dev.in") if n not in dev] == []
    assert not set(needs("requirements.in")) & set(needs("requirements-dev.in"))


def test_the_dev_lock_is_constrained_by_the_runtime_lock():
    lines = (ROOT / "requirements-dev.in").read_text().splitlines()
    assert "-c requirements.lock" in lines


@pytest.mark.parametrize("lock", ["requirements.lock", "requirements-dev.lock"])
def test_the_installed_versions_are_the_pinned_ones(lock):
    """make setup installs both locks here: what runs the tests is what the locks say."""
    installed = {_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    wrong = {n: (v, installed.get(n)) for n, v in pins(lock).items() if installed.get(n, "").split("+")[0] != v}
    assert wrong == {}


def test_what_the_image_runs_imports_only_the_runtime_lock():
    run, dev = pins("requirements.lock"), pins("requirements-dev.lock")
    dists = importlib.metadata.packages_distributions()
    found = {}
    for path in image_files():
        for name in imported(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names:
                continue
            for dist in dists.get(top, []):
                if _name(dist) in dev and _name(dist) not in run:
                    found.setdefault(str(path.relative_to(ROOT)), set()).add(_name(dist))
    assert found == {}, f"imports of packages only requirements-dev.lock pins: {found}"


def test_the_check_sees_a_dev_package(tmp_path):
    """The scan above finds an import of a dev-only package (so it can fail)."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import playwright.sync_api\n")
    assert "playwright.sync_api" in imported(module)
    assert "playwright" in pins("requirements-dev.lock")
    assert "playwright" in importlib.metadata.packages_distributions()["playwright"]

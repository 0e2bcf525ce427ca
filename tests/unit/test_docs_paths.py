"""Every repository path the README and docs/ name exists, and every link between them resolves.

A "repository path" is a word that starts with one of the repository's top-level names below
and a slash (``deploy/k8s/monitoring/prometheus-scrape.yml``, ``tests/unit/test_layout.py``),
in backticks, in a link or in plain text. Not checked: build outputs (``build/``, the model files
``make export`` installs under ``model_repository/<model>/<version>/``) and patterns with a
placeholder (``<x>``, ``*``, ``{a,b}``, ``$VAR``, ``...``). docs/decisions/ is left out: a decision
record is history and names what existed when it was written. The top-level names are a fixed
list, not read from the checkout, so a folder that is renamed or removed still has its old
mentions caught.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from switchboard.paths import ROOT

TOP = (
    "switchboard", "docs", "tests", "monitoring", "deploy", "model_repository", "export", "perf",
    "bench", "client", "corpus", "scripts", "tools", ".ci",
)  # fmt: skip
# A top-level name, then a path; not preceded by a character a longer word or a URL would have.
PATH = re.compile(r"(?<![\w./~:-])(?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./+-]*")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.")
GENERATED = re.compile(r"model_repository/[^/]+/\d+/(?!model\.py$)")
NOT_PATHS = {"deploy/switchboard"}  # kubectl's name of the Deployment
# A command a reader copies: `python -m switchboard.perf.bench`, `.venv/bin/python -m perf.bench`.
MODULE = re.compile(r"python3? -m ((?:switchboard|perf|tools)(?:\.\w+)*)")


def documents() -> list[Path]:
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if "decisions" not in p.relative_to(ROOT / "docs").parts]
    return [ROOT / "README.md", *docs]


def named_paths(text: str) -> set[str]:
    found = set()
    for match in PATH.finditer(text):
        end = match.end()
        if PLACEHOLDER.match(text, end):
            continue  # the path goes on with a placeholder: model_repository/<m>/...
        path = match.group().rstrip(".,:;")
        if not PLACEHOLDER.search(path) and not GENERATED.match(path) and path not in NOT_PATHS:
            found.add(path)
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(doc: Path):
    missing = sorted(p for p in named_paths(doc.read_text(encoding="utf-8")) if not (ROOT / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} names paths that are not in the repository: {missing}"


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_a_command_runs_exists(doc: Path):
    modules = sorted(set(MODULE.findall(doc.read_text(encoding="utf-8"))))
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    assert not missing, f"{doc.relative_to(ROOT)} runs modules that do not exist: {missing}"


@pytest.mark.parametrize("doc", [*documents(), *sorted((ROOT / "docs" / "decisions").glob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))  # fmt: skip
def test_every_relative_link_resolves(doc: Path):
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to what is not there: {broken}"


def test_the_pattern_finds_paths_and_leaves_the_rest():
    text = (
        "`deploy/k8s/monitoring/prometheus-scrape.yml`, see tests/unit/test_layout.py. and "
        "[x](docs/voice.md#y) but not `model_repository/<model>/config.pbtxt`, `tests/unit/test_asr_*.py`, "
        "build/bench/report.md, switchboard.perf.bench, https://github.com/a/docs/b.md, "
        "model_repository/asr/1/model.onnx, model_repository/asr/1/model.py"
    )
    assert named_paths(text) == {
        "deploy/k8s/monitoring/prometheus-scrape.yml",
        "tests/unit/test_layout.py",
        "docs/voice.md",
        "model_repository/asr/1/model.py",
    }

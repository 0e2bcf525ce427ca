"""Test tiers by folder: tests/unit (pure modules), tests/bench (the benchmark suite's own
parts, pure: fakes and stubs), tests/tools (the developer tools in tools/), tests/export (export
and quantization of tiny models built in the test), tests/model (the exported default model, no
server), tests/integration (real tritonserver and redis-server on free ports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard import paths
from switchboard.paths import ROOT

ARTIFACTS = paths.ARTIFACTS / "default"


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(str(item.fspath)).relative_to(ROOT / "tests").parts[0]
        if tier in ("unit", "bench", "tools", "export", "model", "integration"):
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def artifacts() -> Path:
    if not (ARTIFACTS / "manifest.json").exists():
        pytest.fail(f"{ARTIFACTS} has no exported model: run `make export` (make test does)")
    return ARTIFACTS

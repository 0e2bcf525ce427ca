"""The suite's one entry (``python -m perf <suite>``) and its modules as the checkout has them:
every suite listed, every module importable (the wheel no longer carries them, so its import
check does not either)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from perf import __main__ as entry
from switchboard.paths import ROOT

PERF = ROOT / "perf"
# Modules with a main() that the suites start as processes of their own: servers, not suites.
PEERS = {"peers", "asr_peers", "vllm_peer"}
# Locust runs on gevent, which patches the process it enters: the locustfile is imported in a
# process of its own, with the settings gateway_cost gives it.
OWN_PROCESS = {"perf.locust_gateway": {"SWITCHBOARD_QUESTIONS": "[]", "SWITCHBOARD_SAMPLES": os.devnull}}


def _has_main(path) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(path.read_text()).body)


def test_every_module_with_a_main_is_a_suite_or_a_peer():
    with_main = {p.stem for p in PERF.glob("*.py") if p.stem != "__main__" and _has_main(p)}
    listed = {module for module, _ in entry.SUITES.values()}
    assert listed <= with_main, listed - with_main
    assert with_main - listed == PEERS


def test_a_suite_gets_the_rest_of_the_command_line(capsys):
    with pytest.raises(SystemExit) as done:
        entry.main(["chat", "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: python -m perf.bench")
    with pytest.raises(SystemExit) as done:
        entry.main(["no-such-suite"])
    assert done.value.code == 2


IMPORT_ALL = """
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = f"{type(e).__name__}: {e}"
print(json.dumps(failed))
"""


def test_every_module_imports_from_the_checkout():
    modules = sorted(f"perf.{p.stem}" for p in PERF.glob("*.py") if p.stem != "__init__")
    runs = [([m for m in modules if m not in OWN_PROCESS], {})] + [([m], env) for m, env in OWN_PROCESS.items()]
    for group, settings in runs:
        done = subprocess.run(
            [sys.executable, "-c", IMPORT_ALL, *group],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, **settings},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.strip().splitlines()[-1]) == {}

"""The wheel as a user gets it: built from a copy of the checkout, installed into a fresh venv,
every module of the package imported there, the gateway started from its console script and
the SDK constructed; and the ``client`` extra free of the server's dependencies.

Nothing is downloaded: the build uses this venv's setuptools (``--no-build-isolation``), the
install takes the wheel alone (``--no-index --no-deps``), and the fresh venv borrows this venv's
third-party packages through a plain path line in a ``.pth`` file. Such a line does not run the
``.pth`` files of the directory it adds, so this venv's editable install of switchboard (a
``.pth`` hook) stays out and only the wheel's copy can be imported; the interpreter runs outside
the checkout so the source tree is not on its path either.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from switchboard.ops.launch import free_ports
from switchboard.ops.process import port_open, stop_process, wait_until
from switchboard.paths import ROOT
from tests.unit.test_layout import PACKAGE_FOLDERS

# What the build reads; the checkout's build/ (the project's build outputs) and caches stay behind.
SOURCES = ["pyproject.toml", "setup.py", "README.md", *PACKAGE_FOLDERS]
SERVER_ONLY = {"torch", "onnxruntime", "fastapi"}


def _run(cmd, cwd, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, src / name)
    dist = tmp / "dist"
    build = ["wheel", "-q", "--no-build-isolation", "--no-deps", "--no-index", "-w", dist, src]
    _run([sys.executable, "-m", "pip", *build], tmp)
    (built,) = dist.glob("switchboard-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh(wheel, tmp_path_factory) -> Path:
    """A venv with the wheel installed and this venv's third-party packages visible; its python."""
    tmp = tmp_path_factory.mktemp("venv")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index", "--no-deps", wheel], tmp)
    # After the install, so pip does not see this venv's switchboard as already installed.
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp).stdout.strip()
    borrowed = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "project-packages.pth").write_text("".join(p + "\n" for p in borrowed))
    return python


def _env(tmp_path: Path, **extra) -> dict:
    """The fresh venv's environment: none of this one's Python settings."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    return {**keep, "HOME": str(tmp_path), **extra}


def _in_fresh(python: Path, code: str, args=(), env=None) -> dict:
    """Runs ``code`` (which prints a JSON object last) with the fresh venv's python, outside the checkout."""
    out = _run([python, "-c", code, *args], python.parent.parent.parent, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def _source_modules() -> set[str]:
    names = set()
    for folder, package in PACKAGE_FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
                names.add(".".join([package, *parts]))
    return names


def _wheel_modules(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        files = [n for n in z.namelist() if n.endswith(".py")]
    return {".".join(p for p in n[: -len(".py")].split("/") if p != "__init__") for n in files}


def test_the_wheel_holds_every_module_and_the_web_chat(wheel):
    assert _wheel_modules(wheel) == _source_modules()
    with zipfile.ZipFile(wheel) as z:
        static = {n.rsplit("/", 1)[1] for n in z.namelist() if n.startswith("switchboard/gateway/static/")}
    assert static == {p.name for p in (ROOT / "switchboard" / "gateway" / "static").iterdir()}


PB_STAND_IN = '''"""A stand-in for the import check."""


def __getattr__(name):
    return 0
'''

IMPORT_ALL = """
import importlib, json, sys
import switchboard
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = f"{type(e).__name__}: {e}"
editable = [m for m in sys.modules if m.startswith("__editable__")]
print(json.dumps({"file": switchboard.__file__, "failed": failed, "editable": editable}))
"""


def test_every_module_imports_from_the_fresh_venv(wheel, fresh, tmp_path):
    # triton_python_backend_utils exists only inside tritonserver: a stand-in lets the Triton glue
    # import; what the glue reads from it at import time (constants) is a placeholder.
    (tmp_path / "triton_python_backend_utils.py").write_text(PB_STAND_IN)
    venv = fresh.parent.parent
    modules = sorted(_wheel_modules(wheel))
    result = _in_fresh(fresh, IMPORT_ALL, modules, _env(tmp_path, PYTHONPATH=str(tmp_path)))
    assert result["failed"] == {}
    assert Path(result["file"]).is_relative_to(venv), f"switchboard came from {result['file']}"
    assert result["editable"] == [], "the checkout's editable install reached the fresh venv"


SDK = """
import json, sys
import switchboard
from switchboard.client import ChatClient
client = ChatClient("127.0.0.1:1", timeout_s=1)
print(json.dumps({"file": switchboard.__file__, "modules": sorted(m.split(".")[0] for m in sys.modules)}))
"""


def test_the_sdk_comes_without_the_server(fresh, tmp_path):
    result = _in_fresh(fresh, SDK, env=_env(tmp_path))
    assert Path(result["file"]).is_relative_to(fresh.parent.parent)
    assert SERVER_ONLY.isdisjoint(result["modules"]), SERVER_ONLY & set(result["modules"])
    _run([fresh.parent / "switchboard-chat", "--help"], tmp_path, env=_env(tmp_path))


def test_the_gateway_starts_from_its_console_script(fresh, tmp_path):
    port, grpc_port = free_ports(2)
    cmd = [fresh.parent / "switchboard-gateway", "--port", port, "--grpc-url", f"127.0.0.1:{grpc_port}"]
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(c) for c in cmd], cwd=tmp_path, env=_env(tmp_path), stdout=out, stderr=out, start_new_session=True
        )
    try:
        wait_until(lambda: port_open(port), 60, f"the gateway ({log.read_text()})", proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert json.load(r) == {"status": "ok"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:  # the web chat: package data
            assert r.status == 200 and "text/html" in r.headers["content-type"]
    finally:
        stop_process(proc)


def _needs(metadata: str, extra: str) -> set[str]:
    """The distributions ``pip install switchboard[extra]`` asks for, through extras of switchboard itself."""
    reqs = [Requirement(line.split(":", 1)[1]) for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    names, extras, todo = set(), set(), [extra]
    while todo:
        e = todo.pop()
        extras.add(e)
        for r in reqs:
            if r.marker is None or r.marker.evaluate({"extra": e}):
                if r.name == "switchboard":
                    todo += [x for x in r.extras if x not in extras]
                else:
                    names.add(r.name)
    return names


def test_the_extras_split_client_gateway_and_server(wheel):
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    client, gateway, server = (_needs(metadata, e) for e in ("client", "gateway", "server"))
    assert "tritonclient" in client and client.isdisjoint(SERVER_ONLY), client
    assert {"tritonclient", "fastapi", "uvicorn"} <= gateway and gateway.isdisjoint({"torch", "onnxruntime"}), gateway
    assert {"onnxruntime", "tokenizers", "jinja2", "redis", "tritonclient"} <= server and "torch" not in server, server

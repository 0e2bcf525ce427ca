"""``asr_gpu_served``'s server pack: what it holds of a pytriton build and how ``install_backend``
finds it unpacked (``SWITCHBOARD_TRITONSERVER``), on a stand-in of the wheel's layout."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

import pytest

from perf import asr_gpu_served
from switchboard.ops import install_backend


def fake_site(root: Path, python: str) -> Path:
    """The parts of site-packages the server pack reads, each file holding its own name."""
    server = root / "pytriton" / "tritonserver"
    files = [
        server / "bin" / "tritonserver",
        server / "backends" / "python" / "libtriton_python.so",
        server / "backends" / "python" / "triton_python_backend_utils.py",
        server / "backends" / "python" / "__pycache__" / "triton_python_backend_utils.cpython-312.pyc",
        server / "caches" / "local" / "libtritoncache_local.so",
        server / "python_backend_stubs" / python / "triton_python_backend_stub",
        server / "python_backend_stubs" / "3.8" / "triton_python_backend_stub",
        root / "nvidia_pytriton.libs" / "libtritonserver-1.so",
        root / "nvidia_pytriton.libs" / "libpython3-2.13.so.1.0",
    ]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f.name)
    return root


def test_the_pack_holds_the_server_and_one_stub_and_installs_where_unpacked(tmp_path, monkeypatch):
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    monkeypatch.setenv("SWITCHBOARD_TRITONSERVER", str(fake_site(tmp_path / "site", python)))
    tarball = asr_gpu_served.pack(tmp_path / "pack", python, preset=0)
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    assert f"pytriton/tritonserver/python_backend_stubs/{python}/triton_python_backend_stub" in names
    assert "pytriton/tritonserver/bin/tritonserver" in names
    assert "nvidia_pytriton.libs/libtritonserver-1.so" in names
    assert not any("3.8" in n or "libpython" in n or "__pycache__" in n for n in names)

    unpacked = asr_gpu_served.unpack(tarball, tmp_path / "work")
    monkeypatch.setenv("SWITCHBOARD_TRITONSERVER", str(unpacked))
    assert install_backend.server_binary().read_text() == "tritonserver"
    assert install_backend.server_library_dir() == unpacked / "nvidia_pytriton.libs"
    backend = install_backend.install(tmp_path / "backends")
    assert sorted(p.name for p in backend.iterdir()) == [
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]


def test_a_pack_for_a_python_without_a_stub_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SWITCHBOARD_TRITONSERVER", str(fake_site(tmp_path / "site", "3.12")))
    with pytest.raises(SystemExit, match="no Python backend stub for Python 3.99"):
        asr_gpu_served.pack(tmp_path / "pack", "3.99", preset=0)
    assert not (tmp_path / "pack" / asr_gpu_served.TARBALL).exists()


def test_settings_must_be_switchboard_keys(capsys):
    with pytest.raises(SystemExit):
        asr_gpu_served.main(["run", "--pack", "x", "--set", "DEVICE=cpu"])
    assert "expected SWITCHBOARD_KEY=VALUE" in capsys.readouterr().err

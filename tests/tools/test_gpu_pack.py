"""What crosses to a lent GPU machine (tools/gpu_pack.py): the recognizers' weights as per-row
INT8 and back, the server's pack from a pytriton build and how ``install_backend`` finds it
unpacked (``SWITCHBOARD_TRITONSERVER``, on a stand-in of the wheel's layout), and the chat
model's checkpoint halved and carried without its graphs."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from perf import gpu_machine
from switchboard.ops import install_backend
from tools import gpu_pack

safetensors_numpy = pytest.importorskip("safetensors.numpy")
load_file, save_file = safetensors_numpy.load_file, safetensors_numpy.save_file


def test_rows_quantize_within_half_a_step_and_zero_rows_survive():
    w = np.random.default_rng(0).standard_normal((64, 300)).astype(np.float32)
    w[3] = 0.0
    q, scale = gpu_pack.quantize_rows(w)
    assert q.dtype == np.int8 and scale.shape == (64, 1)
    assert np.abs(q).max() <= 127
    assert np.all(np.abs(q.astype(np.float32) * scale - w) <= scale / 2 + 1e-7)
    assert not q[3].any()


def test_pack_then_unpack_gives_the_checkpoint_back(tmp_path):
    rng = np.random.default_rng(1)
    weights = {
        "big": rng.standard_normal((512, 256)).astype(np.float32),  # quantized
        "small": rng.standard_normal((4, 8)).astype(np.float32),  # float16
        "bias": rng.standard_normal(256).astype(np.float32),  # float16
    }
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    safetensors_numpy.save_file(weights, ckpt / "model.safetensors")
    (ckpt / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    packed = gpu_pack.pack_checkpoint(ckpt, tmp_path / "packed")
    stored = safetensors_numpy.load_file(packed / gpu_machine.PACKED)
    assert stored["big.q"].dtype == np.int8 and stored["small"].dtype == np.float16
    assert (packed / gpu_machine.PACKED).stat().st_size < (ckpt / "model.safetensors").stat().st_size / 3
    back = safetensors_numpy.load_file(gpu_machine.unpack_checkpoint(packed, tmp_path / "back") / "model.safetensors")
    assert sorted(back) == sorted(weights)
    for name, w in weights.items():
        assert back[name].dtype == np.float32 and back[name].shape == w.shape
        np.testing.assert_allclose(back[name], w, atol=np.abs(w).max() / 127)
    assert (tmp_path / "back" / "config.json").read_text() == (ckpt / "config.json").read_text()


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
    tarball = gpu_pack.pack_server(tmp_path / "pack", python, preset=0)
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    assert f"pytriton/tritonserver/python_backend_stubs/{python}/triton_python_backend_stub" in names
    assert "pytriton/tritonserver/bin/tritonserver" in names
    assert "nvidia_pytriton.libs/libtritonserver-1.so" in names
    assert not any("3.8" in n or "libpython" in n or "__pycache__" in n for n in names)

    unpacked = gpu_machine.unpack_server(tarball, tmp_path / "work")
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
        gpu_pack.pack_server(tmp_path / "pack", "3.99", preset=0)
    assert not (tmp_path / "pack" / gpu_machine.SERVER_TARBALL).exists()


def test_the_checkpoint_is_carried_in_float16_with_its_side_files(tmp_path):
    source = tmp_path / "ckpt"
    source.mkdir()
    weights = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "ids": np.arange(3)}
    save_file(weights, str(source / "model.safetensors"))
    (source / "config.json").write_text("{}")
    gpu_pack.half_checkpoint(source, tmp_path / "half")
    half = load_file(str(tmp_path / "half" / "model.safetensors"))
    assert half["w"].dtype == np.float16 and half["ids"].dtype == weights["ids"].dtype
    np.testing.assert_allclose(half["w"], weights["w"], atol=1e-3)
    assert (tmp_path / "half" / "config.json").read_text() == "{}"


def test_the_chat_model_is_carried_without_its_graphs_or_glue(tmp_path):
    names = ["manifest.json", "tokenizer.json", "model.onnx", "model.onnx.data", "model.int8-dynamic.onnx", "model.py"]
    for name in [*names, "faq.json"]:
        (tmp_path / name).write_text("x")
    (tmp_path / "__pycache__").mkdir()
    carried = [f.name for f in gpu_pack.chat_files(tmp_path)]
    assert carried == ["faq.json", "manifest.json", "tokenizer.json"]

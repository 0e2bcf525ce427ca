"""The asr glue's choice of runtime (asr/config.pbtxt's ``runtime``, ``device``, ``torch_dtype``),
with a stubbed ``triton_python_backend_utils``: a wrong value fails the load naming the parameter,
and ``runtime: torch`` names the checkpoint it needs when it is not there."""

from __future__ import annotations

import dataclasses

import pytest

from switchboard.asr.runtime import AsrManifest
from tests.unit.pb_stub import forget, stub_glue


@pytest.fixture
def glue(monkeypatch):
    yield stub_glue(monkeypatch, "switchboard.triton.asr_model")
    forget("switchboard.triton.asr_model")


@pytest.fixture
def version(tmp_path):
    """A version directory whose manifest names a checkpoint that does not exist."""
    special = {"start": 1, "eos": 2, "notimestamps": 3}
    manifest = AsrManifest(
        "m", str(tmp_path / "gone"), 80, 3000, 1500, 448, False, {"en": None}, special, [], [], 1, 1, 4, 8
    )
    manifest.save(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"runtime": "tensorrt"}, "'runtime' = 'tensorrt'"),
        ({"runtime": "torch", "device": "gpu0"}, "'device' = 'gpu0'"),
        ({"runtime": "torch", "device": "cuda:x"}, "'device' = 'cuda:x'"),
        ({"runtime": "torch", "torch_dtype": "int8"}, "'torch_dtype' = 'int8'"),
    ],
)
def test_a_wrong_runtime_setting_fails_the_load_naming_it(glue, version, changes, named):
    with pytest.raises(glue.ConfigError, match=named):
        glue.TritonPythonModel()._load_model(version, dataclasses.replace(glue.AsrConfig(), **changes))


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_the_torch_runtime_names_the_checkpoint_it_cannot_find(glue, version, device):
    cfg = dataclasses.replace(glue.AsrConfig(), runtime="torch", device=device)
    with pytest.raises(FileNotFoundError, match=f"{version / 'gone'}.*asr.json's source"):
        glue.TritonPythonModel()._load_model(version, cfg)

"""``voice_gpu_served``'s pure parts: asr's settings written into its config, the chat model's
checkpoint halved for the carry, the chat model's files carried without its graphs."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from perf import asr_gpu_served, voice_gpu_served
from switchboard import paths
from switchboard.ops.rollout import RolloutError, with_parameters

ASR_CONFIG = paths.MODEL_REPOSITORY / "asr" / "config.pbtxt"


def test_the_gpu_settings_become_asr_parameters_in_its_config():
    params = voice_gpu_served.parameters(asr_gpu_served.SERVED_ENV)
    assert params == {"runtime": "torch", "device": "cuda", "torch_dtype": "float16", "torch_steps": "graphs"}
    text = with_parameters(ASR_CONFIG.read_text(), params, ASR_CONFIG)
    for key, value in params.items():
        assert f'{{ key: "{key}" value: {{ string_value: "{value}" }} }}' in text
    assert text.count("key:") == ASR_CONFIG.read_text().count("key:")  # set, none added


def test_a_parameter_the_config_lacks_is_an_error_naming_the_file():
    with pytest.raises(RolloutError, match=r"config.pbtxt has no parameter 'no_such_key'"):
        with_parameters(ASR_CONFIG.read_text(), {"no_such_key": "1"}, ASR_CONFIG)


def test_the_checkpoint_is_carried_in_float16_with_its_side_files(tmp_path):
    source = tmp_path / "ckpt"
    source.mkdir()
    weights = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "ids": np.arange(3)}
    save_file(weights, str(source / "model.safetensors"))
    (source / "config.json").write_text("{}")
    voice_gpu_served.half_checkpoint(source, tmp_path / "half")
    half = load_file(str(tmp_path / "half" / "model.safetensors"))
    assert half["w"].dtype == np.float16 and half["ids"].dtype == weights["ids"].dtype
    np.testing.assert_allclose(half["w"], weights["w"], atol=1e-3)
    assert (tmp_path / "half" / "config.json").read_text() == "{}"


def test_the_chat_model_is_carried_without_its_graphs_or_glue(tmp_path):
    names = ["manifest.json", "tokenizer.json", "model.onnx", "model.onnx.data", "model.int8-dynamic.onnx", "model.py"]
    for name in [*names, "faq.json"]:
        (tmp_path / name).write_text("x")
    (tmp_path / "__pycache__").mkdir()
    carried = [f.name for f in voice_gpu_served.chat_files(tmp_path)]
    assert carried == ["faq.json", "manifest.json", "tokenizer.json"]

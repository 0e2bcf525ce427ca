"""``voice_gpu_served``'s pure parts: asr's settings written into its config (what it carries:
tests/tools/test_gpu_pack.py)."""

from __future__ import annotations

import pytest

from perf import gpu_machine, voice_gpu_served
from switchboard import paths
from switchboard.repository.versions import RepositoryError, with_parameters

ASR_CONFIG = paths.MODEL_REPOSITORY / "asr" / "config.pbtxt"


def test_the_gpu_settings_become_asr_parameters_in_its_config():
    params = voice_gpu_served.parameters(gpu_machine.SERVED_ENV)
    assert params == {"runtime": "torch", "device": "cuda", "torch_dtype": "float16", "torch_steps": "graphs"}
    text = with_parameters(ASR_CONFIG.read_text(), params, ASR_CONFIG)
    for key, value in params.items():
        assert f'{{ key: "{key}" value: {{ string_value: "{value}" }} }}' in text
    assert text.count("key:") == ASR_CONFIG.read_text().count("key:")  # set, none added


def test_a_parameter_the_config_lacks_is_an_error_naming_the_file():
    with pytest.raises(RepositoryError, match=r"config.pbtxt has no parameter 'no_such_key'"):
        with_parameters(ASR_CONFIG.read_text(), {"no_such_key": "1"}, ASR_CONFIG)

"""``asr_gpu_served``'s options (its server pack: tests/tools/test_gpu_pack.py)."""

from __future__ import annotations

import pytest

from perf import asr_gpu_served


def test_settings_must_be_switchboard_keys(capsys):
    with pytest.raises(SystemExit):
        asr_gpu_served.main(["run", "--pack", "x", "--set", "DEVICE=cpu"])
    assert "expected SWITCHBOARD_KEY=VALUE" in capsys.readouterr().err

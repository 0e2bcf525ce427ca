"""perf/mixed_passes.py: its report and its refusals (the engine run: tests/model/test_torch_runtime.py)."""

from __future__ import annotations

import pytest

from perf.mixed_passes import main, report_md


def test_the_report_puts_the_arms_side_by_side():
    results = {
        "settings": {"prompt_tokens": 256, "rows": 7, "checkpoint": "m", "threads": 2, "budget": 64, "repeats": 3},
        "arms": {
            "mixed passes": {"ttft_ms": 100.0, "tokens_meanwhile": 4.0, "longest_gap_ms": 30.0},
            "passes apart": {"ttft_ms": 120.0, "tokens_meanwhile": 3.0, "longest_gap_ms": 40.0},
        },
    }
    md = report_md(results)
    assert "A 256-token prompt beside 7 decoding rows" in md
    assert "| mixed passes | 100.0 | 4.0 | 30.0 |" in md and "| passes apart | 120.0 | 3.0 | 40.0 |" in md


@pytest.mark.parametrize(
    "argv, error",
    [(["--rows", "0"], "at least 1"), (["--checkpoint", "/nonexistent"], "not a Hugging Face checkpoint")],
)
def test_what_cannot_be_measured_is_refused(argv, error, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert error in capsys.readouterr().err

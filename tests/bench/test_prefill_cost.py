"""perf/prefill_cost.py's pure parts: a pass's inputs, ONNX Runtime's profile summed by
operator type, and the report's table."""

from types import SimpleNamespace

import numpy as np
import pytest

from perf.prefill_cost import main, op_profile, pass_inputs, report_md


def test_a_pass_continues_the_cached_prefix():
    m = SimpleNamespace(vocab_size=500, num_kv_heads=2, head_dim=4, num_layers=3)
    ids, mask, positions, past = pass_inputs(m, np.float32, batch=2, prefix=5, new=3)
    assert ids.shape == (2, 3) and ids.max() < 500
    assert mask.shape == (2, 8) and mask.all()
    assert positions.tolist() == [[5, 6, 7]] * 2
    assert len(past) == 3 and past[0][0].shape == (2, 2, 5, 4) and past[0][1].dtype == np.float32


def test_the_profile_sums_kernel_time_by_operator():
    trace = [
        {"cat": "Session", "name": "model_run", "dur": 900},
        {"cat": "Node", "name": "MatMul_1_kernel_time", "dur": 100, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "MatMul_2_kernel_time", "dur": 50, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "MatMul_2_fence_before", "dur": 7, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "Softmax_kernel_time", "dur": 25, "args": {"op_name": "Softmax"}},
    ]
    assert op_profile(trace) == {"MatMul": 150.0, "Softmax": 25.0}


def test_the_report_puts_each_prefill_token_against_the_decode_ceiling():
    results = {
        "artifacts": "a",
        "threads": 2,
        "context": 256,
        "prefix": 0,
        "machine": {"cpu": "x"},
        "precisions": {
            "fp32": {
                "decode_us_per_token": {1: 1000.0, 8: 200.0},
                "prefill_us_per_token": {"16x1": 100.0, "16x8": 50.0},
                "prefill_over_decode_ceiling": {"16x1": 0.5, "16x8": 0.25},
                "profiles": {"decode x8": {"MatMul": 1500.0, "Softmax": 500.0}},
            }
        },
    }
    md = report_md(results, [16], [1, 8])
    assert "| decode | 1000 | 200 |" in md
    assert "| prefill, chunk 16 | 100 (0.50) | 50 (0.25) |" in md
    assert "decode x8: 2.0 ms of kernels; MatMul 75%, Softmax 25%" in md


def test_an_artifacts_directory_without_a_model_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--artifacts", str(tmp_path)])
    assert "no manifest.json" in capsys.readouterr().err

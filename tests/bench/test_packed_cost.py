"""perf/packed_cost.py: the passes it times and their inputs (export/packed_choice.py's, which the
export times too), its report and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from perf.packed_cost import main, report_md
from switchboard.export.packed_choice import cases, packed_feed, padded_feed


def test_the_cases_are_a_chunk_beside_decode_rows_decode_rows_and_drafts():
    c = cases([16, 64], rows=4)
    assert [len(r) for r in c["a 16-token chunk + 3 decode rows"]] == [16, 1, 1, 1]
    assert [len(r) for r in c["a 64-token chunk + 3 decode rows"]] == [64, 1, 1, 1]
    assert [len(r) for r in c["4 decode rows"]] == [1, 1, 1, 1]
    assert [len(r) for r in c["4 rows verifying drafts of 0,0,0,0"]] == [1, 1, 1, 1]
    assert [len(r) for r in cases([16], rows=8)["8 rows verifying drafts of 0,0,0,0,2,4,7,1"]] == [
        1,
        1,
        1,
        1,
        3,
        5,
        8,
        2,
    ]


def test_the_padded_and_packed_inputs_hold_the_same_tokens():
    rows = [[5, 6, 7], [8]]
    past = {"past_key_values.0.key": np.zeros((2, 1, 4, 2), np.float32)}
    mask, next_pos = np.ones((2, 4), np.int64), np.array([4, 4])
    full = padded_feed(rows, past, mask, next_pos, [0, 1])
    assert full["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert full["position_ids"].tolist() == [[4, 5, 6], [0, 0, 4]]
    assert full["attention_mask"].tolist() == [[1] * 7, [1, 1, 1, 1, 0, 0, 1]]
    one = padded_feed(rows, past, mask, next_pos, [1])
    assert one["input_ids"].tolist() == [[8]] and one["past_key_values.0.key"].shape[0] == 1
    feed, p = packed_feed(rows, past, mask, next_pos)
    assert feed["input_ids"].tolist() == [[5, 6, 7, 8]] and feed["token_index"].tolist() == [0, 1, 2, 5]
    assert feed["wide_tokens"].tolist() == [0, 1, 2] and feed["narrow_positions"].tolist() == [[0], [4]]
    assert (p.tokens, p.padded_tokens()) == (4, 6)


def test_the_report_puts_packed_against_padded_and_per_length():
    results = {
        "checkpoint": "m",
        "rows": 8,
        "context": 120,
        "threads": 2,
        "repeats": 3,
        "machine": {"cpu": "x"},
        "passes": {
            "p": {"tokens": 71, "padded_tokens": 512, "ms": {"padded": 80.0, "packed": 40.0, "per_length": 20.0}}
        },
        "profiles": {"packed": {"MatMul": 3000.0, "Softmax": 1000.0}},
    }
    md = report_md(results)
    assert "| p | 71 / 512 | 80.0 | 40.0 | 20.0 | 0.50 | 2.00 |" in md
    assert "Profile, packed: 4 ms a pass; MatMul 3 ms (75%), Softmax 1 ms (25%)." in md


@pytest.mark.parametrize("argv", [["--rows", "1"], ["--chunks", ""], ["--repeats", "0"]])
def test_settings_that_time_nothing_are_refused(argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2


def test_a_directory_that_is_not_a_checkpoint_is_refused(tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "not a checkpoint" in capsys.readouterr().err

"""Pure parts of the 0.5B measurement tools: gaps around long prompts, per-pool counters."""

from __future__ import annotations

from switchboard.perf.long_prompt import overlapping_gaps
from switchboard.perf.scaling import _sum_pools


def test_a_stream_frozen_across_a_prefill_counts_as_one_long_gap():
    times = [[0.0, 0.1, 0.2, 2.3, 2.4], [5.0, 5.1]]
    gaps = overlapping_gaps(times, [(0.25, 2.25)])
    assert [round(g) for g in gaps] == [2100]


def test_pool_counters_are_summed_as_deltas():
    before = {"engine_short": {"prefill_s": 1.0, "decode_s": 2.0, "batch_steps": {8: 10}}}
    after = {
        "engine_short": {"prefill_s": 1.5, "decode_s": 4.0, "prefill_chunks": 3.0, "batch_steps": {8: 14, 7: 2}},
        "engine_long": {"prefill_s": 0.5, "decode_s": 0.0, "batch_steps": {}},
    }
    out = _sum_pools(before, after)
    assert out["prefill_s"] == 1.0 and out["decode_s"] == 2.0 and out["prefill_chunks"] == 3.0
    assert out["batch_steps"] == {8: 4, 7: 2}

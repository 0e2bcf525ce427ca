"""Short smoke of the session-aware driver (the full runs are make bench / bench-full)."""

from perf.driver import drive, summarize
from perf.workload import WorkloadSpec, generate


def test_sessions_replay_turn_after_turn_with_reuse(stack):
    sessions = generate(
        WorkloadSpec(sessions=4, rate_per_s=4, min_turns=3, max_turns=3, long_share=0.0, max_new_tokens=16, seed=7)
    )
    records, wall = drive(stack.grpc_url, sessions, max_seconds=120, session_prefix="smoke-")
    assert len(records) == 12 and all(r.ok for r in records)
    assert all(r.ttft_ms is not None and r.ttft_ms <= r.e2e_ms for r in records)
    later = [r for r in records if r.turn > 1]
    assert all(r.reused > 0 for r in later)
    (row,) = summarize(records, wall)
    assert row["turns"] == 12 and row["failed"] == 0 and row["output_tokens_per_s"] > 0

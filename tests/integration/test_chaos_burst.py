"""Chaos's open-loop burst (perf.chaos.burst over perf.load.open_loop_async) against a real stack."""

from perf.chaos import burst, burst_row
from switchboard.data.corpus import load, sample_questions


def test_a_short_burst_sends_its_schedule_and_every_chat_is_answered(stack):
    questions = sample_questions(load(), 20, seed=7)
    results, sent = burst(stack.grpc_url, questions, rate=4.0, seconds=2.0, vip_share=0.5)
    assert sent >= 1 and len(results) == sent  # the first chat goes at 0, whatever the draw
    assert all(o.ok for o in results), [o.reason for o in results if not o.ok]
    assert all(o.backlog >= 0 and o.started > 0 for o in results)
    assert {o.priority for o in results} <= {1, 2}
    row = burst_row("short burst", results, sent)
    assert row[1] == sent and row[5] == 0  # sent, errors

"""Token coalescing, the outbox and throttled cancellation checks between the engine and Triton."""

from __future__ import annotations

import threading

from switchboard.common.stream import CancelPoll, Outbox, TokenStream


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_first_token_goes_at_once_then_tokens_are_held_for_the_interval():
    clock = Clock()
    s = TokenStream(0.05, clock)
    assert s.add([7]) == [7]
    clock.t += 0.01
    assert s.add([8]) is None
    clock.t += 0.02
    assert s.add([9]) is None
    clock.t += 0.03  # 60 ms after the last send
    assert s.add([10]) == [8, 9, 10]
    clock.t += 0.001
    assert s.add([11]) is None
    assert s.rest() == [11]
    assert s.rest() == []


def test_interval_zero_sends_every_token():
    clock = Clock()
    s = TokenStream(0.0, clock)
    assert [s.add([t]) for t in range(4)] == [[0], [1], [2], [3]]
    assert s.rest() == []


def test_cancel_poll_asks_at_most_once_per_interval_and_remembers_a_cancel():
    clock, calls, answer = Clock(), [], [False]

    def check():
        calls.append(clock.t)
        return answer[0]

    poll = CancelPoll(check, 0.05, clock)
    assert poll() is False and len(calls) == 1
    clock.t += 0.01
    answer[0] = True
    assert poll() is False and len(calls) == 1  # not asked again yet
    clock.t += 0.05
    assert poll() is True and len(calls) == 2
    answer[0] = False
    clock.t += 1
    assert poll() is True and len(calls) == 2  # cancelled stays cancelled, without asking


def test_outbox_gives_priority_one_first_then_streams_in_the_order_they_became_ready():
    box = Outbox()
    box.put("a", 2, [1])
    box.put("b", 2, [2])
    box.put("vip", 1, [3])
    assert [box.take(0)[0] for _ in range(3)] == ["vip", "a", "b"]
    assert box.take(0) is None


def test_outbox_coalesces_what_queued_while_the_sender_was_busy_and_keeps_the_final_last():
    box = Outbox()
    box.put("a", 2, [1])
    box.put("a", 2, [2, 3])
    box.put("a", 2, [4], final="done", end=True)
    assert box.take(0) == ("a", [1, 2, 3, 4], "done", True)
    box.put("a", 2, [5])  # a new stream under the same key starts afresh
    assert box.take(0) == ("a", [5], None, False)


def test_outbox_take_waits_for_a_put_from_another_thread_and_close_drains_first():
    box = Outbox()
    threading.Timer(0.05, box.put, args=("a", 1, [7])).start()
    assert box.take(2.0) == ("a", [7], None, False)
    box.put("b", 2, [8])
    box.close()
    assert box.take(2.0) == ("b", [8], None, False)
    assert box.take(2.0) is None

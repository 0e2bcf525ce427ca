"""Token coalescing and throttled cancellation checks between the engine and Triton."""

from __future__ import annotations

from switchboard.engine.stream import CancelPoll, TokenStream


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

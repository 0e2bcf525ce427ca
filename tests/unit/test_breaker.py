"""The latency circuit breaker: opens on a slow window, closes as it ages out."""

from __future__ import annotations

from switchboard.common.breaker import LatencyBreaker


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_it_opens_when_p99_goes_over_the_bound_and_closes_when_the_slow_samples_age_out():
    clock = Clock()
    b = LatencyBreaker(bound_s=1.5, window_s=30, min_samples=20, clock=clock)
    for _ in range(98):
        b.observe(0.2)
    assert not b.is_open()  # enough samples, all fast
    for _ in range(2):
        b.observe(3.0)
    clock.now += 1
    assert b.is_open() and b.p99() == 3.0 and b.opened == 1  # 2 of 100 over 1.5 s: P99 over it
    clock.now += 31  # the window drains: nothing left to judge, so it lets chats through again
    assert not b.is_open() and b.p99() is None
    for _ in range(50):
        b.observe(0.3)
    clock.now += 1
    assert not b.is_open() and b.opened == 1


def test_one_slow_chat_in_a_hundred_does_not_open_it():
    clock = Clock()
    b = LatencyBreaker(bound_s=1.5, min_samples=20, clock=clock)
    for _ in range(199):
        b.observe(0.1)
    b.observe(9.0)
    assert not b.is_open()

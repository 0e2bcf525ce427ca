"""The suite's load generators (perf/load.py) with fake calls and a fake clock."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading

import pytest

from perf.load import Sent, closed_loop, open_loop, open_loop_async, poisson_schedule, weighted

WAIT_S = 10.0  # how long a fake call waits for the others before the test calls it a failure


class Counted:
    """A clock that ticks once per reading, from any thread."""

    def __init__(self):
        self.ticks = itertools.count()

    def __call__(self) -> float:
        return float(next(self.ticks))


def test_closed_loop_keeps_exactly_n_in_flight_and_sends_every_item_once():
    n, lock, state = 4, threading.Lock(), {"now": 0, "peak": 0}
    together = threading.Barrier(n, timeout=WAIT_S)  # no call returns until n are in flight

    def call(item):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        together.wait()
        with lock:
            state["now"] -= 1
        return item * 10

    records = closed_loop(call, list(range(12)), n, clock=Counted())
    assert state["peak"] == n
    assert [r.item for r in records] == list(range(12)) and [r.result for r in records] == [i * 10 for i in range(12)]
    assert all(r.ok and r.sent < r.done for r in records)


def test_closed_loop_with_more_callers_than_items_and_nothing_to_send():
    assert [r.result for r in closed_loop(lambda x: x + 1, [1, 2], 8)] == [2, 3]
    assert closed_loop(lambda x: x, [], 3) == []
    with pytest.raises(ValueError, match="concurrency 0"):
        closed_loop(lambda x: x, [1], 0)


def test_errors_are_recorded_not_dropped_and_the_run_goes_on():
    def call(item):
        if item % 3 == 0:
            raise RuntimeError(f"refused {item}")
        return item

    closed = closed_loop(call, list(range(7)), 2)
    opened = open_loop(call, [(0.0, i) for i in range(7)], sleep=lambda s: None)
    for records in (closed, opened):
        assert [r.item for r in records] == list(range(7))
        failed = [r for r in records if not r.ok]
        assert [r.item for r in failed] == [0, 3, 6] and str(failed[1].error) == "refused 3"
        assert all(r.result is None for r in failed) and all(r.result == r.item for r in records if r.ok)


class FakeTime:
    """A clock that moves only when the open loop sleeps; a sleep first waits until every item
    sent so far has started, so each start reads the time it was sent at."""

    def __init__(self, start: float = 100.0):
        self.now = start
        self.started = 0
        self.sends = 0
        self.cond = threading.Condition()

    def clock(self) -> float:
        with self.cond:
            return self.now

    def begin(self) -> None:
        with self.cond:
            self.started += 1
            self.cond.notify_all()

    def sleep(self, seconds: float) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.started == self.sends, WAIT_S)
            self.now += seconds
            self.sends += 1


def test_open_loop_sends_at_the_scheduled_times_whatever_is_in_flight():
    t = FakeTime()
    schedule = [(0.5, "a"), (1.0, "b"), (2.5, "c"), (4.0, "d")]
    answered = threading.Barrier(len(schedule), timeout=WAIT_S)  # none answered before the last is sent
    seen = []

    def call(item):
        seen.append((item, t.clock()))
        t.begin()
        answered.wait()
        return item.upper()

    records = open_loop(call, schedule, clock=t.clock, sleep=t.sleep)
    assert sorted(seen) == [("a", 100.5), ("b", 101.0), ("c", 102.5), ("d", 104.0)]
    assert [r.scheduled for r in records] == [100.5, 101.0, 102.5, 104.0]
    assert [r.sent for r in records] == [100.5, 101.0, 102.5, 104.0]
    assert [r.result for r in records] == ["A", "B", "C", "D"] and all(r.ok for r in records)


def test_open_loop_counts_from_the_start_it_is_given():
    t = FakeTime(start=50.0)

    def call(item):
        t.begin()
        return item

    records = open_loop(call, [(2.0, "x")], clock=t.clock, sleep=t.sleep, start=49.0)
    assert records[0].scheduled == 51.0 and records[0].sent == 51.0


def test_open_loop_refuses_a_schedule_that_goes_back_in_time():
    with pytest.raises(ValueError, match="must not decrease"):
        open_loop(lambda x: x, [(1.0, "a"), (0.5, "b")])
    assert open_loop(lambda x: x, []) == []


def test_open_loop_async_sends_at_the_scheduled_times_as_tasks():
    now = {"t": 10.0}

    async def sleep(seconds):
        await asyncio.sleep(0)  # the tasks created so far start (and read the clock) first
        now["t"] += seconds

    async def call(item):
        if item == "bad":
            raise ValueError("no")
        await asyncio.sleep(0)
        return now["t"]

    schedule = [(0.0, "a"), (1.5, "bad"), (3.0, "c")]
    records = asyncio.run(open_loop_async(call, schedule, clock=lambda: now["t"], sleep=sleep))
    assert [r.scheduled for r in records] == [10.0, 11.5, 13.0] == [r.sent for r in records]
    assert [r.ok for r in records] == [True, False, True] and isinstance(records[1].error, ValueError)


def test_a_record_knows_its_latency():
    assert Sent("x", 2.0, 3.5).latency == 1.5 and Sent("x", 2.0, 3.5).ok


def test_same_seed_same_arrivals():
    def schedule(seed):
        return poisson_schedule(10.0, 200.0, random.Random(seed), weighted({"short": 0.8, "long": 0.2}))

    arrivals = schedule(3)
    assert arrivals == schedule(3) and arrivals != schedule(4)
    times = [t for t, _ in arrivals]
    assert times == sorted(times) and 0 < times[0] and times[-1] < 200
    assert len(arrivals) == pytest.approx(2000, rel=0.1)
    assert sum(k == "long" for _, k in arrivals) / len(arrivals) == pytest.approx(0.2, abs=0.03)


def _asr_arrivals_before(rate, duration, mix, seed):
    """perf/asr_load.py's own Poisson loop before perf/load.py, kept to check the move."""
    rng = random.Random(f"asr-arrivals:{seed}")
    kinds, weights = list(mix), list(mix.values())
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        out.append((t, rng.choices(kinds, weights)[0]))


def _chaos_burst_before(rate, seconds, vip_share):
    """perf/chaos.py's burst schedule before perf/load.py: a chat at 0, its priority drawn, then
    the gap to the next."""
    rng = random.Random(0)
    out, at = [], 0.0
    while at < seconds:
        out.append((at, 1 if rng.random() < vip_share else 2))
        at += rng.expovariate(rate)
    return out


def test_the_schedules_are_those_the_benches_drew_before():
    from perf.asr_load import poisson_arrivals

    mix = {"short": 0.8, "long": 0.2}
    assert poisson_arrivals(2.5, 120.0, mix, seed=1) == _asr_arrivals_before(2.5, 120.0, mix, 1)
    burst = poisson_schedule(20.0, 30.0, random.Random(0), lambda rng: 1 if rng.random() < 0.05 else 2, at_zero=True)
    assert burst == _chaos_burst_before(20.0, 30.0, 0.05)


@pytest.mark.parametrize("rate, seconds", [(0, 1), (1, 0), (-1, 1)])
def test_poisson_schedule_refuses_nonsense(rate, seconds):
    with pytest.raises(ValueError, match="must be > 0"):
        poisson_schedule(rate, seconds, random.Random(0))


@pytest.mark.parametrize("mix", [{}, {"a": 0}, {"a": -1, "b": 2}])
def test_weighted_refuses_a_mix_without_weight(mix):
    with pytest.raises(ValueError, match="weights"):
        weighted(mix)

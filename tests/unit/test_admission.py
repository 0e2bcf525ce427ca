"""Admission control: slots, priority order, bounded waiting, shedding to the fallback."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from switchboard.serving.admission import Admission
from switchboard.serving.gate import PriorityGate, send_rank
from switchboard.serving.pool_health import PoolHealth


class Recorder:
    def __init__(self):
        self.started, self.shed = [], []
        self.release = threading.Event()
        self.lock = threading.Lock()

    def run(self, job):
        with self.lock:
            self.started.append(job)
        self.release.wait(10)

    def on_shed(self, job, reason):
        with self.lock:
            self.shed.append((job, reason))


def wait_until(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.005)
    return False


def test_at_most_max_inflight_run_and_priority_one_goes_first():
    r = Recorder()
    a = Admission(max_inflight=2, max_pending=100, max_wait_s=30, run=r.run, shed=r.on_shed)
    try:
        for i in range(5):
            a.submit(f"p2-{i}", 2)
        assert wait_until(lambda: len(r.started) == 2)
        a.submit("vip", 1)
        time.sleep(0.05)
        assert len(r.started) == 2 and a.pending() == 4
        r.release.set()
        assert wait_until(lambda: len(r.started) == 6)
        assert r.started[2] == "vip", r.started
        assert r.started[3:] == ["p2-2", "p2-3", "p2-4"]
        assert r.shed == []
    finally:
        r.release.set()
        a.close()


def test_reserved_slots_start_priority_one_while_priority_two_waits():
    r = Recorder()
    a = Admission(max_inflight=3, max_pending=100, max_wait_s=30, run=r.run, shed=r.on_shed, reserved=1)
    try:
        for i in range(4):
            a.submit(f"p2-{i}", 2)
        assert wait_until(lambda: len(r.started) == 2)
        time.sleep(0.05)
        assert len(r.started) == 2 and a.pending() == 2  # the third slot stays free for priority 1
        a.submit("vip", 1)
        assert wait_until(lambda: len(r.started) == 3)
        assert r.started[2] == "vip"
        a.submit("vip-2", 1)
        time.sleep(0.05)
        assert len(r.started) == 3  # all slots busy now, for priority 1 too
    finally:
        r.release.set()
        a.close()


def order_through_the_gate(gate: PriorityGate, held_rank, waiters: list[tuple[str, object]]) -> list[str]:
    """Hold the gate while ``waiters`` (name, rank) line up one after another, release it, and
    return the order they got through."""
    order, threads = [], []
    gate.acquire(held_rank)

    def wait(name, rank):
        with gate(rank):
            order.append(name)

    for name, rank in waiters:
        t = threading.Thread(target=wait, args=(name, rank))
        t.start()
        threads.append(t)
        assert wait_until(lambda: len(gate._waiting) == len(threads))
    gate.release()
    for t in threads:
        t.join(5)
    return order


def test_the_gate_lets_waiters_in_by_priority_then_arrival():
    gate = PriorityGate()
    order = order_through_the_gate(gate, 2, [("p2-a", 2), ("p2-b", 2), ("vip-a", 1), ("p2-c", 2), ("vip-b", 1)])
    assert order == ["vip-a", "vip-b", "p2-a", "p2-b", "p2-c"]
    with gate(2):  # free again: no wait
        pass
    assert not gate._busy and not gate._waiting


def test_a_whole_answer_goes_before_a_stream_delta_of_its_priority_but_never_before_priority_1():
    order = order_through_the_gate(
        PriorityGate(),
        send_rank(2, final=False),
        [
            ("p2-delta", send_rank(2, final=False)),
            ("p2-faq", send_rank(2, final=True)),
            ("vip-delta", send_rank(1, final=False)),
            ("p2-final", send_rank(2, final=True)),
            ("vip-final", send_rank(1, final=True)),
        ],
    )
    assert order == ["vip-final", "vip-delta", "p2-faq", "p2-final", "p2-delta"]


def test_the_gate_is_released_when_the_holder_raises():
    gate = PriorityGate()
    try:
        with gate(1):
            raise RuntimeError("send failed")
    except RuntimeError:
        pass
    assert not gate._busy


def test_waiting_past_the_deadline_is_shed_with_a_reason():
    r = Recorder()
    a = Admission(max_inflight=1, max_pending=100, max_wait_s=0.2, run=r.run, shed=r.on_shed)
    try:
        a.submit("running", 2)
        assert wait_until(lambda: r.started == ["running"])
        t0 = time.monotonic()
        a.submit("late", 2)
        assert wait_until(lambda: r.shed == [("late", "queue_timeout")])
        assert 0.15 < time.monotonic() - t0 < 2.0
        assert a.counts["shed_timeout"] == 1
    finally:
        r.release.set()
        a.close()


def test_a_full_queue_sheds_the_newest_lowest_priority_chat():
    r = Recorder()
    a = Admission(max_inflight=1, max_pending=2, max_wait_s=30, run=r.run, shed=r.on_shed)
    try:
        a.submit("running", 2)
        assert wait_until(lambda: r.started == ["running"])
        a.submit("p2-old", 2)
        a.submit("p2-new", 2)
        a.submit("vip", 1)
        assert wait_until(lambda: len(r.shed) == 1)
        assert r.shed == [("p2-new", "queue_full")]
        assert a.pending() == 2
    finally:
        r.release.set()
        a.close()


class _Clocked:
    """Admission on a hand-moved clock, two slots, having learned that a chat holds its slot 1 s
    (so at 2 busy slots one frees up every 0.5 s)."""

    def __init__(self, max_wait_s: float, forecast: bool = True):
        self.now, self.started, self.shed, self.done = [0.0], [], [], {}
        self.a = Admission(
            max_inflight=2,
            max_pending=100,
            max_wait_s=max_wait_s,
            run=self.run,
            shed=lambda j, why: self.shed.append((j, why)),
            clock=lambda: self.now[0],
            forecast=forecast,
        )
        self.submit("w1", 2), self.submit("w2", 2)
        assert wait_until(lambda: len(self.started) == 2)
        self.now[0] = 1.0
        self.done["w1"].set(), self.done["w2"].set()
        assert wait_until(lambda: self.a.inflight() == 0)

    def run(self, job):
        self.started.append(job)
        self.done.setdefault(job, threading.Event()).wait(10)

    def submit(self, job, priority):
        self.done[job] = threading.Event()
        self.a.submit(job, priority)

    def close(self):
        for e in self.done.values():
            e.set()
        self.a.close()


@pytest.mark.parametrize("forecast", [True, False])
def test_a_chat_that_would_wait_out_its_deadline_is_answered_on_arrival(forecast):
    c = _Clocked(max_wait_s=2.0, forecast=forecast)
    try:
        # The VIP goes first, so the forecasts the queue makes again while the chats wait agree
        # with those made on arrival whenever they run.
        for job in ("r1", "r2", "vip", "q1", "q2", "q3", "q4", "q5", "q6"):
            c.submit(job, 1 if job == "vip" else 2)
            if job == "r2":
                assert wait_until(lambda: len(c.started) == 4)
        if forecast:  # q3 starts in ~2 s (3 ahead of it, the VIP too, at 2 a second), q4-q6 would wait longer
            assert wait_until(lambda: len(c.shed) == 3)
            assert sorted(c.shed) == [("q4", "queue_forecast"), ("q5", "queue_forecast"), ("q6", "queue_forecast")]
            time.sleep(0.05)
            assert c.a.pending() == 4 and c.a.counts["shed_forecast"] == 3
        else:
            time.sleep(0.05)
            assert c.shed == [] and c.a.pending() == 7
    finally:
        c.close()


def test_a_waiting_chat_is_answered_once_its_forecast_misses_not_at_its_deadline():
    c = _Clocked(max_wait_s=2.2)
    try:
        for job in ("r1", "r2", "q1", "q2", "q3", "q4"):  # deadlines 3.2 s; q4 forecast to start at 3.0 s
            c.submit(job, 2)
            if job == "r2":
                assert wait_until(lambda: len(c.started) == 4)
        assert c.a.pending() == 4 and c.shed == []
        c.submit("vip", 1)  # goes ahead of them all: q4 would now start at 3.6 s
        c.now[0] = 1.1
        assert wait_until(lambda: len(c.shed) == 1)
        assert c.shed == [("q4", "queue_forecast")]
        c.now[0] = 1.6  # no slot freed for 0.6 s: q3 (3 ahead) forecast at 3.6 s, q2 at 3.1 s
        assert wait_until(lambda: len(c.shed) == 2)
        assert c.shed[1] == ("q3", "queue_forecast")
        time.sleep(0.3)
        assert len(c.shed) == 2 and c.a.pending() == 3 and c.a.counts["shed_forecast"] == 2
        c.done["r1"].set()  # the freed slot goes to priority 1
        assert wait_until(lambda: len(c.started) == 5) and c.started[-1] == "vip"
    finally:
        c.close()


def test_a_failing_job_frees_its_slot():
    shed = []

    def run(job):
        raise RuntimeError("boom")

    a = Admission(max_inflight=1, max_pending=10, max_wait_s=5, run=run, shed=lambda j, why: shed.append(j))
    try:
        for i in range(3):
            a.submit(i, 2)
        assert wait_until(lambda: a.inflight() == 0 and a.pending() == 0 and a.counts["admitted"] == 3)
        assert shed == []
    finally:
        a.close()


def test_close_answers_the_waiting_chats():
    r = Recorder()
    a = Admission(max_inflight=1, max_pending=10, max_wait_s=30, run=r.run, shed=r.on_shed)
    a.submit("running", 2)
    assert wait_until(lambda: r.started == ["running"])
    a.submit("waiting", 2)
    r.release.set()
    a.close()
    assert ("waiting", "shutting_down") in r.shed or "waiting" in r.started


def test_pool_health_routes_around_a_failed_pool_then_retries():
    now = [0.0]
    h = PoolHealth(retry_after_s=30, clock=lambda: now[0])
    assert h.order("engine_short", "engine_long") == ["engine_short", "engine_long"]
    h.failed("engine_short")
    assert h.order("engine_short", "engine_long") == ["engine_long", "engine_short"]
    now[0] = 31.0
    assert h.up("engine_short")
    assert h.order("engine_short", "engine_long") == ["engine_short", "engine_long"]


def test_a_failed_pool_ends_the_streams_reading_from_it_and_only_those():
    h = PoolHealth(retry_after_s=30)
    ended = []
    with (
        h.watching("engine_short", lambda: ended.append("short-1")),
        h.watching("engine_short", lambda: ended.append("short-2")),
        h.watching("engine_long", lambda: ended.append("long")),
    ):
        h.failed("engine_short")
        assert sorted(ended) == ["short-1", "short-2"]
    h.failed("engine_short")  # streams that left are not told
    assert sorted(ended) == ["short-1", "short-2"]


def _pinged(h: PoolHealth, pool: str, timeout: float = 5.0) -> None:
    """Wait until no ping of ``pool`` is under way (they run on threads of their own)."""
    deadline = time.monotonic() + timeout
    while pool in h._pinging and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_quiet_stream_pings_its_pool_and_a_dead_answer_ends_every_stream_on_it():
    pings = []
    h = PoolHealth(retry_after_s=30, ping=lambda pool: pings.append(pool) or False, probe_after_s=1.0)
    ended = []
    with (
        h.watching("engine_short", lambda: ended.append("short")),
        h.watching("engine_long", lambda: ended.append("long")),
    ):
        h.quiet("engine_short")
        _pinged(h, "engine_short")
        assert pings == ["engine_short"] and ended == ["short"]
    assert not h.up("engine_short") and h.up("engine_long")


def test_a_ping_unanswered_or_answered_alive_is_not_a_failure():
    for answer in (True, None, "raises"):

        def ping(pool, answer=answer):
            if answer == "raises":
                raise ConnectionError("the server went away")
            return answer

        h = PoolHealth(retry_after_s=30, ping=ping, probe_after_s=1.0)
        ended = []
        with h.watching("engine_short", lambda ended=ended: ended.append("short")):
            h.quiet("engine_short")
            _pinged(h, "engine_short")
        assert h.up("engine_short") and not ended, answer


def test_one_ping_at_a_time_per_pool_and_at_most_one_per_probe_interval():
    now, release, pings = [0.0], threading.Event(), []

    def ping(pool):
        pings.append(pool)
        release.wait(5)
        return True

    h = PoolHealth(retry_after_s=30, clock=lambda: now[0], ping=ping, probe_after_s=1.0)
    for _ in range(5):  # many quiet streams at once: one ping
        h.quiet("engine_short")
    h.quiet("engine_long")
    now[0] = 2.0
    h.quiet("engine_short")  # the interval passed, but the first ping is still under way
    release.set()
    _pinged(h, "engine_short")
    _pinged(h, "engine_long")
    assert sorted(pings) == ["engine_long", "engine_short"]
    now[0] = 2.5
    h.quiet("engine_short")  # the last ping started at 0.0: allowed again
    _pinged(h, "engine_short")
    now[0] = 3.0
    h.quiet("engine_short")  # 0.5 s after the last one: not yet
    _pinged(h, "engine_short")
    assert sorted(pings) == ["engine_long", "engine_short", "engine_short"]


def test_without_a_ping_function_quiet_streams_ask_nothing():
    h = PoolHealth(retry_after_s=30, probe_after_s=1.0)
    h.quiet("engine_short")
    assert h.probe_after_s == 0.0 and h.up("engine_short")


def test_wait_for_room_holds_new_chats_while_max_pending_wait_for_a_slot_or_their_shed_answer():
    release, shed = threading.Event(), []

    def slow_shed(job, reason):
        release.wait(5)
        shed.append(job)

    a = Admission(
        max_inflight=1, max_pending=2, max_wait_s=0.05, run=lambda job: release.wait(5), shed=slow_shed, shed_workers=1
    )
    try:
        a.submit("running", 2)
        time.sleep(0.1)
        assert a.inflight() == 1 and a.wait_for_room(0.5)
        a.submit("shed-1", 2)
        a.submit("shed-2", 2)
        assert not a.wait_for_room(0.3), "two chats wait for their FAQ answer"
        release.set()
        assert a.wait_for_room(2.0)
        assert sorted(shed) == ["shed-1", "shed-2"]
    finally:
        release.set()
        a.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_faq_answers_run_on_lowered_threads_chats_on_the_servers():
    own = os.getpriority(os.PRIO_PROCESS, 0)
    seen, lock, release = {}, threading.Lock(), threading.Event()

    def note(job, *_):
        with lock:
            seen[job] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        if job == "holder":
            release.wait(5)

    a = Admission(max_inflight=1, max_pending=10, max_wait_s=0.1, run=note, shed=note, shed_nice=5)
    try:
        a.submit("p1", 1)
        a.submit("p2", 2)
        assert wait_until(lambda: a.inflight() == 0 and {"p1", "p2"} <= set(seen))
        a.submit("holder", 2)  # holds the one slot: the next chat is shed
        assert wait_until(lambda: "holder" in seen)
        a.submit("shed", 2)
        assert wait_until(lambda: "shed" in seen)
    finally:
        release.set()
        a.close()
    lowered = min(own + 5, 19)
    assert seen == {"p1": own, "p2": own, "holder": own, "shed": lowered}


def test_an_open_latency_breaker_answers_priority_two_from_the_faq_at_once_never_priority_one():
    r = Recorder()
    r.release.set()
    open_ = [True]
    a = Admission(max_inflight=4, max_pending=100, max_wait_s=30, run=r.run, shed=r.on_shed, breaker=lambda: open_[0])
    try:
        a.submit("p2-shed", 2)
        a.submit("vip", 1)
        assert wait_until(lambda: len(r.shed) == 1 and len(r.started) == 1)
        assert r.shed == [("p2-shed", "latency_breaker")] and r.started == ["vip"]
        open_[0] = False  # recovered: priority 2 is admitted again
        a.submit("p2-ok", 2)
        assert wait_until(lambda: "p2-ok" in r.started)
        assert a.snapshot()["shed_breaker"] == 1
    finally:
        a.close()


def test_a_pool_found_dead_is_pinged_by_the_chats_routed_around_it_and_back_once_alive():
    now, alive = [0.0], [False]
    h = PoolHealth(retry_after_s=30, clock=lambda: now[0], ping=lambda pool: alive[0], probe_after_s=1.0)
    h.failed("engine_short")
    assert h.order("engine_short", "engine_long") == ["engine_long", "engine_short"]
    _pinged(h, "engine_short")
    now[0] = 1.5  # the supervisor has not reloaded it yet: still dead, still avoided
    assert not h.up("engine_short")
    _pinged(h, "engine_short")
    assert not h.up("engine_short", ask=False)
    alive[0], now[0] = True, 3.0  # reloaded: the next chat's ping brings it back, long before retry_after_s
    h.up("engine_short")
    _pinged(h, "engine_short")
    assert h.order("engine_short", "engine_long") == ["engine_short", "engine_long"]

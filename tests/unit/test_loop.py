"""The batching loop with a scripted policy and step, no model: the order work runs in, work
that is not due yet, rows joining a running batch, failures answered, workers of their own,
close. (The engine's and the recognizer's use of it: test_scheduler.py, test_asr_service.py.)"""

from __future__ import annotations

import heapq
import itertools
import threading

import pytest

from switchboard.common.loop import Loop, Worker

WAIT_S = 10  # the most a test waits for a worker before it fails


class Queue:
    """A policy: rows ``(rank, name)``, lowest rank first, in batches of up to ``size``; nothing is
    due before ``due`` on the loop's clock (None: at once)."""

    def __init__(self, size: int = 1, due: float | None = None):
        self.size, self.due, self.rows, self.asked = size, due, [], []
        self._order = itertools.count()

    def add(self, rank: int, name: str) -> None:
        heapq.heappush(self.rows, (rank, next(self._order), name))

    def pop(self, n: int) -> list[str]:
        return [heapq.heappop(self.rows)[2] for _ in range(min(n, len(self.rows)))]

    def take(self, now: float) -> list[str] | None:
        self.asked.append(now)
        if not self.rows or (self.due is not None and now < self.due):
            return None
        return self.pop(self.size)

    def next_due(self, now: float) -> float | None:
        return self.due if self.rows else None


class Script:
    """A step: records each batch it ran (and the clock then); ``hook(batch)`` runs inside it."""

    def __init__(self, clock=lambda: 0.0, hook=None):
        self.clock, self.hook = clock, hook
        self.ran, self.at, self.failures = [], [], []
        self.changed = threading.Condition()

    def step(self, batch: list[str]) -> None:
        if self.hook is not None:
            self.hook(batch)
        with self.changed:
            self.ran.append(list(batch))
            self.at.append(self.clock())
            self.changed.notify_all()

    def failed(self, batch: list[str], error: Exception) -> None:
        with self.changed:
            self.failures.append((list(batch), error))
            self.changed.notify_all()

    def wait(self, done) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: done(self), WAIT_S), (self.ran, self.failures)


@pytest.fixture
def loops():
    made = []

    def make(step, *policies, clock=None):
        workers = [Worker(f"test-loop-{i}", p) for i, p in enumerate(policies)]
        loop = Loop(step, workers, **({"clock": clock} if clock else {}))
        made.append(loop)
        return loop

    yield make
    for loop in made:
        loop.close()


def test_a_worker_runs_its_policys_work_in_the_policys_order(loops):
    queue, script = Queue(size=2), Script()
    loop = loops(script, queue)
    for rank, name in [(2, "c"), (1, "a"), (2, "d"), (1, "b"), (3, "e")]:
        loop.submit(lambda r=rank, n=name: queue.add(r, n))
    loop.start()  # all queued before the worker's first look
    script.wait(lambda s: len(s.ran) == 3)
    assert script.ran == [["a", "b"], ["c", "d"], ["e"]]


def test_work_submitted_while_the_worker_waits_wakes_it(loops):
    queue, script = Queue(), Script()
    loop = loops(script, queue)
    loop.start()
    for name in "xyz":
        loop.submit(lambda n=name: queue.add(1, n))
        script.wait(lambda s, n=name: [n] in s.ran)
    assert script.ran == [["x"], ["y"], ["z"]]


def test_work_that_is_not_due_waits_for_the_clock(loops):
    now = [0.0]
    queue, script = Queue(due=5.0), Script(clock=lambda: now[0])
    loop = loops(script, queue, clock=lambda: now[0])
    loop.start()
    loop.submit(lambda: queue.add(1, "late"))
    with loop.cond:  # the worker asked and was told to wait
        assert loop.cond.wait_for(lambda: 0.0 in queue.asked, WAIT_S)
    now[0] = 5.0
    loop.notify()
    script.wait(lambda s: s.ran)
    assert script.ran == [["late"]] and script.at == [5.0]  # it ran once the clock said so, not before


def test_rows_join_a_running_batch_between_its_steps_and_free_room_in_the_queue(loops):
    queue, started, arrived, joined = Queue(size=1), threading.Event(), threading.Event(), []

    def hook(batch):
        if batch == ["first"]:
            started.set()
            assert arrived.wait(WAIT_S)
            joined.extend(loop.join(lambda: queue.pop(8)))  # between this batch's steps

    script = Script(hook=hook)
    loop = loops(script, queue)
    loop.start()
    loop.submit(lambda: queue.add(1, "first"))
    assert started.wait(WAIT_S)
    loop.submit(lambda: queue.add(1, "second"))
    loop.submit(lambda: queue.add(1, "third"))
    waiter = threading.Thread(target=lambda: joined.append(loop.wait_for(lambda: not queue.rows, WAIT_S)))
    waiter.start()
    arrived.set()
    waiter.join(WAIT_S)
    script.wait(lambda s: s.ran)
    assert joined[:2] == ["second", "third"] and joined[2] is True  # taken in order; the waiter woke
    assert script.ran == [["first"]] and queue.rows == []  # no batch of their own


def test_a_step_that_raises_is_answered_by_failed_and_the_worker_goes_on(loops):
    def hook(batch):
        if "bad" in batch:
            raise RuntimeError("device lost")

    queue, script = Queue(), Script(hook=hook)
    loop = loops(script, queue)
    loop.start()
    loop.submit(lambda: queue.add(1, "bad"))
    script.wait(lambda s: s.failures)
    loop.submit(lambda: queue.add(1, "good"))
    script.wait(lambda s: s.ran)
    [(batch, error)] = script.failures
    assert batch == ["bad"] and str(error) == "device lost" and script.ran == [["good"]]


def test_run_answers_a_failure_on_the_calling_thread():
    script = Script(hook=lambda batch: (_ for _ in ()).throw(ValueError("bad row")))
    Loop(script, [Worker("unused", Queue())]).run(["row"])
    assert [(b, str(e)) for b, e in script.failures] == [(["row"], "bad row")]


def test_each_worker_runs_only_its_own_policys_work(loops):
    names = {}

    def hook(batch):
        names[batch[0]] = threading.current_thread().name

    urgent, normal, script = Queue(), Queue(), Script(hook=hook)
    loop = loops(script, urgent, normal)
    loop.start()
    loop.submit(lambda: (urgent.add(1, "vip"), normal.add(2, "background")))
    script.wait(lambda s: len(s.ran) == 2)
    assert names == {"vip": "test-loop-0", "background": "test-loop-1"}


def test_close_stops_the_workers_leaves_the_queue_and_refuses_joins(loops):
    queue, script = Queue(due=float("inf")), Script()  # nothing is ever due
    loop = loops(script, queue, queue)
    loop.start()
    loop.submit(lambda: queue.add(1, "queued"))
    threads = [t for t in threading.enumerate() if t.name.startswith("test-loop-")]
    assert len(threads) == 2
    assert loop.close() is True  # every worker stopped
    assert not any(t.is_alive() for t in threads)
    assert queue.rows and script.ran == [] and script.failures == []
    assert loop.join(lambda: queue.pop(1)) == [] and queue.rows  # a running batch takes no more
    assert loop.wait_for(lambda: False, WAIT_S) is True  # a waiter is not held by a closed loop


def test_a_loop_needs_a_worker():
    with pytest.raises(ValueError, match="at least one worker"):
        Loop(Script(), [])

"""Admission control for ``chat``: who gets a generation slot, who gets the FAQ fallback.

``chat``'s ``execute`` hands every valid request to ``Admission`` and returns at once. At most
``max_inflight`` chats generate at a time, ``reserved`` of those slots for priority 1 only;
the rest wait here ordered by priority (1 before 2), then arrival. A chat that waits longer
than ``max_wait_s``, or arrives while ``max_pending`` chats already wait (the newest
lowest-priority one makes room), is *shed*: handed to the ``shed`` callback, which answers
from the FAQ. So under any burst every request is answered or refused within a bounded time,
nothing waits without limit, and a priority-1 chat waits at most for one generation slot to
free up.

A priority-2 chat that would wait out ``max_wait_s`` anyway is shed on arrival (``forecast``):
with every slot it may take busy, it waits for the chats ahead of it to start, at the rate
slots free up (busy slots / how long a chat holds one, a moving average). Under a burst the
queue otherwise held ``max_wait_s`` of arrivals that were all shed at their deadline: the
customers waited ``max_wait_s`` for the FAQ answer they could have had at once, and the queue, full of
them, pushed the rest back into Triton's queue, which refused them. While chats wait, the
forecast is made again for each of them every ``REFORECAST_S``: priority-1 chats that arrive
later go ahead of them, and slots free up more slowly as the burst goes on, so a chat admitted
on a forecast it no longer meets is answered from the FAQ as soon as that shows, not at its
deadline.

Answers leave at a bounded rate (each is a round trip to the server), so shed chats can pile
up faster than they are answered, past a client's deadline (docs/reliability.md).
``wait_for_room`` lets ``chat``'s ``execute`` hold back new priority-2 chats
while ``max_pending`` chats wait for a slot or for their answer; they then wait in Triton's
queue, which refuses them (queue full, or its timeout) without a round trip to the stub.

The FAQ answers run on threads ``shed_nice`` nice levels lower (switchboard/nice.py): under a
burst they are most of the answers, and the cores they leave go to priority 1's chats.
(Priority 2's generating chats stay at the server's priority: lowered too, they held the GIL
and the send gate while descheduled, and priority 1 waited on them; its time to first token
doubled.)

Waiting happens here rather than in Triton's queue in front of the model because Triton
rejects a queued request without the model ever seeing it (no fallback answer is possible);
Triton's own queue policy stays as the backstop.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from switchboard.nice import lower_this_thread
from switchboard.wire import FallbackReason

log = logging.getLogger(__name__)
HOLD_EWMA = 0.05  # weight of the newest slot hold in the moving average (tens of chats)
REFORECAST_S = 0.1  # how often the waiting chats' forecasts are made again (a sort of the queue)


@dataclass(order=True)
class _Pending:
    priority: int
    seq: int
    deadline: float = field(compare=False)
    job: object = field(compare=False)


class Admission:
    def __init__(
        self,
        max_inflight: int,
        max_pending: int,
        max_wait_s: float,
        run: Callable[[object], None],
        shed: Callable[[object, str], None],
        shed_workers: int = 2,
        clock: Callable[[], float] = time.monotonic,
        reserved: int = 0,
        forecast: bool = True,
        shed_nice: int = 0,
        breaker: Callable[[], bool] | None = None,
    ):
        self.max_inflight, self.max_pending, self.max_wait_s = max_inflight, max_pending, max_wait_s
        self.forecast = forecast
        self.breaker = breaker  # open: priority 2 is answered from the FAQ at once (switchboard/common/breaker.py)
        # Slots only priority 1 may take: a VIP arriving while every slot is busy would
        # otherwise wait for some chat to finish.
        self.reserved = max(0, min(reserved, max_inflight - 1))
        self._run, self._shed, self._clock = run, shed, clock
        self._heap: list[_Pending] = []
        self._seq = itertools.count()
        self._inflight = 0
        self._waiting = Counter()  # priority -> chats in _heap
        self._hold_s: float | None = None  # how long a chat holds a slot, moving average
        self._shedding = 0  # handed to the shed workers, not yet answered
        self._next_reforecast = 0.0
        self._cv = threading.Condition()
        self._stop = False
        self._runners = ThreadPoolExecutor(max_workers=max_inflight, thread_name_prefix="chat")
        self._shedders = ThreadPoolExecutor(
            max_workers=shed_workers,
            thread_name_prefix="chat-shed",
            initializer=lambda: lower_this_thread(shed_nice, "the FAQ answer threads"),
        )
        self.counts = {"admitted": 0, "shed_timeout": 0, "shed_full": 0, "shed_forecast": 0, "shed_breaker": 0}
        self._thread = threading.Thread(target=self._loop, name="chat-admission", daemon=True)
        self._thread.start()

    def snapshot(self) -> dict:
        """The counts so far, and how many chats wait for a slot and hold one now."""
        with self._cv:
            return {**self.counts, "waiting": len(self._heap), "running": self._inflight}

    def submit(self, job, priority: int) -> None:
        if priority > 1 and self.breaker is not None and self.breaker():
            with self._cv:
                self.counts["shed_breaker"] += 1
                self._shedding += 1
            self._shedders.submit(self._shed_one, job, FallbackReason.LATENCY_BREAKER)
            return
        with self._cv:
            if not self._would_time_out(priority):
                heapq.heappush(self._heap, _Pending(priority, next(self._seq), self._clock() + self.max_wait_s, job))
                self._waiting[priority] += 1
                self._cv.notify()
                return
            self.counts["shed_forecast"] += 1
            self._shedding += 1
        self._shedders.submit(self._shed_one, job, FallbackReason.QUEUE_FORECAST)

    def _forecast_wait(self, priority: int) -> float | None:
        """Seconds a chat of ``priority`` submitted now would wait for a slot; None when it would
        start at once or nothing is known yet. Call with ``_cv`` held."""
        limit = self._limit(priority)
        if self._hold_s is None or self._inflight < limit:
            return None
        ahead = sum(n for p, n in self._waiting.items() if p <= priority)
        return (ahead + 1) * self._hold_s / limit

    def _reforecast(self, now: float) -> list[_Pending]:
        """The waiting priority-2 chats the forecast now says will not start before their
        deadline. Call with ``_cv`` held."""
        limit = self._limit(2)
        if self._hold_s is None or self._inflight < limit:
            return []
        per_slot = self._hold_s / limit
        late, ahead = [], 0
        for p in sorted(self._heap, key=lambda p: (p.priority, p.seq)):
            if p.priority > 1 and now + (ahead + 1) * per_slot > p.deadline:
                late.append(p)
            else:
                ahead += 1
        return late

    def _would_time_out(self, priority: int) -> bool:
        if not self.forecast or priority <= 1 or self._stop:  # priority 1 always waits its turn
            return False
        wait = self._forecast_wait(priority)
        return wait is not None and wait > self.max_wait_s

    def wait_for_room(self, timeout: float) -> bool:
        """Wait until fewer than ``max_pending`` chats wait for a slot or a shed answer."""
        with self._cv:
            return self._cv.wait_for(lambda: self._stop or len(self._heap) + self._shedding < self.max_pending, timeout)

    def pending(self) -> int:
        with self._cv:
            return len(self._heap)

    def inflight(self) -> int:
        with self._cv:
            return self._inflight

    def _loop(self) -> None:
        while True:
            start, shed = [], []
            with self._cv:
                if self._stop:
                    return
                now = self._clock()
                # Oldest-deadline-first would be fairer to waiting chats, but a chat past its
                # deadline gets a faster answer from the FAQ than from a slot it would wait for.
                shed += self._take_out(
                    [p for p in self._heap if p.deadline <= now], FallbackReason.QUEUE_TIMEOUT, "shed_timeout"
                )
                if len(self._heap) > self.max_pending:  # the lowest priority, newest first
                    shed += self._take_out(
                        sorted(self._heap)[self.max_pending :], FallbackReason.QUEUE_FULL, "shed_full"
                    )
                while self._heap and self._inflight < self._limit(self._heap[0].priority):
                    start.append(heapq.heappop(self._heap))
                    self._waiting[start[-1].priority] -= 1
                    self._inflight += 1
                    self.counts["admitted"] += 1
                if self.forecast and self._heap and now >= self._next_reforecast:
                    self._next_reforecast = now + REFORECAST_S
                    shed += self._take_out(self._reforecast(now), FallbackReason.QUEUE_FORECAST, "shed_forecast")
                self._shedding += len(shed)
                if not start and not shed:
                    wake = [p.deadline for p in self._heap]
                    if self.forecast and self._heap:
                        wake.append(self._next_reforecast)
                    timeout = min(wake, default=now + 1.0) - now
                    self._cv.wait(max(timeout, 0.001))
                    continue
            for p, reason in shed:
                self._shedders.submit(self._shed_one, p.job, reason)
            for p in start:
                self._runners.submit(self._hold_slot, p.job)

    def _take_out(self, gone: list[_Pending], reason: str, count: str) -> list[tuple[_Pending, str]]:
        """Remove ``gone`` from the queue, to be shed for ``reason``. Call with ``_cv`` held."""
        if gone:
            ids = {id(p) for p in gone}
            self._heap = [p for p in self._heap if id(p) not in ids]
            heapq.heapify(self._heap)
            self._waiting.subtract(p.priority for p in gone)
            self.counts[count] += len(gone)
        return [(p, reason) for p in gone]

    def _limit(self, priority: int) -> int:
        return self.max_inflight if priority <= 1 else self.max_inflight - self.reserved

    def _hold_slot(self, job) -> None:
        """Run a chat in its slot; free the slot and learn how long it was held."""
        t0 = self._clock()
        try:
            self._guard(self._run, job)
        finally:
            held = self._clock() - t0
            with self._cv:
                self._inflight -= 1
                self._hold_s = held if self._hold_s is None else self._hold_s + HOLD_EWMA * (held - self._hold_s)
                self._cv.notify_all()

    def _shed_one(self, job, reason: str) -> None:
        """Answer a shed chat (on a shed worker), then count it out and wake ``wait_for_room``."""
        try:
            self._guard(self._shed, job, reason)
        finally:
            with self._cv:
                self._shedding -= 1
                self._cv.notify_all()

    @staticmethod
    def _guard(fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # the callbacks answer their own errors; this only keeps the loop alive
            log.exception("chat job failed")

    def close(self, shed_reason: str = FallbackReason.SHUTTING_DOWN) -> None:
        """Stop admitting; waiting chats are shed (answered), running ones finish."""
        with self._cv:
            self._stop = True
            waiting, self._heap = self._heap, []
            self._waiting.clear()
            self._cv.notify_all()
        self._thread.join(5)
        for p in waiting:
            self._guard(self._shed, p.job, shed_reason)
        self._runners.shutdown(wait=True)
        self._shedders.shutdown(wait=True)

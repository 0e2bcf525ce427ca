"""The suite's load generators, written once for every channel.

What is sent is the caller's: a clip (``perf.asr_load``), a chat (``perf.chaos``'s burst), a
whole session of turns (``perf.driver``: a session replay is an open loop whose item is a
session). Two shapes:

- ``closed_loop``: ``concurrency`` callers, each sending the next item as soon as its last one
  is answered (throughput: the server sets the pace);
- ``open_loop`` (threads) and ``open_loop_async`` (one asyncio loop, for a client on one
  channel): each item sent at its scheduled time, whatever is in flight (latency under a load
  that does not wait for the server).

Every attempt becomes a ``Sent``: when it went out and came back on the clock passed in, what
``call`` returned or the exception it raised (recorded, never dropped; the run goes on).
``poisson_schedule`` draws the seeded arrival times. No clock but the one passed in and no
threads but the loops' own, so the unit tests run them with fakes.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


@dataclass
class Sent:
    """One attempt as the load generator saw it."""

    item: Any
    sent: float
    done: float
    result: Any = None
    error: Exception | None = None
    scheduled: float | None = None  # open loops: when it was due (``sent`` - this: the sender's lag)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def latency(self) -> float:
        return self.done - self.sent


def _attempt(call: Callable[[Any], Any], item: Any, clock: Callable[[], float]) -> Sent:
    sent = clock()
    try:
        result = call(item)
    except Exception as e:  # noqa: BLE001 - a failed request is counted, the run goes on
        return Sent(item, sent, clock(), error=e)
    return Sent(item, sent, clock(), result)


async def _attempt_async(call: Callable[[Any], Awaitable], item: Any, clock: Callable[[], float]) -> Sent:
    sent = clock()
    try:
        result = await call(item)
    except Exception as e:  # noqa: BLE001 - as in _attempt
        return Sent(item, sent, clock(), error=e)
    return Sent(item, sent, clock(), result)


def closed_loop(
    call: Callable[[Any], Any], items: Sequence, concurrency: int, clock: Callable[[], float] = time.monotonic
) -> list[Sent]:
    """Every item of ``items`` sent once by ``concurrency`` callers (started together), each
    taking the next unsent item when its last one is answered. The records are in ``items``'
    order."""
    if concurrency < 1:
        raise ValueError(f"concurrency {concurrency} must be at least 1")
    if not items:
        return []
    callers = min(concurrency, len(items))
    lock = threading.Lock()
    next_index = iter(range(len(items)))
    out: list[Sent | None] = [None] * len(items)
    start = threading.Barrier(callers)

    def caller() -> None:
        start.wait()
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            out[i] = _attempt(call, items[i], clock)

    threads = [threading.Thread(target=caller, name=f"closed-loop-{n}", daemon=True) for n in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [s for s in out if s is not None]


def _in_time_order(schedule: Sequence[tuple[float, Any]]) -> None:
    times = [at for at, _ in schedule]
    if any(b < a for a, b in zip(times, times[1:])):
        raise ValueError("the schedule's times must not decrease")


def open_loop(
    call: Callable[[Any], Any],
    schedule: Sequence[tuple[float, Any]],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    max_in_flight: int | None = None,
    start: float | None = None,
) -> list[Sent]:
    """Each (time, item) of ``schedule`` (seconds after ``start``, default now; in time order)
    sent at its time on a thread of its own, whether or not earlier ones were answered.
    ``max_in_flight`` caps the threads (default: one per item); an item due while all are busy
    waits for one. The records are in the schedule's order, each with its ``scheduled`` time."""
    _in_time_order(schedule)
    if not schedule:
        return []
    t0 = clock() if start is None else start
    futures = []
    with ThreadPoolExecutor(max_in_flight or len(schedule), thread_name_prefix="open-loop") as pool:
        for at, item in schedule:
            wait = t0 + at - clock()
            if wait > 0:
                sleep(wait)
            futures.append((t0 + at, pool.submit(_attempt, call, item, clock)))
    out = []
    for due, f in futures:
        record = f.result()
        record.scheduled = due
        out.append(record)
    return out


async def open_loop_async(
    call: Callable[[Any], Awaitable],
    schedule: Sequence[tuple[float, Any]],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable] = asyncio.sleep,
) -> list[Sent]:
    """``open_loop`` on the running asyncio loop: each item's ``call(item)`` a task started at
    its time. For clients that multiplex many requests on one channel, where a thread per
    request would cost the generator more CPU than the server spends (``perf.chaos``'s burst)."""
    _in_time_order(schedule)
    t0 = clock()
    tasks = []
    for at, item in schedule:
        wait = t0 + at - clock()
        if wait > 0:
            await sleep(wait)
        tasks.append((t0 + at, asyncio.create_task(_attempt_async(call, item, clock))))
    out = []
    for due, task in tasks:
        record = await task
        record.scheduled = due
        out.append(record)
    return out


def poisson_schedule(
    rate_per_s: float,
    duration_s: float,
    rng: random.Random,
    draw: Callable[[random.Random], Any] = lambda rng: None,
    at_zero: bool = False,
) -> list[tuple[float, Any]]:
    """(time, item) of Poisson arrivals at ``rate_per_s`` on average within ``duration_s``,
    each item ``draw(rng)`` (a kind, a priority), drawn from ``rng`` after its arrival's gap.
    ``at_zero``: the first arrival at 0 (its item drawn first), the rest as above. The same
    seeded ``rng`` gives the same schedule."""
    if not rate_per_s > 0 or not duration_s > 0:
        raise ValueError(f"rate {rate_per_s} and duration {duration_s} must be > 0")
    out, t = [], 0.0
    if at_zero:
        out.append((0.0, draw(rng)))
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            return out
        out.append((t, draw(rng)))


def weighted(mix: dict[str, float]) -> Callable[[random.Random], str]:
    """A ``draw`` for ``poisson_schedule``: a key of ``mix`` with its weight's chance."""
    if not mix or any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"mix {mix}: weights must be >= 0 and not all 0")
    kinds, weights = list(mix), list(mix.values())
    return lambda rng: rng.choices(kinds, weights)[0]

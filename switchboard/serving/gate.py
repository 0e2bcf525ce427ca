"""The send gate: every response ``chat`` sends goes through it, priority 1 first."""

from __future__ import annotations

import heapq
import itertools
import threading
from contextlib import contextmanager


class PriorityGate:
    """One holder at a time; waiters are let in by rank (lowest first), then arrival.

    ``chat`` sends every response through it, ranked by ``send_rank``. A Python-backend stub's
    send is a synchronous round trip to the server, and under load a send waits behind every
    other stream's; without the gate a priority-1 chat paid that wait on each of its tokens
    while priority-2 chats held the line. (The server completes sends on a thread pool, but a
    gate four wide measured slower for priority 1 and no faster overall.)
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._busy = False
        self._waiting: list[tuple[object, int, threading.Lock]] = []
        self._seq = itertools.count()

    def acquire(self, rank) -> None:
        with self._lock:
            if not self._busy:
                self._busy = True
                return
            turn = threading.Lock()
            turn.acquire()
            heapq.heappush(self._waiting, (rank, next(self._seq), turn))
        turn.acquire()  # released by the holder that hands us the gate

    def release(self) -> None:
        with self._lock:
            if self._waiting:
                heapq.heappop(self._waiting)[2].release()  # the gate passes on, still busy
            else:
                self._busy = False

    @contextmanager
    def __call__(self, rank):
        self.acquire(rank)
        try:
            yield
        finally:
            self.release()


def send_rank(priority: int, final: bool) -> tuple[int, int]:
    """A response's place at the gate: priority first; within a priority, a response that ends
    a chat (a whole FAQ answer, or a stream's last words) before a stream's next delta. A stream
    that waits sends the tokens that arrived meanwhile as one delta (coarser, no work lost),
    while under a burst each FAQ answer would wait behind a delta from every generating chat, and
    the FAQ's answers fall behind the shed chats (docs/reliability.md)."""
    return priority, 0 if final else 1

"""A latency circuit breaker (seed 001): while recent P99 time to first token is over a bound,
new priority-2 chats get the FAQ answer at once, so the chats already admitted and every
priority-1 chat get the capacity back; priority 1 is never shed by it.

The window holds the times to first token of generated answers (FAQ answers are instant and
would hide the overload) from the last ``window_s``. The breaker is open while the window holds
at least ``min_samples`` and their P99 is over ``bound_s``. Open, it lets no new priority-2
chat through, so the window drains to what priority 1 and the chats in flight report; once
slow samples age out (or too few are left to judge) it closes, and the next priority-2 chats
show whether the overload is over: the half-open state of a classic breaker, paced by the
window.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

RECOMPUTE_S = 0.25  # the P99 is recomputed at most this often (a sort of the window)


class LatencyBreaker:
    def __init__(
        self, bound_s: float, window_s: float = 30.0, min_samples: int = 20, clock: Callable[[], float] = time.monotonic
    ):
        self.bound_s, self.window_s, self.min_samples, self.clock = bound_s, window_s, min_samples, clock
        self._samples: deque[tuple[float, float]] = deque()  # (when, seconds to first token)
        self._lock = threading.Lock()
        self._p99: float | None = None
        self._computed_at = float("-inf")
        self.opened = 0  # times it went from closed to open
        self._was_open = False

    def observe(self, ttft_s: float) -> None:
        with self._lock:
            self._samples.append((self.clock(), ttft_s))

    def p99(self) -> float | None:
        """P99 of the window, or None when it holds fewer than ``min_samples``."""
        with self._lock:
            now = self.clock()
            if now - self._computed_at < RECOMPUTE_S:
                return self._p99
            while self._samples and self._samples[0][0] < now - self.window_s:
                self._samples.popleft()
            values = sorted(v for _, v in self._samples)
            self._p99 = (
                values[min(len(values) - 1, int(0.99 * len(values)))] if len(values) >= self.min_samples else None
            )
            self._computed_at = now
            return self._p99

    def is_open(self) -> bool:
        p99 = self.p99()
        now_open = p99 is not None and p99 > self.bound_s
        with self._lock:
            if now_open and not self._was_open:
                self.opened += 1
            self._was_open = now_open
        return now_open

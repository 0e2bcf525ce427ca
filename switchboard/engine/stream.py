"""How a sequence's tokens and its cancellation travel between the engine and Triton.

In the Python backend every ``send`` and every ``is_cancelled`` is a synchronous round trip
to the server process, which handles them one after another. One send per token per row and
one cancellation check per row per step made those round trips, not the model, the limit
under load (README, "Priority 1 under a burst"). So:

- ``TokenStream`` holds a sequence's tokens back until ``interval_s`` has passed since its
  last send (the first token always goes at once, so time to first token is untouched);
  priority 1 uses interval 0, one send per token.
- ``CancelPoll`` asks whether the client cancelled at most once per ``interval_s``; a
  cancelled sequence is noticed at most that much later.
"""

from __future__ import annotations

import time
from typing import Callable


class TokenStream:
    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self._clock = clock
        self._held: list[int] = []
        self._sent_at: float | None = None

    def add(self, ids: list[int]) -> list[int] | None:
        """Tokens to send now (the held ones included), or None to hold them."""
        self._held.extend(ids)
        now = self._clock()
        if self._sent_at is not None and now - self._sent_at < self.interval_s:
            return None
        self._sent_at = now
        out, self._held = self._held, []
        return out

    def rest(self) -> list[int]:
        """Tokens still held (for the final response)."""
        out, self._held = self._held, []
        return out


class CancelPoll:
    def __init__(self, check: Callable[[], bool], interval_s: float, clock: Callable[[], float] = time.monotonic):
        self._check, self.interval_s, self._clock = check, interval_s, clock
        self._checked_at: float | None = None
        self._cancelled = False

    def __call__(self) -> bool:
        if self._cancelled:
            return True
        now = self._clock()
        if self._checked_at is None or now - self._checked_at >= self.interval_s:
            self._checked_at = now
            self._cancelled = bool(self._check())
        return self._cancelled

"""How a sequence's tokens and its cancellation travel between the engine and Triton.

In the Python backend every ``send`` and every ``is_cancelled`` is a synchronous round trip
to the server process, which handles them one after another. One send per token per row and
one cancellation check per row per step made those round trips, not the model, the limit
under load (docs/reliability.md, "Priority 1 under a burst"). So:

- ``Outbox`` takes the sends off the engine loop: the loop only queues tokens; one sender
  thread sends them, priority 1 first, each stream's queued tokens in one response. While the
  server answers round trips quickly every token goes alone; when it is slow, tokens coalesce
  instead of the decode loop (and every row's next token) waiting on each send.
- ``TokenStream`` holds a sequence's tokens back until ``interval_s`` has passed since its
  last send (the first token always goes at once, so time to first token is untouched);
  priority 1 uses interval 0, one send per token.
- ``CancelPoll`` asks whether the client cancelled at most once per ``interval_s``; a
  cancelled sequence is noticed at most that much later.
- ``ResponseSender`` is that one sender thread and ``CancelWatch`` a thread that asks about
  cancellation for every live stream, so neither kind of round trip runs on the loop. Both
  serve any decoupled pool (the generation pools and ``asr``): what they need of a stream is
  ``Sink``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable, Protocol

log = logging.getLogger("switchboard.stream")


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


class Outbox:
    """Tokens and finals queued by the engine loop, taken by one sender thread.

    ``put`` never blocks on I/O. ``take`` returns the highest-priority stream with anything
    queued (lowest priority number, then the one waiting longest), with all its queued tokens
    and, if the stream ended, its final item; a stream's items therefore leave in order.
    """

    def __init__(self):
        self._cv = threading.Condition()
        self._pending: dict[object, list] = {}  # key -> [tokens, final, has_final]
        self._ready: list[tuple[int, int, object]] = []
        self._seq = itertools.count()
        self._closed = False

    def put(self, key, priority: int, tokens: list[int] = (), final=None, end: bool = False) -> None:
        with self._cv:
            entry = self._pending.get(key)
            if entry is None:
                entry = self._pending[key] = [[], None, False]
                heapq.heappush(self._ready, (priority, next(self._seq), key))
                self._cv.notify()
            entry[0].extend(tokens)
            if end:
                entry[1], entry[2] = final, True

    def take(self, timeout: float | None = None):
        """``(key, tokens, final, end)``, or None after ``timeout`` or once closed and empty."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._ready or self._closed, timeout) or not self._ready:
                return None
            _, _, key = heapq.heappop(self._ready)
            tokens, final, end = self._pending.pop(key)
            return key, tokens, final, end

    def close(self) -> None:
        """``take`` drains what is queued, then returns None."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()


class Sink(Protocol):
    """One stream as ``ResponseSender`` and ``CancelWatch`` see it. ``lock`` guards ``final_sent``:
    Triton 2.51 segfaults in ``is_cancelled()`` on a request whose final response was sent, so
    the watch asks only while holding it and not done."""

    request: object  # has is_cancelled()
    lock: threading.Lock
    final_sent: bool
    cancel_seen: bool  # the client cancelled (CancelWatch)
    broken: bool  # a send failed (ResponseSender)

    def deliver(self, items: list, final, end: bool) -> None: ...


class CancelWatch:
    """Asks Triton every ``interval_s`` whether each live request was cancelled, on its own
    thread: ``is_cancelled`` is a round trip to the server that the decoding loop must not wait on."""

    def __init__(self, name: str, interval_s: float):
        self.interval_s = max(interval_s, 0.001)
        self._live: set[Sink] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{name}-cancel-watch", daemon=True)
        self._thread.start()

    def add(self, sink: Sink) -> None:
        with self._lock:
            self._live.add(sink)

    def discard(self, sink: Sink) -> None:
        with self._lock:
            self._live.discard(sink)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                live = list(self._live)
            for sink in live:
                with sink.lock:
                    if sink.final_sent:
                        continue
                    try:
                        if sink.request.is_cancelled():
                            sink.cancel_seen = True
                    except Exception:  # the request is gone: nobody to answer
                        sink.cancel_seen = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5 * self.interval_s + 1)


class ResponseSender:
    """The one thread that sends a pool's responses, priority 1 first (Outbox says why)."""

    def __init__(self, name: str, watch: CancelWatch):
        self.outbox, self.watch = Outbox(), watch
        self._thread = threading.Thread(target=self._loop, name=f"{name}-sender", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (item := self.outbox.take()) is not None:
            sink, items, final, end = item
            if end:
                self.watch.discard(sink)
                with sink.lock:
                    sink.final_sent = True
            try:
                sink.deliver(items, final, end)
            except Exception:  # the client is gone: the loop drops the stream at its next step
                log.exception("send failed; dropping the stream")
                sink.broken = True

    def close(self, timeout: float = 5.0) -> None:
        self.outbox.close()
        self._thread.join(timeout)

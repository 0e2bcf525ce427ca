"""Which generation pool failed recently, so chats are routed around a pool whose stub died
instead of each paying for the failure."""

from __future__ import annotations

import logging
import math
import threading
import time
from contextlib import contextmanager
from typing import Callable

log = logging.getLogger(__name__)


class PoolHealth:
    """Pools that failed (not: were busy) in the last ``retry_after_s`` are avoided.

    A failure here means the pool's stub process died, and Triton 2.51 never completes the
    requests it held: the chats still streaming from it would each wait out their stall bound.
    So each stream registers while it reads (``watching``), and a failure of its pool ends it
    at once.

    A failure is found by a chat whose request Triton refuses as the stub's, or, when no chat
    sends one (every chat is already waiting on the dead pool), by ``ping``: a stream quiet for
    ``probe_after_s`` calls ``quiet(pool)``, and one thread at a time per pool asks the pool
    (``ping(pool)``: True alive, False dead, None no answer). Only False counts: a busy pool
    answers late or not at all, and that is not a failure.

    A pool found dead is avoided for ``retry_after_s``, or, with ``ping``, until a ping says it
    is alive again: while it is down, the chats that route around it ask it at most once per
    ``probe_after_s`` (the supervisor reloads a dead pool in a few seconds; docs/reliability.md).
    """

    def __init__(
        self,
        retry_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        ping: Callable[[str], bool | None] | None = None,
        probe_after_s: float = 0.0,
    ):
        self.retry_after_s = retry_after_s
        self.probe_after_s = probe_after_s if ping is not None else 0.0
        self._ping = ping
        self._clock = clock
        self._down: dict[str, float] = {}
        self._watchers: dict[str, set[Callable[[], None]]] = {}
        self._pinging: set[str] = set()  # one ping at a time per pool
        self._pinged_at: dict[str, float] = {}  # when the pool's last ping started
        self._lock = threading.Lock()

    def quiet(self, pool: str) -> None:
        """A stream from ``pool`` has had no response for ``probe_after_s``: ask the pool,
        unless a ping is under way or one started within the last ``probe_after_s``."""
        if not self.probe_after_s:
            return
        with self._lock:
            now = self._clock()
            if pool in self._pinging or now - self._pinged_at.get(pool, -math.inf) < self.probe_after_s:
                return
            self._pinging.add(pool)
            self._pinged_at[pool] = now
        threading.Thread(target=self._probe, args=(pool,), name=f"ping-{pool}", daemon=True).start()

    def _probe(self, pool: str) -> None:
        try:
            alive = self._ping(pool)
            if alive is False:
                log.error("pool %s: a ping says its stub process is dead", pool)
                self.failed(pool)
            elif alive is True and not self.up(pool, ask=False):
                with self._lock:
                    self._down.pop(pool, None)
                log.warning("pool %s answers again: routing to it", pool)
        except Exception:  # noqa: BLE001 - a ping that broke says nothing about the pool
            log.exception("ping %s", pool)
        finally:
            with self._lock:
                self._pinging.discard(pool)

    def failed(self, pool: str) -> None:
        with self._lock:
            first = self._down.get(pool, 0.0) <= self._clock()
            self._down[pool] = self._clock() + self.retry_after_s
            watchers = list(self._watchers.get(pool, ()))
        if first:
            log.error("pool %s failed; routing around it for %.0f s", pool, self.retry_after_s)
        if watchers:
            log.warning("pool %s failed: ending the %d streams still reading from it", pool, len(watchers))
        for dead in watchers:
            dead()

    @contextmanager
    def watching(self, pool: str, dead: Callable[[], None]):
        """Within the block, ``dead()`` is called (on the reporting thread; keep it short) when
        ``pool`` is reported failed."""
        with self._lock:
            self._watchers.setdefault(pool, set()).add(dead)
        try:
            yield
        finally:
            with self._lock:
                self._watchers[pool].discard(dead)

    def up(self, pool: str, ask: bool = True) -> bool:
        """Whether ``pool`` may be used; one that is down is pinged (``ask``), as ``quiet`` does."""
        with self._lock:
            down = self._down.get(pool, 0.0) > self._clock()
        if down and ask:
            self.quiet(pool)
        return not down

    def order(self, preferred: str, other: str) -> list[str]:
        """Pools to try, healthy first: the preferred one, then the other."""
        pools = [preferred, other]
        return sorted(pools, key=lambda p: not self.up(p))

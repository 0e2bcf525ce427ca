"""Which queued ASR requests run together: batching by audio length, and the count baseline.

Seed 001's incident: audio of very different lengths batched together made the short requests
wait for the long ones. A Whisper batch costs about as much as its longest item (every row is
padded to it, and decoding runs until the longest transcript ends), so a 2 s question batched
with a 30 s voicemail waits for the voicemail. ``LengthBatcher`` keeps lengths in a batch
within ``max_ratio`` of each other and runs short work first; ``CountBatcher`` is the plain
count/timeout policy (Triton's dynamic batcher: FIFO, run when full or timed out) the seed-001
experiment measures it against. ``make_batcher(name)`` picks one by name, so the pool holds
the policy and never its rules.

Both are pure: no threads, no clock; the caller passes ``now`` (any monotonic seconds, the same
clock as ``Item.arrival``), calls ``take(now)`` when a worker is free and sleeps until
``next_due(now)`` otherwise. That keeps every decision testable to the microsecond.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Item:
    """One queued request, or one chunk of it: ``seconds`` of audio; ``priority`` 1 is VIP, larger
    waits; ``arrival`` on the caller's clock; ``audio_s`` the whole request's audio when this is a
    chunk of it (None: ``seconds``)."""

    key: Any
    seconds: float
    priority: int = 2
    arrival: float = 0.0
    audio_s: float | None = None


class _Queue:
    """What both policies share: the queue, in arrival order (insertion order among ties)."""

    def __init__(self, max_batch: int = 8, max_wait_s: float = 0.01):
        if max_batch < 1:
            raise ValueError(f"batcher: max_batch must be at least 1, got {max_batch}")
        if not max_wait_s >= 0:
            raise ValueError(f"batcher: max_wait_s must be >= 0, got {max_wait_s}")
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self._queue: list[tuple[int, Item]] = []  # (sequence, item): items are never compared
        self._seq = 0

    def add(self, item: Item) -> None:
        if not (math.isfinite(item.seconds) and item.seconds >= 0):
            raise ValueError(f"batcher: an item's seconds must be finite and >= 0, got {item.seconds!r}")
        if not math.isfinite(item.arrival):
            raise ValueError(f"batcher: an item's arrival must be finite, got {item.arrival!r}")
        if item.audio_s is not None and not (math.isfinite(item.audio_s) and item.audio_s >= 0):
            raise ValueError(f"batcher: an item's audio_s must be finite and >= 0, got {item.audio_s!r}")
        self._queue.append((self._seq, item))
        self._seq += 1

    def remove(self, key: Any) -> Item | None:
        """Drop the queued item with ``key`` (a caller that went away); None if not queued."""
        for i, (_, item) in enumerate(self._queue):
            if item.key == key:
                del self._queue[i]
                return item
        return None

    def __len__(self) -> int:
        return len(self._queue)

    def take(self, now: float) -> list[Item]:
        """The batch to run now, removed from the queue; ``[]`` when none is due yet."""
        if not self._queue:
            return []
        batch, due = self._plan(now)
        if not batch or due > now:
            return []
        return self._hand_out(batch, now)

    def join(self, now: float, room: int) -> list[Item]:
        """Up to ``room`` items to join a batch that is running (in-flight batching), removed
        from the queue: those the next batch would start with, as ``take`` plans it, without
        waiting for it to be due (the running batch is their company)."""
        if not self._queue or room < 1:
            return []
        return self._hand_out(self._plan(now)[0][:room], now)

    def _hand_out(self, batch: list[tuple[int, Item]], now: float) -> list[Item]:
        taken = {seq for seq, _ in batch}
        self._queue = [entry for entry in self._queue if entry[0] not in taken]
        items = [item for _, item in batch]
        self._taken(items, now)
        return items

    def _taken(self, batch: list[Item], now: float) -> None:
        """Called with each batch ``take`` or ``join`` hands out, after it left the queue."""

    def next_due(self, now: float) -> float | None:
        """When ``take`` returns a batch if nothing else arrives: ``now`` or later; None when empty."""
        if not self._queue:
            return None
        return max(now, self._plan(now)[1])

    def _plan(self, now: float) -> tuple[list[tuple[int, Item]], float]:
        """The batch that would run next and the time it becomes due."""
        raise NotImplementedError


class CountBatcher(_Queue):
    """The baseline: first come, first served (within a priority, as Triton's dynamic batcher with
    priority levels), a batch runs when ``max_batch`` items wait or the oldest has waited
    ``max_wait_s``, whatever their lengths."""

    def _plan(self, now: float) -> tuple[list[tuple[int, Item]], float]:
        order = sorted(self._queue, key=lambda e: (e[1].priority, e[1].arrival, e[0]))
        batch = order[: self.max_batch]
        if len(batch) == self.max_batch:
            return batch, -math.inf
        return batch, min(item.arrival for _, item in batch) + self.max_wait_s


class LengthBatcher(_Queue):
    """Batches of similar length under an audio budget, short work first (seed 001's fix).

    Policy, in the order it decides:

    1. The anchor, the item the next batch is built around, from the highest priority present
       (lowest number: priority 1 never waits behind priority 2):
       - Short audio first: a chunk of a long request (its whole audio over ``long_s``) anchors
         only when no short request waits, or when it has waited ``starve_s`` and ``long_every``
         - 1 batches went by since long audio last ran while one such chunk waited. Under an
         overload long recordings get every ``long_every``-th batch at least and the questions
         the rest, so the backlog lands on the recordings, as if they had a pool of their own
         (seed 001's own remedy), yet they never starve.
       - Within the class: among the items that have waited ``starve_s`` or more the one that
         has waited longest for its length (ageing: a long item cannot be passed over forever
         by a stream of short ones, yet under a backlog a 3 s question still goes before a
         12 s one that has not waited four times as long: highest response ratio next), else
         the shortest, oldest first among equals (shortest job first: a 2 s question does not
         wait for a 30 s voicemail that came just before it).
    2. The batch: the anchor, then other items of its priority, then lower priorities, each
       group shortest first, taking those that keep the batch's longest within ``max_ratio``
       of its shortest (a batch costs its longest item: mixing lengths makes the short ones
       pay for the long), its total audio within ``budget_s`` (what one batch may hold in
       memory and time; with a window, what the encoder reads: every row its longest's window)
       and its size within
       ``max_batch``. An item longer than the budget runs alone.
    3. When it runs: at once when it is full (``max_batch`` items, or no item that could still
       join, one at least its longest / ``max_ratio`` long, would fit the budget), else when
       the anchor has waited ``max_wait_s`` (so a lone request is not held for long), but only
       while requests come in company: after a batch of one that left nothing queued, the next
       request runs as soon as a worker takes it (``wait_alone`` False, the default). A caller
       on its own then pays no wait; under load a batch has company, so the wait gathers the
       next one as before; and when load starts, the requests that arrive while the first one
       runs make the next batch. ``wait_alone`` True waits every time (Triton's dynamic
       batcher's rule, as ``CountBatcher``).

    ``starve_s`` (2 s) is far above ``max_wait_s``, so under a mixed load the short ones still go
    first, and small against the 30 s of audio a long recording carries.

    ``window_s``: what every item costs of the budget at least, for a model that pads each chunk
    to a fixed window (Whisper's 30 s): its encoder works on the window whatever was said, so a
    2 s question costs a 30 s batch row, and the budget bounds what a batch costs (and what the
    questions in it wait for) only if it counts that. A function of the chunk's seconds instead
    for one whose window is fitted to the audio (``AsrModel.padded_s``): a batch's rows are
    padded to its longest's window, so each costs that.
    """

    def __init__(
        self,
        budget_s: float = 60.0,
        max_batch: int = 8,
        max_ratio: float = 2.0,
        max_wait_s: float = 0.01,
        starve_s: float = 2.0,
        window_s: float | Callable[[float], float] = 0.0,
        long_s: float = 15.0,
        long_every: int = 3,
        wait_alone: bool = False,
    ):
        super().__init__(max_batch, max_wait_s)
        if not budget_s > 0:
            raise ValueError(f"batcher: budget_s must be > 0, got {budget_s}")
        if not max_ratio >= 1:
            raise ValueError(f"batcher: max_ratio must be >= 1, got {max_ratio}")
        if not starve_s >= max_wait_s:
            raise ValueError(f"batcher: starve_s ({starve_s}) must be >= max_wait_s ({max_wait_s})")
        if not callable(window_s) and not (math.isfinite(window_s) and window_s >= 0):
            raise ValueError(f"batcher: window_s must be finite and >= 0, got {window_s}")
        if not long_s > 0:
            raise ValueError(f"batcher: long_s must be > 0, got {long_s}")
        if not (isinstance(long_every, int) and long_every >= 1):
            raise ValueError(f"batcher: long_every must be a whole number >= 1, got {long_every!r}")
        self.budget_s, self.max_ratio, self.starve_s, self.window_s = budget_s, max_ratio, starve_s, window_s
        self.long_s, self.long_every, self.wait_alone = long_s, long_every, wait_alone
        self._company = False  # the last batch held more than one item, or left some queued
        self._passed = 0  # batches without long audio since it last ran while a starving long chunk waited

    def _cost(self, rows: int, total_s: float, longest_s: float) -> float:
        """What a batch of ``rows`` items costs of the budget: their seconds, or with a window
        ``rows`` times its longest's (an item longer than the window counts as itself)."""
        if callable(self.window_s):
            return rows * max(longest_s, self.window_s(longest_s))
        return max(total_s, rows * self.window_s) if self.window_s else total_s

    def _long(self, item: Item) -> bool:
        # a source's duration and its resampled chunks' can differ by a sample: the larger counts
        return max(item.seconds, item.audio_s or 0.0) > self.long_s

    def _starving(self, item: Item, now: float) -> bool:
        # arrival + starve_s <= now, not now - arrival >= starve_s: the same sum next_due reports,
        # so take(next_due(now)) sees the item as starving whatever the rounding
        return item.arrival + self.starve_s <= now

    def _pool(self, now: float) -> tuple[list[tuple[int, Item]], list[float]]:
        """The items the anchor is chosen from, and when a long chunk starting to starve would
        change that (the class rule of step 1)."""
        top = min(item.priority for _, item in self._queue)
        same = [e for e in self._queue if e[1].priority == top]
        short, long = [], []
        for e in same:
            (long if self._long(e[1]) else short).append(e)
        if not short or not long:
            return same, []
        if self._passed < self.long_every - 1:
            return short, []
        if any(self._starving(e[1], now) for e in long):
            return long, []
        return short, [min(e[1].arrival for e in long) + self.starve_s]

    def _anchor(self, pool: list[tuple[int, Item]], now: float) -> tuple[int, Item]:
        starving = [e for e in pool if self._starving(e[1], now)]
        if starving:  # the longest wait for its length first: under a backlog, still short first
            return min(starving, key=lambda e: (-(now - e[1].arrival) / max(e[1].seconds, 0.5), e[1].arrival, e[0]))
        return min(pool, key=lambda e: (e[1].seconds, e[1].arrival, e[0]))

    def _plan(self, now: float) -> tuple[list[tuple[int, Item]], float]:
        pool, switch = self._pool(now)
        anchor = self._anchor(pool, now)
        lo = hi = total = anchor[1].seconds
        batch = [anchor]
        if self._cost(1, total, hi) > self.budget_s:
            return batch, -math.inf
        others = sorted(
            (e for e in self._queue if e[0] != anchor[0]),
            key=lambda e: (e[1].priority, e[1].seconds, e[1].arrival, e[0]),
        )
        for entry in others:
            if len(batch) == self.max_batch:
                break
            s = entry[1].seconds
            if self._cost(len(batch) + 1, total + s, max(hi, s)) > self.budget_s or max(hi, s) > self.max_ratio * min(
                lo, s
            ):
                continue
            batch.append(entry)
            total, lo, hi = total + s, min(lo, s), max(hi, s)
        # full: not even the shortest item that could still join (hi / max_ratio) fits
        full = (
            len(batch) == self.max_batch or self._cost(len(batch) + 1, total + hi / self.max_ratio, hi) > self.budget_s
        )
        wait = self.max_wait_s if self._company or self.wait_alone else 0.0
        due = -math.inf if full else anchor[1].arrival + wait
        # ageing can change the anchor before that: an item of the pool reaching starve_s (or a
        # long chunk that turns the pool over to long audio) becomes the anchor and, having
        # waited longer than max_wait_s, is due at once
        ageing = switch + [e[1].arrival + self.starve_s for e in pool if not self._starving(e[1], now)]
        if ageing:
            due = min(due, min(ageing))
        batch.sort(key=lambda e: (e[1].seconds, e[1].arrival, e[0]))
        return batch, due

    def _taken(self, batch: list[Item], now: float) -> None:
        self._company = len(batch) > 1 or bool(self._queue)
        if any(self._long(item) for item in batch):
            self._passed = 0
            return
        top = min(item.priority for item in batch)
        if any(self._long(e[1]) and e[1].priority == top and self._starving(e[1], now) for e in self._queue):
            self._passed += 1


_BATCHERS = {"length": LengthBatcher, "count": CountBatcher}


def length_ratio(configured: float, fixed_window: bool) -> float:
    """``LengthBatcher``'s ``max_ratio`` for a pool (asr/config.pbtxt's ``max_length_ratio``, 0:
    automatic): none for a model that pads every chunk to a fixed window (the padding costs the
    same whatever the mix), 2 for one that takes audio of any length."""
    return configured or (math.inf if fixed_window else 2.0)


CPU_BUDGET_S = 60.0  # asr/config.pbtxt's batch_audio_s when it says 0 and the pool runs on a CPU


def audio_budget(configured: float, window_s: float | None, max_batch: int, gpu: bool) -> float:
    """The seconds of audio a batch may hold: asr/config.pbtxt's ``batch_audio_s``, or for 0
    (automatic) 60 s on a CPU, where a batch costs about its rows one by one (two of Whisper's
    30 s windows), and ``max_batch`` windows of a fixed-window model on a GPU, where they cost
    little more than one."""
    if configured:
        return configured
    if gpu and window_s:
        return max(CPU_BUDGET_S, max_batch * window_s)
    return CPU_BUDGET_S


def length_batcher(
    window_s: float | Callable[[float], float] | None,
    *,
    budget_s: float,
    max_batch: int,
    max_length_ratio: float,
    max_wait_s: float,
    long_s: float,
    long_every: int,
    wait_alone: bool = False,
) -> LengthBatcher:
    """The pool's ``LengthBatcher`` for a model whose every chunk is padded to ``window_s`` (a
    function of the chunk's seconds: a window fitted to it; None:
    one that takes audio of any length), from asr/config.pbtxt's settings."""
    fixed = window_s is not None
    ratio = length_ratio(max_length_ratio, fixed_window=fixed)
    return LengthBatcher(
        budget_s,
        max_batch,
        ratio,
        max_wait_s,
        window_s=window_s if fixed else 0.0,
        long_s=long_s,
        long_every=long_every,
        wait_alone=wait_alone,
    )


def make_batcher(name: str, **kw: Any) -> LengthBatcher | CountBatcher:
    """The batcher called ``name`` ("length" or "count") with its parameters; a ValueError names
    an unknown batcher or a parameter it does not take."""
    cls = _BATCHERS.get(name)
    if cls is None:
        raise ValueError(f"batcher: unknown batcher {name!r}; choose one of {', '.join(sorted(_BATCHERS))}")
    params = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(kw) - params)
    if unknown:
        raise ValueError(f"batcher: {name!r} takes {', '.join(sorted(params))}; not {', '.join(unknown)}")
    return cls(**kw)

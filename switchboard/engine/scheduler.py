"""The generation loop: priority admission, iteration-level batching, streaming callbacks.

Each iteration works on one *lane*, a running batch with its own KV cache: it admits waiting
sequences (lowest priority number first, then arrival order) while there is room
(``priority_slots`` rows are kept for priority 1) and prefills them together on top of their
cached prefixes, or else runs one decode step for the lane's rows. Finished rows leave
between steps. Nothing here knows Triton: results go to a ``Sink``.

Priority 1 has its own lane when ``preempt_steps`` > 0. While it has work its iterations come
first, and priority 2's lane gets one iteration after every ``preempt_steps`` of them, so
priority 2 is slowed, never starved. A priority-1 token then costs a step at priority 1's own
batch size, not one in a full priority-2 batch with priority-2 prefills in between: under a 5x
burst priority 1's time in the engine fell from 140 to 66-102 ms, P50 (README, "Priority 1
under a burst").
``preempt_steps`` 0 is one shared lane for all priorities.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from switchboard.engine.batch import KVBatch, prefill_inputs
from switchboard.engine.runtime import OnnxDecoder
from switchboard.sampling import sample

log = logging.getLogger(__name__)


@dataclass
class GenerationRequest:
    prompt: list[int]
    max_new_tokens: int
    reused: int = 0                      # prompt[:reused] is covered by ``past``
    past: np.ndarray | None = None       # [layers, 2, H, reused, D]
    temperature: float = 0.0
    top_p: float = 1.0
    priority: int = 2
    seed: int | None = None
    return_cache: bool = False


@dataclass
class GenerationResult:
    tokens: list[int]
    reason: str                          # stop | length | cancelled
    cache: np.ndarray | None             # [layers, 2, H, T, D] for prompt + tokens[:-1]
    queue_ms: float
    prefill_ms: float
    batch_size_at_admission: int


class Sink(Protocol):
    def on_tokens(self, ids: list[int]) -> None: ...
    def on_finish(self, result: GenerationResult) -> None: ...
    def on_error(self, error: Exception) -> None: ...
    def cancelled(self) -> bool: ...


@dataclass
class _Lane:
    running: list["_Sequence"] = field(default_factory=list)
    batch: KVBatch | None = None


@dataclass
class _Sequence:
    request: GenerationRequest
    sink: Sink
    arrival: float
    rng: np.random.Generator
    tokens: list[int] = field(default_factory=list)
    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    admitted_with: int = 0


STAT_KEYS = ("prefill_batches", "prefill_tokens", "prefill_padded_tokens", "decode_steps", "decode_columns",
             "decode_padded_columns", "finished_stop", "finished_length", "finished_cancelled", "busy_s")


class Engine:
    def __init__(self, decoder: OnnxDecoder, max_batch: int, max_waiting: int, stop_ids: set[int],
                 priority_slots: int = 0, preempt_steps: int = 0):
        m = decoder.manifest
        self.decoder = decoder
        self.max_batch = max_batch
        # Rows of the running batch that only priority-1 sequences may take: without preemption
        # a VIP arriving at a full batch would wait for a whole answer to finish.
        self.priority_slots = max(0, min(priority_slots, max_batch - 1))
        self.max_waiting = max_waiting
        self.stop_ids = frozenset(stop_ids)
        self.context_window = m.context_window
        self._shape = (m.num_layers, m.num_kv_heads, m.head_dim)
        self._waiting: list[tuple[int, int, _Sequence]] = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self.preempt_steps = max(0, preempt_steps)
        self._urgent, self._normal = _Lane(), _Lane()   # priority 1 (when preempting); the rest
        self._urgent_streak = 0                         # priority-1 iterations in a row
        self._stop = False
        self._thread: threading.Thread | None = None
        self.stats = Counter({k: 0 for k in STAT_KEYS})  # written by the loop thread only
        self.batch_sizes: Counter = Counter()  # decode batch size -> steps

    # -- submission (any thread) -------------------------------------------------------
    def validate(self, req: GenerationRequest) -> None:
        if not req.prompt:
            raise ValueError("empty prompt")
        if not 0 <= req.reused < len(req.prompt):
            raise ValueError(f"reused={req.reused} must be below the prompt length {len(req.prompt)}")
        if len(req.prompt) >= self.context_window:
            raise ValueError(f"prompt of {len(req.prompt)} tokens does not fit the context window {self.context_window}")
        if req.reused:
            layers, heads, dim = self._shape
            want = (layers, 2, heads, req.reused, dim)
            if req.past is None or tuple(req.past.shape) != want:
                raise ValueError(f"past KV shape {None if req.past is None else req.past.shape} != {want}")

    def has_room(self) -> bool:
        with self._cv:
            return len(self._waiting) < self.max_waiting

    def wait_for_room(self, timeout: float) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: len(self._waiting) < self.max_waiting or self._stop, timeout)

    def submit(self, req: GenerationRequest, sink: Sink) -> None:
        self.validate(req)
        seq = _Sequence(req, sink, time.perf_counter(), np.random.default_rng(req.seed))
        with self._cv:
            heapq.heappush(self._waiting, (req.priority, next(self._order), seq))
            self._cv.notify_all()

    def waiting(self) -> int:
        with self._cv:
            return len(self._waiting)

    def snapshot(self) -> tuple[dict, dict, int, int]:
        """Counters, decode steps per batch size, waiting and running sequences (any thread)."""
        while True:
            try:
                stats, sizes = dict(self.stats), dict(self.batch_sizes)
                break
            except RuntimeError:  # the loop thread added a key while we copied
                continue
        with self._cv:
            return stats, sizes, len(self._waiting), self.running()

    def running(self) -> int:
        return len(self._urgent.running) + len(self._normal.running)

    def _lane(self, priority: int) -> _Lane:
        return self._urgent if priority <= 1 and self.preempt_steps else self._normal

    # -- the loop --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="switchboard-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread:
            self._thread.join(timeout)
        for seq in self._urgent.running + self._normal.running + [s for _, _, s in self._waiting]:
            seq.sink.on_error(RuntimeError("engine stopped"))
        self._waiting, self._urgent, self._normal = [], _Lane(), _Lane()

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._stop or self._waiting or self.running())
                if self._stop:
                    return
            try:
                self.step()
            except Exception as e:  # a runtime failure fails the batch, not the engine
                log.exception("generation step failed")
                for lane in (self._urgent, self._normal):
                    for seq in lane.running:
                        seq.sink.on_error(e)
                    lane.running, lane.batch = [], None

    def step(self) -> None:
        """One iteration on one lane: admit and prefill, or else one decode step."""
        t0 = time.perf_counter()
        lane = self._turn()
        admitted = self._admit(lane)
        if admitted:
            self._prefill(lane, admitted)
        elif lane.running:
            self._decode(lane)
        self._retire(lane)
        self.stats["busy_s"] += time.perf_counter() - t0

    def _turn(self) -> _Lane:
        """The lane this iteration works on."""
        if not self.preempt_steps:
            return self._normal
        with self._cv:
            urgent_waiting = bool(self._waiting) and self._waiting[0][0] <= 1
        idle = not self._urgent.running and (not urgent_waiting or self.running() >= self.max_batch)
        if idle:  # nothing priority 1 could do this iteration
            self._urgent_streak = 0
            return self._normal
        if self._urgent_streak >= self.preempt_steps and (self._normal.running or self._normal_waiting()):
            self._urgent_streak = 0
            return self._normal
        self._urgent_streak += 1
        return self._urgent

    def _normal_waiting(self) -> bool:
        with self._cv:
            return any(p > 1 for p, _, _ in self._waiting)

    def _admit(self, lane: _Lane) -> list[_Sequence]:
        with self._cv:
            out: list[_Sequence] = []
            while self._waiting:
                priority = self._waiting[0][0]
                if self._lane(priority) is not lane:
                    break  # priority 1 waits for its own lane's turn, the next iteration
                limit = self.max_batch if priority <= 1 else self.max_batch - self.priority_slots
                if self.running() + len(out) >= limit:
                    break
                out.append(heapq.heappop(self._waiting)[2])
            if out:
                self._cv.notify_all()  # room in the waiting queue
        now = time.perf_counter()
        for seq in out:
            seq.queue_ms = (now - seq.arrival) * 1000
        return [s for s in out if not self._drop_cancelled(s)]

    def _drop_cancelled(self, seq: _Sequence) -> bool:
        if seq.sink.cancelled():
            seq.sink.on_finish(GenerationResult([], "cancelled", None, seq.queue_ms, 0.0, 0))
            return True
        return False

    def _prefill(self, lane: _Lane, seqs: list[_Sequence]) -> None:
        layers, heads, dim = self._shape
        t0 = time.perf_counter()
        ids, mask, pos, past, next_pos = prefill_inputs(
            [s.request.prompt for s in seqs], [s.request.reused for s in seqs], [s.request.past for s in seqs],
            layers, heads, dim, self.decoder.dtype)
        logits, present = self.decoder.forward(ids, mask, pos, past)
        elapsed = (time.perf_counter() - t0) * 1000
        self.stats["prefill_batches"] += 1
        self.stats["prefill_tokens"] += int(sum(len(s.request.prompt) - s.request.reused for s in seqs))
        self.stats["prefill_padded_tokens"] += int(ids.size)
        for seq in seqs:
            seq.prefill_ms = elapsed
            seq.admitted_with = len(lane.running) + len(seqs)
            seq.request.past = None  # the batch owns the cache now
        new = KVBatch(present, mask, next_pos)
        lane.batch = new if lane.batch is None else lane.batch.merge(new)
        lane.running.extend(seqs)
        self._emit(seqs, logits[:, -1, :])

    def _decode(self, lane: _Lane) -> None:
        b = lane.batch
        tokens = np.asarray([[s.tokens[-1]] for s in lane.running], np.int64)
        mask = np.concatenate([b.mask, np.ones((b.size, 1), b.mask.dtype)], axis=1)
        logits, present = self.decoder.forward(tokens, mask, b.next_pos[:, None], b.kv)
        lane.batch = KVBatch(present, mask, b.next_pos + 1)
        self.stats["decode_steps"] += 1
        self.stats["decode_padded_columns"] += int(mask.size - mask.sum())
        self.stats["decode_columns"] += int(mask.size)
        self.batch_sizes[b.size] += 1
        self._emit(lane.running, logits[:, -1, :])

    def _emit(self, seqs: list[_Sequence], last_logits: np.ndarray) -> None:
        """``last_logits[i]`` is the next-token distribution of ``seqs[i]``."""
        for seq, logits in zip(seqs, last_logits):
            r = seq.request
            token = sample(logits, r.temperature, r.top_p, seq.rng)
            seq.tokens.append(token)
            try:
                seq.sink.on_tokens([token])
            except Exception:  # a broken client must not stop the batch
                log.exception("sink failed; dropping the sequence")
                seq.tokens.append(-1)

    def _finished(self, lane: _Lane, seq: _Sequence, row: int) -> str | None:
        if seq.tokens and seq.tokens[-1] == -1:
            return "error"
        if seq.tokens and seq.tokens[-1] in self.stop_ids:
            return "stop"
        if len(seq.tokens) >= seq.request.max_new_tokens:
            return "length"
        if int(lane.batch.next_pos[row]) >= self.context_window:
            return "length"
        if seq.sink.cancelled():
            return "cancelled"
        return None

    def _retire(self, lane: _Lane) -> None:
        keep = []
        for row, seq in enumerate(lane.running):
            reason = self._finished(lane, seq, row)
            if reason is None:
                keep.append(row)
                continue
            if reason == "error":
                continue
            cache = lane.batch.row_cache(row) if seq.request.return_cache else None
            self.stats["finished_" + reason] += 1
            try:
                seq.sink.on_finish(GenerationResult(seq.tokens, reason, cache, seq.queue_ms, seq.prefill_ms,
                                                    seq.admitted_with))
            except Exception:
                log.exception("sink failed at finish")
        if len(keep) != len(lane.running):
            lane.running = [lane.running[i] for i in keep]
            lane.batch = lane.batch.select(keep) if keep else None

"""The generation loop: priority admission, iteration-level batching, streaming callbacks.

Each iteration admits waiting sequences (lowest priority number first, then arrival order)
while the batch has room (``priority_slots`` rows are kept for priority 1), prefills them
together on top of their cached prefixes, merges them into the running batch, and runs one
decode step for everybody. Finished rows leave between steps. Nothing here knows Triton:
results go to a ``Sink``.
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
                 priority_slots: int = 0):
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
        self._running: list[_Sequence] = []
        self._batch: KVBatch | None = None
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
            return stats, sizes, len(self._waiting), len(self._running)

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
        for seq in self._running + [s for _, _, s in self._waiting]:
            seq.sink.on_error(RuntimeError("engine stopped"))
        self._running, self._waiting, self._batch = [], [], None

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._stop or self._waiting or self._running)
                if self._stop:
                    return
            try:
                self.step()
            except Exception as e:  # a runtime failure fails the batch, not the engine
                log.exception("generation step failed")
                for seq in self._running:
                    seq.sink.on_error(e)
                self._running, self._batch = [], None

    def step(self) -> None:
        """One iteration: admit and prefill, then one decode step for the running batch."""
        t0 = time.perf_counter()
        admitted = self._admit()
        if admitted:
            self._prefill(admitted)
        elif self._running:
            self._decode()
        self._retire()
        self.stats["busy_s"] += time.perf_counter() - t0

    def _admit(self) -> list[_Sequence]:
        with self._cv:
            out: list[_Sequence] = []
            while self._waiting:
                limit = self.max_batch if self._waiting[0][0] <= 1 else self.max_batch - self.priority_slots
                if len(self._running) + len(out) >= limit:
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

    def _prefill(self, seqs: list[_Sequence]) -> None:
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
            seq.admitted_with = len(self._running) + len(seqs)
            seq.request.past = None  # the batch owns the cache now
        new = KVBatch(present, mask, next_pos)
        self._batch = new if self._batch is None else self._batch.merge(new)
        self._running.extend(seqs)
        self._emit(seqs, logits[:, -1, :])

    def _decode(self) -> None:
        b = self._batch
        tokens = np.asarray([[s.tokens[-1]] for s in self._running], np.int64)
        mask = np.concatenate([b.mask, np.ones((b.size, 1), b.mask.dtype)], axis=1)
        logits, present = self.decoder.forward(tokens, mask, b.next_pos[:, None], b.kv)
        self._batch = KVBatch(present, mask, b.next_pos + 1)
        self.stats["decode_steps"] += 1
        self.stats["decode_padded_columns"] += int(mask.size - mask.sum())
        self.stats["decode_columns"] += int(mask.size)
        self.batch_sizes[b.size] += 1
        self._emit(self._running, logits[:, -1, :])

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

    def _finished(self, seq: _Sequence, row: int) -> str | None:
        if seq.tokens and seq.tokens[-1] == -1:
            return "error"
        if seq.tokens and seq.tokens[-1] in self.stop_ids:
            return "stop"
        if len(seq.tokens) >= seq.request.max_new_tokens:
            return "length"
        if int(self._batch.next_pos[row]) >= self.context_window:
            return "length"
        if seq.sink.cancelled():
            return "cancelled"
        return None

    def _retire(self) -> None:
        keep = []
        for row, seq in enumerate(self._running):
            reason = self._finished(seq, row)
            if reason is None:
                keep.append(row)
                continue
            if reason == "error":
                continue
            cache = self._batch.row_cache(row) if seq.request.return_cache else None
            self.stats["finished_" + reason] += 1
            try:
                seq.sink.on_finish(GenerationResult(seq.tokens, reason, cache, seq.queue_ms, seq.prefill_ms,
                                                    seq.admitted_with))
            except Exception:
                log.exception("sink failed at finish")
        if len(keep) != len(self._running):
            self._running = [self._running[i] for i in keep]
            self._batch = self._batch.select(keep) if keep else None

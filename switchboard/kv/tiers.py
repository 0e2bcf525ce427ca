"""The engine's KV blocks in two tiers: the pool's own memory first, Redis shared by replicas.

``lookup`` finds the longest stored prefix of a prompt, block by block: local blocks first,
then the rest of the chain from Redis (only the blocks present, in one pipelined read), each
verified before use; the first missing or bad block ends the reused prefix, and the rest of the
prompt is prefilled. A turn whose blocks are all local moves no KV.

``store`` returns at once: a finished sequence's new blocks go to the local tier the next time
anyone looks (``lookup`` takes pending work first, so the session's next turn always finds
them) and to Redis on a writer thread, which asks Redis which of the sequence's blocks it lacks
(one pipelined ``EXISTS`` per block: no bytes for the ones stored, whoever stored them, and a
block lost to eviction or a restarted Redis is written again) and writes those, in chain order,
each one complete and verified on its own: a reader sees a stored prefix, never a block that
claims more than it holds. The writer's queue is bounded (the oldest work is dropped, counted);
a Redis failure drops the write, never the chat.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from switchboard.kv.blocks import BlockFormat, BlockRejected, chain
from switchboard.kv.local import LocalBlocks
from switchboard.kv.remote import RedisBlocks
from switchboard.wire import CacheMiss

log = logging.getLogger(__name__)


@dataclass
class Reuse:
    tokens: int = 0  # the prompt's first ``tokens`` are covered by ``past``
    past: np.ndarray | None = None  # [layers, 2, kv_heads, tokens, head_dim]
    local_blocks: int = 0
    remote_blocks: int = 0
    miss: CacheMiss | None = None  # why fewer than ``expected`` tokens were found


@dataclass
class _Job:
    ids: list[int]
    kv: np.ndarray  # covers ids
    priority: int


class BlockCache:
    def __init__(
        self,
        fmt: BlockFormat,
        root: bytes,
        local: LocalBlocks,
        remote: RedisBlocks | None = None,
        max_pending: int = 64,
        name: str = "kv",
    ):
        self.fmt, self.root, self.local, self.remote = fmt, root, local, remote
        self.max_pending = max_pending
        self._pending: deque[_Job] = deque()  # local tier not updated yet
        self._writes: deque[list[tuple[bytes, np.ndarray]]] = deque()  # a job's blocks, for Redis
        self._lock = threading.Lock()  # the queues and counters
        self._absorbing = threading.Lock()  # one thread moves pending jobs to the local tier at a time
        self._wake = threading.Condition(self._lock)
        self._stop = False
        self._outstanding = 0  # stored jobs not through both tiers yet (flush waits for 0)
        self.counts: Counter = Counter()
        self._thread = None
        if remote is not None:
            self._thread = threading.Thread(target=self._writer, name=f"{name}-writer", daemon=True)
            self._thread.start()

    # -- reads ----------------------------------------------------------------------------------
    def lookup(self, prompt: list[int], priority: int, expected: int = 0) -> Reuse:
        """The stored prefix of ``prompt`` (at most ``len(prompt) - 1`` tokens: one is left to
        prefill). ``expected``: tokens the session stored, for the miss reason."""
        self._absorb()
        B = self.fmt.tokens
        keys = chain(self.root, prompt[: (len(prompt) - 1) // B * B], B)
        arrays: list[np.ndarray] = []
        for key in keys:
            kv = self.local.get(key, priority)
            if kv is None:
                break
            arrays.append(kv)
        local_n, miss = len(arrays), None
        rest = keys[local_n:]
        if rest and self.remote is not None:
            got, miss = self._fetch(rest, priority)
            arrays.extend(got)
        elif rest:
            miss = CacheMiss.EVICTED
        found = len(arrays)
        expected_blocks = min(expected, len(prompt) - 1) // B
        reuse = Reuse(
            tokens=found * B,
            past=np.concatenate(arrays, axis=3) if arrays else None,
            local_blocks=local_n,
            remote_blocks=found - local_n,
            miss=(miss or CacheMiss.EVICTED) if found < expected_blocks else None,
        )
        with self._lock:
            self.counts["lookups"] += 1
            self.counts["local_hit_blocks"] += local_n
            self.counts["remote_hit_blocks"] += found - local_n
            self.counts["reused_tokens"] += reuse.tokens
            if reuse.miss is not None:
                self.counts[f"miss_{reuse.miss.value}"] += 1
        return reuse

    def _fetch(self, keys: list[bytes], priority: int) -> tuple[list[np.ndarray], CacheMiss | None]:
        present = self.remote.present(keys)
        if present is None:
            return [], CacheMiss.REDIS_UNAVAILABLE
        blobs = self.remote.get(keys[:present]) if present else []
        if blobs is None:
            return [], CacheMiss.REDIS_UNAVAILABLE
        out: list[np.ndarray] = []
        for key, blob in zip(keys, blobs):
            if blob is None:  # evicted between the two calls
                return out, CacheMiss.EVICTED
            try:
                kv = self.fmt.decode(key, blob)
            except BlockRejected as e:
                log.warning("KV block rejected: %s", e)
                return out, CacheMiss.DIGEST_FAILED
            self.local.put(key, kv, priority)
            out.append(kv)
        return out, None if present == len(keys) else CacheMiss.EVICTED

    # -- writes ---------------------------------------------------------------------------------
    def store(self, ids: list[int], kv: np.ndarray, priority: int) -> None:
        """Keep the full blocks of ``kv`` (the KV of ``ids``); returns at once."""
        if kv is None or kv.shape[3] != len(ids) or len(ids) < self.fmt.tokens:
            return
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self._pending.popleft()
                self._done(1)
                self.counts["stores_dropped"] += 1
            self._pending.append(_Job(list(ids), kv, priority))
            self._outstanding += 1
            self._wake.notify_all()

    def _absorb(self) -> None:
        """Pending jobs into the local tier; their blocks not yet in Redis queued for the writer."""
        with self._absorbing:
            while True:
                with self._lock:
                    if not self._pending:
                        return
                    job = self._pending.popleft()
                B = self.fmt.tokens
                keys = chain(self.root, job.ids, B)
                blocks, new = [], 0
                for i, key in enumerate(keys):
                    block = self.local.get(key, job.priority, count=False)
                    if block is None:
                        block = np.ascontiguousarray(job.kv[:, :, :, i * B : (i + 1) * B])
                        self.local.put(key, block, job.priority)
                        new += 1
                    blocks.append((key, block))
                with self._lock:
                    self.counts["stored_blocks"] += new
                    if self.remote is None or not blocks:
                        self._done(1)
                        continue
                    if len(self._writes) >= self.max_pending:
                        self._writes.popleft()
                        self._done(1)
                        self.counts["writes_dropped"] += 1
                    self._writes.append(blocks)
                    self._wake.notify_all()

    def _done(self, n: int) -> None:  # holding self._lock
        self._outstanding -= n
        if self._outstanding <= 0:
            self._wake.notify_all()

    def _writer(self) -> None:
        while True:
            with self._lock:
                while not (self._stop or self._pending or self._writes):
                    self._wake.wait()
                if self._stop:
                    return
            self._absorb()
            with self._lock:
                batch = self._writes.popleft() if self._writes else None
            if batch is None:
                continue
            stored = self.remote.stored([k for k, _ in batch], "write")
            ok = stored is not None
            if ok:
                missing = [(k, a) for (k, a), there in zip(batch, stored) if not there]
                ok = self.remote.put([(k, self.fmt.encode(k, a)) for k, a in missing])
            with self._lock:
                self.counts["writes_ok" if ok else "writes_failed"] += 1
                self._done(1)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every stored block reached its tiers (tests, shutdown)."""
        self._absorb()
        with self._lock:
            return self._wake.wait_for(lambda: self._outstanding <= 0, timeout)

    def snapshot(self) -> dict:
        with self._lock:
            out = dict(self.counts)
        out.update({f"local_{k}": v for k, v in self.local.counts.items()})
        out["local_bytes"] = self.local.nbytes
        if self.remote is not None:
            out.update({f"redis_{k}": v for k, v in self.remote.counts.items()})
        return out

    def close(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self.flush(timeout)
            with self._lock:
                self._stop = True
                self._wake.notify_all()
            self._thread.join(timeout)

"""A pool's metrics on Triton's metrics port: the engine's counters (``Engine.snapshot``), decode
steps per batch size, the waiting and running gauges, and the KV block cache's counters
(``BlockCache.snapshot``), copied once a second by a thread of their own (each update is a round
trip to the server)."""

from __future__ import annotations

import logging
import os

import triton_python_backend_utils as pb_utils

from switchboard.engine.scheduler import STAT_KEYS, Engine
from switchboard.kv.tiers import BlockCache
from switchboard.triton.common import DroppedSpans, Periodic
from switchboard.wire import CacheMiss

log = logging.getLogger("switchboard.engine")

_DESCRIPTIONS = {
    "prefill_batches": "prefill calls (one per admission round)",
    "prefill_tokens": "prompt tokens prefilled (cached prefixes excluded)",
    "prefill_padded_tokens": "prefill input positions computed, left padding included (none in a packed pass)",
    "decode_steps": "decode steps",
    "decode_columns": "attention-mask positions over all decode steps and rows",
    "decode_padded_columns": "masked (wasted) attention-mask positions over all decode steps and rows",
    "finished_stop": "sequences that ended at an end-of-turn token",
    "finished_length": "sequences that ended at max_new_tokens or the context window",
    "finished_cancelled": "sequences cancelled by the client",
    "prefill_chunks": "prefill forward passes (a prompt over prefill_budget takes several)",
    "prefill_s": "seconds in prefill forward passes",
    "decode_s": "seconds in decode forward passes",
    "busy_s": "seconds the engine spent in steps (with lane_threads 2, both lanes' threads: up to 2 a second)",
    "held_back_s": "seconds priority 2's lane waited for priority 1's work (hold_back_ms)",
    "verify_steps": "decode steps that verified drafted tokens (speculative decoding)",
    "drafted_tokens": "tokens drafted and verified by the model (speculative decoding)",
    "accepted_tokens": "drafted tokens the model agreed with: forward passes saved",
    "compactions": "copies of a lane's KV cache to close the holes that rejected drafts left",
    "packed_passes": "forward passes over rows of different lengths that computed no padded position",
    "mixed_passes": "passes that decoded the running rows and prefilled chunks together (their time is in prefill_s)",
}


# KV block counters (BlockCache.snapshot keys) -> (metric family, its labels).
_KV_COUNTERS = {
    "lookups": ("lookups", {}),
    "local_hit_blocks": ("hit_blocks", {"tier": "local"}),
    "remote_hit_blocks": ("hit_blocks", {"tier": "redis"}),
    "reused_tokens": ("reused_tokens", {}),
    "stored_blocks": ("stored_blocks", {}),
    "writes_ok": ("writes", {"outcome": "ok"}),
    "writes_failed": ("writes", {"outcome": "failed"}),
    "writes_dropped": ("writes", {"outcome": "dropped"}),
    "stores_dropped": ("writes", {"outcome": "dropped_before_local"}),
    "local_evicted": ("evicted_blocks", {"tier": "priority2"}),
    "local_evicted_vip": ("evicted_blocks", {"tier": "priority1"}),
    "redis_bytes_read": ("redis_bytes", {"direction": "read"}),
    "redis_bytes_written": ("redis_bytes", {"direction": "written"}),
    "redis_failures": ("redis_failures", {}),
    **{f"miss_{m.value}": ("misses", {"reason": m.value}) for m in CacheMiss},
}
_KV_DESCRIPTIONS = {
    "lookups": "prompts looked up in the KV block cache",
    "hit_blocks": "KV blocks reused, by the tier they came from",
    "reused_tokens": "prompt tokens whose KV came from stored blocks",
    "stored_blocks": "new KV blocks stored",
    "writes": "block writes to Redis, by outcome",
    "evicted_blocks": "blocks evicted from the pool's own cache, by the priority they were kept for",
    "redis_bytes": "KV block bytes moved to and from Redis",
    "redis_failures": "Redis calls that failed (the pool then goes on without Redis for a while)",
    "misses": "prompts that reused fewer tokens than their session stored, by reason",
}


class EngineMetricsPublisher:
    """The engine's counters as Triton custom metrics on the metrics port (Prometheus text),
    next to Triton's own: ``switchboard_engine_<counter>_total{model=...}``, decode steps per
    batch size and the waiting/running gauges; the KV block cache's as ``switchboard_kv_*``.
    A thread copies them once per ``interval``."""

    def __init__(
        self, model: str, version: int, engine: Engine, blocks: BlockCache | None = None, interval: float = 1.0
    ):
        F = pb_utils.MetricFamily
        self.model, self.engine, self.blocks, self.interval = model, engine, blocks, interval
        # Two versions of a pool serve side by side during a rollout, and a reload starts a new
        # instance beside the old one: each has its own series (Triton 2.51 shares a series
        # between processes that use the same labels and drops it when the first one unloads).
        self.labels = {"model": model, "version": str(version), "pid": str(os.getpid())}
        self._families = {
            k: F(name=f"switchboard_engine_{k}_total", description=d, kind=F.COUNTER) for k, d in _DESCRIPTIONS.items()
        }
        self._counters = {k: f.Metric(labels=self.labels) for k, f in self._families.items()}
        self._families["batch"] = F(
            name="switchboard_engine_batch_steps_total", description="decode steps by batch size", kind=F.COUNTER
        )
        self._families["waiting"] = F(
            name="switchboard_engine_waiting", description="sequences waiting for a batch slot", kind=F.GAUGE
        )
        self._families["running"] = F(
            name="switchboard_engine_running", description="sequences in the running batch", kind=F.GAUGE
        )
        self._waiting = self._families["waiting"].Metric(labels=self.labels)
        self._running = self._families["running"].Metric(labels=self.labels)
        self._families.update(
            {
                f"kv_{k}": F(name=f"switchboard_kv_{k}_total", description=d, kind=F.COUNTER)
                for k, d in _KV_DESCRIPTIONS.items()
            }
        )
        self._families["kv_local_bytes"] = F(
            name="switchboard_kv_local_bytes", description="bytes of KV blocks in the pool's own cache", kind=F.GAUGE
        )
        self._kv = {
            key: self._families[f"kv_{family}"].Metric(labels={**self.labels, **labels})
            for key, (family, labels) in _KV_COUNTERS.items()
        }
        self._kv_bytes = self._families["kv_local_bytes"].Metric(labels=self.labels)
        self.dropped_spans = DroppedSpans(model)
        self._kv_last: dict = {}
        self._batch: dict[int, object] = {}
        self._last: dict = {}
        self._last_sizes: dict = {}
        self._ticker = Periodic(self.publish, interval, "switchboard-metrics", log, "publishing engine metrics")

    def publish(self) -> None:
        stats, sizes, waiting, running = self.engine.snapshot()
        for key in STAT_KEYS:
            delta = stats.get(key, 0) - self._last.get(key, 0)
            if delta > 0:
                self._counters[key].increment(float(delta))
        for size, steps in sizes.items():
            delta = steps - self._last_sizes.get(size, 0)
            if delta > 0:
                if size not in self._batch:
                    self._batch[size] = self._families["batch"].Metric(labels={**self.labels, "batch_size": str(size)})
                self._batch[size].increment(float(delta))
        self._last, self._last_sizes = stats, sizes
        self._waiting.set(float(waiting))
        self._running.set(float(running))
        if self.blocks is not None:
            kv = self.blocks.snapshot()
            for key, metric in self._kv.items():
                delta = kv.get(key, 0) - self._kv_last.get(key, 0)
                if delta > 0:
                    metric.increment(float(delta))
            self._kv_last = kv
            self._kv_bytes.set(float(kv.get("local_bytes", 0)))
        self.dropped_spans.publish()

    def close(self) -> None:
        self._ticker.stop()
        # Metrics before their families (the backend requires this order).
        self._counters.clear()
        self._batch.clear()
        self._kv.clear()
        self._waiting = self._running = self._kv_bytes = None
        self._families.clear()
        self.dropped_spans.close()

"""``chat``'s metrics on Triton's metrics port: what ``ChatMetrics`` (switchboard/serving/metrics.py)
accumulated, and the admission queue, published once a second by a thread of their own (each
update is a round trip to the server). Every series a dashboard or an alert names exists from
the start, at zero."""

from __future__ import annotations

import logging
import os

import triton_python_backend_utils as pb_utils

from switchboard.serving.admission import Admission
from switchboard.serving.metrics import METRICS, PREFIX, ChatMetrics
from switchboard.serving.pool_health import PoolHealth
from switchboard.triton.common import Periodic, metric_families
from switchboard.wire import CacheMiss, FallbackReason, Route, SessionStatus

log = logging.getLogger("switchboard.chat")
_SHEDS = {
    "shed_timeout": "queue_timeout",
    "shed_full": "queue_full",
    "shed_forecast": "queue_forecast",
    "shed_breaker": "latency_breaker",
}
# The label values known in advance: their series are created at load, at zero.
_KNOWN = {
    "priority": ("1", "2"),
    "route": (*(r.value for r in Route), "faq"),
    "outcome": ("generated", "fallback", "invalid", "unavailable", "cancelled", "error"),
    "reason": None,  # per family below
    "status": tuple(s.value for s in SessionStatus),
}
_REASONS = {
    "fallbacks_total": tuple(r.value for r in FallbackReason),
    "cache_misses_total": tuple(m.value for m in CacheMiss),
}


class ChatMetricsPublisher:
    def __init__(
        self,
        metrics: ChatMetrics,
        admission: Admission,
        health: PoolHealth,
        pools: tuple,
        versions: tuple[int, ...] = (),
        interval: float = 1.0,
    ):
        F = pb_utils.MetricFamily
        self._known = {**_KNOWN, "version": tuple(str(v) for v in versions)}
        # Every series also carries this process's id: a reload (a rollout step) starts a new chat
        # beside the old one, and Triton 2.51 shares a series between processes that use the same
        # labels, dropping it when the first of them unloads.
        self._pid = (("pid", str(os.getpid())),)
        self.metrics, self.admission, self.health, self.interval = metrics, admission, health, interval
        self._families = metric_families(PREFIX, METRICS)
        self._families["sheds_total"] = F(
            name=PREFIX + "sheds_total",
            description="chats the admission queue answered without a generation slot, by reason",
            kind=F.COUNTER,
        )
        for gauge, doc in (
            ("admission_waiting", "chats waiting in chat's admission queue for a generation slot"),
            ("admission_running", "chats holding a generation slot"),
        ):
            self._families[gauge] = F(name=PREFIX + gauge, description=doc, kind=F.GAUGE)
        self._families["pool_up"] = F(
            name=PREFIX + "pool_up",
            description="1 while chat routes to the pool, 0 while it routes around it (its stub died)",
            kind=F.GAUGE,
        )
        self._pools = {
            pool: self._families["pool_up"].Metric(labels={"pool": pool, **dict(self._pid)}) for pool in pools
        }
        self._series: dict[tuple[str, tuple], object] = {}
        for name, (_, _, labels, _) in METRICS.items():
            for values in self._combinations(name, labels):
                self._metric(name, tuple(zip(labels, values)))
        for reason in _SHEDS.values():
            self._metric("sheds_total", (("reason", reason),))
        self._waiting = self._families["admission_waiting"].Metric(labels=dict(self._pid))
        self._running = self._families["admission_running"].Metric(labels=dict(self._pid))
        self._last_sheds: dict = {}
        self._ticker = Periodic(self.publish, interval, "chat-metrics", log, "publishing chat metrics")

    def _combinations(self, name: str, labels: tuple) -> list[tuple]:
        out = [()]
        for label in labels:
            values = _REASONS.get(name, ()) if label == "reason" else self._known[label]
            out = [(*o, v) for o in out for v in values]
        return out

    def _metric(self, name: str, labels: tuple):
        series = self._series.get((name, labels))
        if series is None:
            buckets = METRICS[name][3] if name in METRICS else None
            kwargs = {"buckets": list(buckets)} if buckets else {}
            series = self._families[name].Metric(labels=dict(labels + self._pid), **kwargs)
            self._series[name, labels] = series
        return series

    def publish(self) -> None:
        counts, observed = self.metrics.drain()
        for (name, labels), n in counts.items():
            self._metric(name, labels).increment(float(n))
        for name, labels, value in observed:
            self._metric(name, labels).observe(value)
        state = self.admission.snapshot()
        for key, reason in _SHEDS.items():
            delta = state[key] - self._last_sheds.get(key, 0)
            if delta > 0:
                self._metric("sheds_total", (("reason", reason),)).increment(float(delta))
        self._last_sheds = state
        self._waiting.set(float(state["waiting"]))
        self._running.set(float(state["running"]))
        for pool, gauge in self._pools.items():
            gauge.set(1.0 if self.health.up(pool) else 0.0)

    def close(self) -> None:
        self._ticker.stop()
        # Metrics before their families (the backend requires this order).
        self._series.clear()
        self._pools.clear()
        self._waiting = self._running = None
        self._families.clear()

"""``chat``'s metrics on Triton's metrics port: what ``ChatMetrics`` (switchboard/serving/metrics.py)
accumulated, the admission queue and the pools' health, published once a second
(tally_metrics.py). Every series a dashboard or an alert names exists from the start, at zero."""

from __future__ import annotations

import logging

from switchboard.serving.admission import Admission
from switchboard.serving.metrics import METRICS, PREFIX, STAGES, TOOLS, ChatMetrics
from switchboard.serving.pool_health import PoolHealth
from switchboard.triton.common import DroppedSpans
from switchboard.triton.tally_metrics import TallyPublisher
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
    "tool": TOOLS,
    "stage": STAGES,
}
_REASONS = {
    "fallbacks_total": tuple(r.value for r in FallbackReason),
    "cache_misses_total": tuple(m.value for m in CacheMiss),
}


class ChatMetricsPublisher(TallyPublisher):
    def __init__(
        self,
        metrics: ChatMetrics,
        admission: Admission,
        health: PoolHealth,
        pools: tuple,
        versions: tuple[int, ...] = (),
        interval: float = 1.0,
    ):
        self.admission, self.health, self.pools = admission, health, pools
        self.dropped_spans = DroppedSpans("chat")
        self._known = {**_KNOWN, "version": tuple(str(v) for v in versions)}
        self._last_sheds: dict = {}
        super().__init__(
            metrics,
            PREFIX,
            METRICS,
            self._values,
            counters={"sheds_total": "chats the admission queue answered without a generation slot, by reason"},
            gauges={
                "admission_waiting": "chats waiting in chat's admission queue for a generation slot",
                "admission_running": "chats holding a generation slot",
                "pool_up": "1 while chat routes to the pool, 0 while it routes around it (its stub died)",
            },
            name="chat",
            log=log,
            interval=interval,
        )

    def _values(self, family: str, label: str) -> tuple:
        return _REASONS.get(family, ()) if label == "reason" else self._known[label]

    def _at_start(self) -> None:
        for pool in self.pools:
            self.series("pool_up", (("pool", pool),))
        for reason in _SHEDS.values():
            self.series("sheds_total", (("reason", reason),))
        self.series("admission_waiting")
        self.series("admission_running")

    def _publish_more(self) -> None:
        state = self.admission.snapshot()
        for key, reason in _SHEDS.items():
            delta = state[key] - self._last_sheds.get(key, 0)
            if delta > 0:
                self.series("sheds_total", (("reason", reason),)).increment(float(delta))
        self._last_sheds = state
        self.series("admission_waiting").set(float(state["waiting"]))
        self.series("admission_running").set(float(state["running"]))
        for pool in self.pools:
            self.series("pool_up", (("pool", pool),)).set(1.0 if self.health.up(pool) else 0.0)
        self.dropped_spans.publish()

    def close(self) -> None:
        super().close()
        self.dropped_spans.close()

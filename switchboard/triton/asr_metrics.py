"""``asr``'s metrics on Triton's metrics port: what ``AsrMetrics`` (switchboard/asr/metrics.py)
accumulated and the audio the pool holds, published once a second by a thread of their own
(each update is a round trip to the server). Every series exists from the start, at zero."""

from __future__ import annotations

import itertools
import logging
import os
from typing import Protocol

from switchboard.asr.metrics import METRICS, OUTCOMES, PREFIX, PRIORITIES, AsrMetrics
from switchboard.triton.common import Periodic, metric_families

log = logging.getLogger("switchboard.asr")
_KNOWN = {"outcome": OUTCOMES, "priority": PRIORITIES}


class Pool(Protocol):
    @property
    def pending_s(self) -> float:
        """The seconds of audio the pool holds now."""
        ...


class AsrMetricsPublisher:
    def __init__(self, metrics: AsrMetrics, pool: Pool, interval: float = 1.0):
        """``pool``: what ``pending_audio_seconds`` reads (``AsrService``)."""
        # The process's id on every series, as chat's (docs/metrics.md: a reload runs beside).
        pid = {"pid": str(os.getpid())}
        self.metrics, self.pool, self.interval = metrics, pool, interval
        pending = "seconds of audio decoded and waiting or being transcribed (max_pending_s refuses beyond)"
        self._families = metric_families(PREFIX, METRICS, {"pending_audio_seconds": pending})
        self._series = {}
        for name, (_, _, labels, buckets) in METRICS.items():
            kwargs = {"buckets": list(buckets)} if buckets else {}
            for values in itertools.product(*(_KNOWN[label] for label in labels)):
                key = tuple(zip(labels, values))
                self._series[name, key] = self._families[name].Metric(labels=dict(key) | pid, **kwargs)
        self._pending = self._families["pending_audio_seconds"].Metric(labels=pid)
        self._ticker = Periodic(self.publish, interval, "asr-metrics", log, "publishing asr metrics")

    def publish(self) -> None:
        counts, observed = self.metrics.drain()
        for key, n in counts.items():
            self._series[key].increment(float(n))
        for name, labels, value in observed:
            self._series[name, labels].observe(value)
        self._pending.set(float(self.pool.pending_s))

    def close(self) -> None:
        self._ticker.stop()
        # Metrics before their families (the backend requires this order).
        self._series.clear()
        self._pending = None
        self._families.clear()

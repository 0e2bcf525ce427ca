"""``asr``'s metrics on Triton's metrics port: what ``AsrMetrics`` (switchboard/asr/metrics.py)
accumulated and the audio the pool holds, published once a second by a thread of their own
(each update is a round trip to the server). Every series exists from the start, at zero."""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable

import triton_python_backend_utils as pb_utils

from switchboard.asr.metrics import METRICS, OUTCOMES, PREFIX, PRIORITIES, AsrMetrics

log = logging.getLogger("switchboard.asr")
_KNOWN = {"outcome": OUTCOMES, "priority": PRIORITIES}


class AsrMetricsPublisher:
    def __init__(self, metrics: AsrMetrics, pending_s: Callable[[], float], interval: float = 1.0):
        """``pending_s``: the seconds of audio the pool holds now (``AsrService.pending_s``)."""
        F = pb_utils.MetricFamily
        # The process's id on every series, as chat's (docs/metrics.md: a reload runs beside).
        pid = {"pid": str(os.getpid())}
        self.metrics, self.pending_s, self.interval = metrics, pending_s, interval
        self._families = {
            name: F(name=PREFIX + name, description=doc, kind=F.HISTOGRAM if kind == "histogram" else F.COUNTER)
            for name, (kind, doc, _, _) in METRICS.items()
        }
        self._families["pending_audio_seconds"] = F(
            name=PREFIX + "pending_audio_seconds",
            description="seconds of audio decoded and waiting or being transcribed (max_pending_s refuses beyond)",
            kind=F.GAUGE,
        )
        self._series = {}
        for name, (_, _, labels, buckets) in METRICS.items():
            kwargs = {"buckets": list(buckets)} if buckets else {}
            for values in itertools.product(*(_KNOWN[label] for label in labels)):
                key = tuple(zip(labels, values))
                self._series[name, key] = self._families[name].Metric(labels=dict(key) | pid, **kwargs)
        self._pending = self._families["pending_audio_seconds"].Metric(labels=pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="asr-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.publish()
            except Exception:  # metrics must never take the model down
                log.exception("publishing asr metrics failed")

    def publish(self) -> None:
        counts, observed = self.metrics.drain()
        for key, n in counts.items():
            self._series[key].increment(float(n))
        for name, labels, value in observed:
            self._series[name, labels].observe(value)
        self._pending.set(float(self.pending_s()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.interval)
        # Metrics before their families (the backend requires this order).
        self._series.clear()
        self._pending = None
        self._families.clear()

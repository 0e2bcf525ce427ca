"""What a ``Tally`` (switchboard/common/tally.py) counted, on Triton's metrics port: the one
publisher of ``chat``'s, ``asr``'s and ``voice_chat``'s metrics (chat_metrics.py, asr_metrics.py
and voice_metrics.py add their gauges, the label values they know and the dropped trace spans).

A thread of its own copies them once per ``interval``: each update is a round trip to the
server. Every series carries this process's id: a reload (a rollout step) starts a new model
beside the old one, and Triton 2.51 shares a series between processes that use the same
labels, dropping it when the first of them unloads. The series whose label values are known in
advance exist from the start, at zero (a dashboard or an alert names them); others are made
when first counted.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterable

import triton_python_backend_utils as pb_utils

from switchboard.common.tally import Tally
from switchboard.triton.common import Periodic, metric_families


class TallyPublisher:
    def __init__(
        self,
        tally: Tally,
        prefix: str,
        metrics: dict,
        known: Callable[[str, str], Iterable[str]],
        *,
        counters: dict[str, str] | None = None,
        gauges: dict[str, str] | None = None,
        name: str,
        log: logging.Logger,
        interval: float = 1.0,
    ):
        """``metrics``: the tally's families (name -> (kind, help, labels, buckets));
        ``known(family, label)``: the label's values known in advance; ``counters`` and
        ``gauges`` (name -> help): families the subclass counts and sets itself."""
        F = pb_utils.MetricFamily
        self.tally, self.metrics, self.interval = tally, metrics, interval
        self._pid = (("pid", str(os.getpid())),)
        self._families = metric_families(prefix, metrics, gauges)
        for family, doc in (counters or {}).items():
            self._families[family] = F(name=prefix + family, description=doc, kind=F.COUNTER)
        self._series: dict[tuple[str, tuple], object] = {}
        for family, (_, _, labels, _) in metrics.items():
            for values in itertools.product(*(known(family, label) for label in labels)):
                self.series(family, tuple(zip(labels, values)))
        self._at_start()
        self._ticker = Periodic(self.publish, interval, f"{name}-metrics", log, f"publishing {name} metrics")

    def _at_start(self) -> None:
        """The subclass's own series made before the first round (none here)."""

    def series(self, family: str, labels: tuple = ()):
        """The series of ``family`` with ``labels`` (and the process's id), made the first time."""
        series = self._series.get((family, labels))
        if series is None:
            buckets = self.metrics[family][3] if family in self.metrics else None
            kwargs = {"buckets": list(buckets)} if buckets else {}
            series = self._families[family].Metric(labels=dict(labels + self._pid), **kwargs)
            self._series[family, labels] = series
        return series

    def publish(self) -> None:
        counts, observed = self.tally.drain()
        for (family, labels), n in counts.items():
            self.series(family, labels).increment(float(n))
        for family, labels, value in observed:
            self.series(family, labels).observe(value)
        self._publish_more()

    def _publish_more(self) -> None:
        """The subclass's gauges and counters of its own, each round (none here)."""

    def close(self) -> None:
        self._ticker.stop()
        # Metrics before their families (the backend requires this order).
        self._series.clear()
        self._families.clear()

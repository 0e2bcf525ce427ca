"""``asr``'s metrics on Triton's metrics port: what ``AsrMetrics`` (switchboard/asr/metrics.py)
accumulated and the audio the pool holds, published once a second (tally_metrics.py). Every
series exists from the start, at zero."""

from __future__ import annotations

import logging
from typing import Protocol

from switchboard.asr.metrics import METRICS, OUTCOMES, PREFIX, PRIORITIES, AsrMetrics
from switchboard.triton.common import DroppedSpans
from switchboard.triton.tally_metrics import TallyPublisher

log = logging.getLogger("switchboard.asr")
_KNOWN = {"outcome": OUTCOMES, "priority": PRIORITIES}
_PENDING = "seconds of audio decoded and waiting or being transcribed (max_pending_s refuses beyond)"


class Pool(Protocol):
    @property
    def pending_s(self) -> float:
        """The seconds of audio the pool holds now."""
        ...


class AsrMetricsPublisher(TallyPublisher):
    def __init__(self, metrics: AsrMetrics, pool: Pool, interval: float = 1.0):
        """``pool``: what ``pending_audio_seconds`` reads (``AsrService``)."""
        self.pool = pool
        self.dropped_spans = DroppedSpans("asr")
        super().__init__(
            metrics,
            PREFIX,
            METRICS,
            lambda family, label: _KNOWN[label],
            gauges={"pending_audio_seconds": _PENDING},
            name="asr",
            log=log,
            interval=interval,
        )

    def _at_start(self) -> None:
        self.series("pending_audio_seconds")

    def _publish_more(self) -> None:
        self.series("pending_audio_seconds").set(float(self.pool.pending_s))
        self.dropped_spans.publish()

    def close(self) -> None:
        super().close()
        self.dropped_spans.close()

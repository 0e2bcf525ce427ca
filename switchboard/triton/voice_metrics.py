"""``voice_chat``'s metrics on Triton's metrics port: what ``VoiceMetrics``
(switchboard/serving/voice.py) counted and the trace spans this process dropped, published once
a second (tally_metrics.py)."""

from __future__ import annotations

import logging

from switchboard.serving.voice import METRICS, PREFIX, VoiceMetrics
from switchboard.triton.common import DroppedSpans
from switchboard.triton.tally_metrics import TallyPublisher

log = logging.getLogger("switchboard.voice_chat")


class VoiceMetricsPublisher(TallyPublisher):
    def __init__(self, metrics: VoiceMetrics, interval: float = 1.0):
        self.dropped_spans = DroppedSpans("voice_chat")
        super().__init__(metrics, PREFIX, METRICS, lambda family, label: (), name="voice", log=log, interval=interval)

    def _publish_more(self) -> None:
        self.dropped_spans.publish()

    def close(self) -> None:
        super().close()
        self.dropped_spans.close()

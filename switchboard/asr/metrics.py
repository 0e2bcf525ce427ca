"""The speech pool's metrics, counted in the process: what each finished ``asr`` request adds
(``AsrMetrics``). The glue (switchboard/triton/asr_metrics.py) publishes them once a second on
Triton's metrics port, as ``chat``'s; the list is in docs/metrics.md."""

from __future__ import annotations

from switchboard.common.tally import Tally
from switchboard.wire import AsrResult

PREFIX = "switchboard_asr_"
OUTCOMES = ("transcribed", "invalid", "unavailable", "shed_breaker", "cancelled", "error")
PRIORITIES = ("1", "2")
# Seconds. A 2 s question takes 0.1-0.3 s alone on a CPU; a 30 s recording several seconds.
DURATION_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)

# name -> (kind, help, label names, buckets)
METRICS = {
    "requests_total": (
        "counter",
        "transcription requests by outcome (transcribed, invalid: refused audio or language, unavailable: the "
        "pool's audio is full, shed_breaker: refused while the latency breaker is open, cancelled, error)",
        ("outcome",),
        None,
    ),
    "audio_seconds_total": ("counter", "seconds of audio transcribed", ("priority",), None),
    "duration_seconds": (
        "histogram",
        "a transcribed request's arrival at asr to its last text",
        ("priority",),
        DURATION_BUCKETS,
    ),
    "queue_seconds": (
        "histogram",
        "a transcribed request's arrival to the first batch that took it",
        ("priority",),
        QUEUE_BUCKETS,
    ),
    "batch_chunks": (
        "histogram",
        "chunks of audio in the (first) batch a transcribed request ran in",
        (),
        BATCH_BUCKETS,
    ),
}


def _priority(priority: int) -> str:
    return "1" if priority == 1 else "2"


class AsrMetrics(Tally):
    """What finished transcriptions add up to since the last ``drain``."""

    def transcribed(self, priority: int, result: AsrResult) -> None:
        where = (("priority", _priority(priority)),)
        with self._lock:
            self._counts["requests_total", (("outcome", "transcribed"),)] += 1
            if result.duration:
                self._counts["audio_seconds_total", where] += result.duration
            if result.asr_ms is not None:
                self._observed.append(("duration_seconds", where, result.asr_ms / 1000))
            if result.queue_ms is not None:
                self._observed.append(("queue_seconds", where, result.queue_ms / 1000))
            if result.batch_size:
                self._observed.append(("batch_chunks", (), float(result.batch_size)))

    def failed(self, outcome: str) -> None:
        """A request that ended otherwise: one of ``OUTCOMES`` but transcribed."""
        if outcome not in OUTCOMES[1:]:
            raise ValueError(f"outcome {outcome!r}: expected one of {', '.join(OUTCOMES[1:])}")
        with self._lock:
            self._counts["requests_total", (("outcome", outcome),)] += 1

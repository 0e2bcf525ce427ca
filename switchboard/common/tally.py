"""Metrics counted in the process, for a publisher thread to copy to the server.

Publishing costs a round trip to the server per update in Triton's Python backend, so a
model's requests only record here (a lock and a few dictionary updates); the glue publishes
what accumulated once a second on Triton's metrics port (switchboard/triton/chat_metrics.py,
switchboard/triton/asr_metrics.py).
"""

from __future__ import annotations

import threading
from collections import Counter


class Tally:
    """Counter increments and histogram observations since the last ``drain``, under a lock: what
    a model's requests record on their way out, for a publisher thread to copy to the server."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: Counter = Counter()  # (name, labels) -> increment
        self._observed: list[tuple[str, tuple, float]] = []  # (name, labels, value)

    def drain(self) -> tuple[Counter, list[tuple[str, tuple, float]]]:
        """(counter increments, histogram observations) since the last call."""
        with self._lock:
            counts, observed = self._counts, self._observed
            self._counts, self._observed = Counter(), []
        return counts, observed

"""What the tests that start a real Prometheus (switchboard.ops.monitor.Monitor) share."""

from __future__ import annotations

import time


def eventually(monitor, expr: str, timeout: float = 30.0) -> list[dict]:
    """``expr``'s result once it has a number (scrapes and rules run on their own clock)."""
    deadline = time.monotonic() + timeout
    while True:
        result = monitor.query(expr)
        if result and result[0]["value"][1] not in ("NaN", "+Inf"):
            return result
        assert time.monotonic() < deadline, f"{expr} had no value within {timeout:.0f} s"
        time.sleep(0.5)

"""Percentiles for every report of the suite, written once.

Two readings, kept apart because figures already published use each: ``percentile`` is numpy's
linear interpolation between the closest ranks (the load drivers, perf_analyzer's export, the
speech bench); ``nearest_rank`` is one of the samples themselves, the one at the rounded rank
(the chaos and soak summaries, where a P99 of a handful of requests should be a request that
happened). ``ratio`` divides two such figures, either of which may be missing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0-100); NaN for no values."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The sample at the rounded rank ``q`` (0-100) of the sorted values; None for no values."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def ratio(a: float, b: float) -> float:
    """a / b, NaN when either is missing or b is 0."""
    if not (isinstance(a, (int, float)) and isinstance(b, (int, float))) or math.isnan(a) or math.isnan(b) or b == 0:
        return float("nan")
    return a / b

"""The next minutes' chat rate from recent traffic: the same minutes last week times the
trend of the last half hour against the same half hour last week.

Inputs are per-minute rates (chats/s, every chat that arrived, FAQ answers included): in
production from Prometheus (``sum(rate(switchboard_chat_requests_total[1m]))`` as range
queries, ``exporter.PrometheusHistory``), in the simulation from the recorded series. A
minute with no sample is None and left out.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

# A trend outside these bounds is more likely a gap in the data than traffic: clamped.
TREND_BOUNDS = (0.5, 4.0)


@dataclass(frozen=True)
class Forecast:
    rate: float  # chats/s expected at most over the horizon (no headroom)
    trend: float  # recent traffic / the same minutes last week (1.0 when unknown)
    source: str  # "last-week x trend", or "recent" when last week has no data


def _values(xs: Sequence[float | None]) -> list[float]:
    return [x for x in xs if x is not None and math.isfinite(x) and x >= 0]


def forecast(recent: Sequence[float | None], last_week: Sequence[float | None]) -> Forecast | None:
    """``recent``: the last n minutes, oldest first. ``last_week``: the same n minutes a week
    ago followed by the horizon's minutes a week ago (n + horizon values). The forecast is the
    largest rate last week over the horizon times the trend; without last week's data, the
    largest recent rate (persistence); without either, None."""
    n = len(recent)
    if len(last_week) < n:
        raise ValueError(f"last_week has {len(last_week)} minutes, fewer than recent's {n}")
    now, then, ahead = _values(recent), _values(last_week[:n]), _values(last_week[n:])
    if ahead and now and then and sum(then) > 0:
        lo, hi = TREND_BOUNDS
        trend = min(hi, max(lo, (sum(now) / len(now)) / (sum(then) / len(then))))
        return Forecast(max(ahead) * trend, trend, "last-week x trend")
    if now:
        return Forecast(max(now), 1.0, "recent")
    return None


WEEK = timedelta(days=7)
WINDOW_MIN = 30  # the recent minutes the trend is measured over


class History(Protocol):
    def rates(self, start: datetime, minutes: int) -> list[float | None]:
        """Per-minute chat rates (chats/s) of the ``minutes`` minutes from ``start``; None
        where there is no sample (the future included)."""


def ahead(
    history: History,
    now: datetime,
    horizon_min: int,
    window_min: int = WINDOW_MIN,
    exclude: Sequence[tuple[datetime, datetime]] = (),
) -> Forecast | None:
    """The largest rate expected over the next ``horizon_min`` minutes (what is ready then must
    be asked for now). Recent minutes inside ``exclude`` (the calendar's promotions) are left
    out of the trend, with their counterparts a week ago: a promotion is no trend."""
    now = _minute(now)
    window = timedelta(minutes=window_min)
    recent = history.rates(now - window, window_min)
    last_week = history.rates(now - WEEK - window, window_min + horizon_min)
    for i in range(window_min):
        t = now - window + timedelta(minutes=i)
        if any(a <= t < b for a, b in exclude):
            recent[i] = last_week[i] = None
    return forecast(recent, last_week)


def baseline(history: History, start: datetime, end: datetime, asks_from: datetime, window_min: int = WINDOW_MIN):
    """The traffic expected from ``start`` to ``end`` without the promotion: the same minutes
    last week times the trend measured before ``asks_from`` (the promotion's start less its
    lead), so the promotion's own traffic does not count twice."""
    asks_from, start = _minute(asks_from), _minute(start)
    window = timedelta(minutes=window_min)
    minutes = max(1, math.ceil((end - start).total_seconds() / 60))
    recent = history.rates(asks_from - window, window_min)
    before = history.rates(asks_from - WEEK - window, window_min)
    during = history.rates(start - WEEK, minutes)
    return forecast(recent, before + during)


def _minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


class SeriesHistory:
    """``forecast.History`` from a recorded per-minute series (CSV ``minute,chats_per_s``, as
    ``simulate`` writes it), blind to minutes not complete at ``now``."""

    def __init__(self, rates: dict[datetime, float], now: Callable[[], datetime]):
        self._rates, self._now = rates, now

    @classmethod
    def load(cls, path: Path, now: Callable[[], datetime]) -> SeriesHistory:
        rates = {}
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    rates[datetime.fromisoformat(row["minute"])] = float(row["chats_per_s"])
                except (KeyError, TypeError, ValueError) as e:
                    raise ValueError(f"{path}: line {len(rates) + 2}: minute,chats_per_s expected ({e})") from e
        return cls(rates, now)

    def rates(self, start: datetime, minutes: int) -> list[float | None]:
        now = self._now()
        out = []
        for k in range(minutes):
            t = start + timedelta(minutes=k)
            out.append(self._rates.get(t) if t + timedelta(minutes=1) <= now else None)
        return out

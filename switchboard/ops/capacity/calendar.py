"""The promotion calendar: when traffic is known to jump, and by how much.

A TOML file (docs/capacity.md)::

    lead_minutes = 10                       # optional: the default lead of every promotion

    [[promotion]]
    name = "flash sale"
    start = 2026-11-11T20:00:00+08:00       # an offset or Z is required
    end = 2026-11-11T20:30:00+08:00
    multiplier = 5.0                        # expected chats/s over the baseline (the forecast)
    # replicas = 10                         # or a replica count, instead of a multiplier
    # lead_minutes = 15                     # this promotion's own lead

A promotion asks for its replicas from ``start - lead - warmup`` until ``end``, so that they are
ready ``lead`` before the start (``warmup``: a pod's time from asked for to ready, the
planner's ``--warmup-s``): seed 001 starts standby nodes 10 minutes ahead, seed 000's
autoscaling fell behind a 5x flash-sale burst. Every error
names the file, the promotion and the field.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

DEFAULT_LEAD_MINUTES = 10.0
_TOP = {"lead_minutes", "promotion"}
_FIELDS = {"name", "start", "end", "multiplier", "replicas", "lead_minutes"}


class CalendarError(ValueError):
    """A calendar that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Promotion:
    name: str
    start: datetime
    end: datetime
    multiplier: float | None = None
    replicas: int | None = None
    lead: timedelta = timedelta(minutes=DEFAULT_LEAD_MINUTES)

    def asks_from(self, warmup: timedelta = timedelta()) -> datetime:
        """When to ask for the replicas so they are ready ``lead`` before the start: ``warmup``
        is how long a pod takes from being asked for to ready."""
        return self.start - self.lead - warmup

    def asks_at(self, t: datetime, warmup: timedelta = timedelta()) -> bool:
        return self.asks_from(warmup) <= t < self.end


@dataclass(frozen=True)
class Calendar:
    promotions: tuple[Promotion, ...] = ()

    def active(self, t: datetime, warmup: timedelta = timedelta()) -> list[Promotion]:
        if t.tzinfo is None:
            raise ValueError("the calendar is read at a time with a UTC offset")
        return [p for p in self.promotions if p.asks_at(t, warmup)]

    def windows(self) -> list[tuple[datetime, datetime]]:
        """The promotions' own times, which the forecast's trend leaves out."""
        return [(p.start, p.end) for p in self.promotions]


def load(path: Path) -> Calendar:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise CalendarError(f"{path}: cannot read the calendar: {e.strerror or e}") from e
    return parse(text, str(path))


def parse(text: str, where: str = "<calendar>") -> Calendar:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CalendarError(f"{where}: not TOML: {e}") from e
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise CalendarError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_TOP))})")
    lead = _minutes(data.get("lead_minutes", DEFAULT_LEAD_MINUTES), f"{where}: lead_minutes")
    entries = data.get("promotion", [])
    if not isinstance(entries, list):
        raise CalendarError(f"{where}: promotion: write each one as a [[promotion]] table")
    promotions = [_promotion(entry, lead, f"{where}: promotion {i + 1}") for i, entry in enumerate(entries)]
    names = [p.name for p in promotions]
    for name in names:
        if names.count(name) > 1:
            raise CalendarError(f"{where}: promotion name {name!r} is used twice")
    return Calendar(tuple(sorted(promotions, key=lambda p: p.start)))


def _promotion(entry: object, default_lead: timedelta, where: str) -> Promotion:
    if not isinstance(entry, dict):
        raise CalendarError(f"{where}: a [[promotion]] table is expected")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise CalendarError(f"{where}: name: a non-empty string is required")
    where = f"{where} ({name})"
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise CalendarError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))})")
    start, end = _time(entry, "start", where), _time(entry, "end", where)
    if end <= start:
        raise CalendarError(f"{where}: end {end.isoformat()} is not after start {start.isoformat()}")
    has_multiplier, has_replicas = "multiplier" in entry, "replicas" in entry
    if has_multiplier == has_replicas:
        raise CalendarError(f"{where}: give exactly one of multiplier (x the baseline) and replicas")
    multiplier = replicas = None
    if has_multiplier:
        multiplier = entry["multiplier"]
        if isinstance(multiplier, bool) or not isinstance(multiplier, int | float) or not 0 < multiplier <= 100:
            raise CalendarError(f"{where}: multiplier: a number in (0, 100] is required, not {multiplier!r}")
        multiplier = float(multiplier)
    else:
        replicas = entry["replicas"]
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise CalendarError(f"{where}: replicas: a whole number >= 1 is required, not {replicas!r}")
    lead = _minutes(entry["lead_minutes"], f"{where}: lead_minutes") if "lead_minutes" in entry else default_lead
    return Promotion(name, start, end, multiplier, replicas, lead)


def _time(entry: dict, key: str, where: str) -> datetime:
    if key not in entry:
        raise CalendarError(f"{where}: {key} is required (e.g. 2026-11-11T20:00:00+08:00)")
    value = entry[key]
    if not isinstance(value, datetime):
        raise CalendarError(f"{where}: {key}: a TOML date-time is required (unquoted), not {value!r}")
    if value.tzinfo is None:
        raise CalendarError(f"{where}: {key}: give a UTC offset ({value.isoformat()}+08:00 or Z)")
    return value


def _minutes(value: object, where: str) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 24 * 60:
        raise CalendarError(f"{where}: minutes in [0, 1440] are required, not {value!r}")
    return timedelta(minutes=value)

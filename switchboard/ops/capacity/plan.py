"""Desired replicas = max(calendar, forecast, floor), capped at a ceiling.

A replica's capacity (chats/s it generates before `chat` answers the rest from the FAQ) is a
measurement: ``make chaos``'s 5x burst on the 2-core development machine, where one replica
generated 1745 chats in 30 s, about 58 chats/s (docs/reliability.md, 2026-11-25). Measure your
own pods (``make chaos``) and set ``per_replica``. ``headroom`` sizes for the forecast rate
times it, so pods run at 1/headroom of their capacity at the expected rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from switchboard.ops.capacity.calendar import Calendar
from switchboard.ops.capacity.forecast import Forecast

PER_REPLICA_CHATS_S = 58.0  # make chaos, 2026-11-25: 1745 generated in the 30 s burst, one replica


@dataclass(frozen=True)
class Sizing:
    per_replica: float = PER_REPLICA_CHATS_S
    headroom: float = 1.25
    floor: int = 2  # deploy/k8s/hpa.yaml's minReplicas
    ceiling: int = 12  # and maxReplicas
    # From asked for to ready: a scrape of the gauge, two HPA syncs of 15 s (hpa.yaml takes the
    # floor to the ceiling in two steps), the pod's start (seed 000: 40 s)
    warmup_s: float = 90.0

    def __post_init__(self):
        if not self.per_replica > 0:
            raise ValueError(f"per_replica: chats/s > 0 is required, not {self.per_replica}")
        if not self.headroom >= 1:
            raise ValueError(f"headroom: >= 1 is required, not {self.headroom}")
        if not self.warmup_s >= 0:
            raise ValueError(f"warmup_s: seconds >= 0 are required, not {self.warmup_s}")
        if not 1 <= self.floor <= self.ceiling:
            raise ValueError(f"floor {self.floor} and ceiling {self.ceiling}: 1 <= floor <= ceiling is required")

    @property
    def warmup(self) -> timedelta:
        return timedelta(seconds=self.warmup_s)

    def replicas_for(self, rate: float) -> int:
        """Replicas that serve ``rate`` chats/s at 1/headroom of their capacity."""
        return max(1, math.ceil(rate * self.headroom / self.per_replica - 1e-9))


@dataclass(frozen=True)
class Plan:
    desired: int
    components: dict[str, int] = field(default_factory=dict)  # source -> replicas it asks for
    promotions: tuple[str, ...] = ()  # the calendar's entries asking now
    forecast: Forecast | None = None

    def reason(self) -> str:
        asks = ", ".join(f"{k} {v}" for k, v in self.components.items())
        return f"{self.desired} replicas ({asks})"


def plan(
    t: datetime,
    calendar: Calendar,
    fc: Forecast | None,
    sizing: Sizing,
    baselines: Mapping[str, float | None] | None = None,
) -> Plan:
    """The replicas wanted at ``t``. A promotion's multiplier applies to its baseline, the
    traffic expected over it without it (``baselines[name]``, chats/s: ``forecast.baseline``);
    without one it asks for nothing (the exporter says so)."""
    components = {"floor": sizing.floor}
    if fc is not None:
        components["forecast"] = sizing.replicas_for(fc.rate)
    active = calendar.active(t, sizing.warmup)
    asks = []
    for p in active:
        base = (baselines or {}).get(p.name)
        if p.replicas is not None:
            asks.append(p.replicas)
        elif base is not None:
            asks.append(sizing.replicas_for(base * p.multiplier))
    if asks:
        components["calendar"] = max(asks)
    desired = min(sizing.ceiling, max(components.values()))
    return Plan(desired, components, tuple(p.name for p in active), fc)

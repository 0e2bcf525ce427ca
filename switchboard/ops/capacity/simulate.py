"""A recorded Double-11-shaped day, served by a simulated Deployment: the reactive HPA alone
(deploy/k8s/hpa.yaml's Pods metrics) against the same HPA with the capacity plan as its
External metric (calendar + forecast).

The day, generated deterministically (``recorded_day``): last week's ordinary traffic follows
``ANCHORS`` (chats/s at each hour, linear in between) with 5% seeded noise; this week runs
``growth`` above it (the promotion week) and two promotions jump on top of that, each to its
peak multiplier in the minute it starts, then falling linearly to its settle multiplier at its
end (``SURGES``: the midnight opening, and seed 000's 5x flash sale at 20:00). The calendar
the planner reads (deploy/capacity/double-11.toml) knows the promotions' times and expects
their peak multipliers; it knows nothing of the growth, which the forecast has to see.

The model (``Simulation``), every ``STEP_S`` seconds: pods become ready ``pod_start_s`` after
the HPA adds them; ready pods generate up to ``per_replica`` chats/s each and `chat` answers the
rest from the FAQ at once (docs/reliability.md); every 15 s the HPA syncs. Its Pods metrics (the
admission queue, TTFT) are modelled as one: each ready pod's load over its capacity, averaged
over the last 30 s, against a target of 1.0 (a queue forms when a pod is full), capped at
``saturation`` times the target because under overload `chat` sheds to the FAQ and the queue
and TTFT stop growing. With the plan, the HPA also reads the desired replica count as an
External metric (AverageValue 1), computed from the calendar and the per-minute history of
complete minutes only (no look at the future).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from switchboard.ops.capacity import forecast as fc
from switchboard.ops.capacity.calendar import Calendar
from switchboard.ops.capacity.hpa import SYNC_S, Hpa, Spec, external_average_replicas, pods_metric_replicas
from switchboard.ops.capacity.plan import PER_REPLICA_CHATS_S, Sizing, plan

TZ = timezone(timedelta(hours=8))
DAY = datetime(2026, 11, 11, tzinfo=TZ)
STEP_S = 5.0
# Last week's ordinary day, chats/s at each hour (hour 24 = the next midnight): a night trough,
# a working-day plateau, the evening peak at 21:00.
ANCHORS = (40, 28, 20, 16, 15, 16, 20, 32, 50, 66, 75, 80, 82, 78, 76, 76, 75, 72, 74, 85, 96, 100, 88, 62, 40)


@dataclass(frozen=True)
class Surge:
    name: str
    start: datetime
    end: datetime
    peak: float  # x the day's traffic in the first minute
    settle: float  # x at the end, linearly in between

    def factor(self, t: datetime) -> float:
        if not self.start <= t < self.end:
            return 1.0
        x = (t - self.start) / (self.end - self.start)
        return self.peak + (self.settle - self.peak) * x


SURGES = (
    Surge("opening", DAY, DAY + timedelta(hours=1), 4.0, 1.5),
    Surge("flash sale", DAY + timedelta(hours=20), DAY + timedelta(hours=20, minutes=30), 5.0, 2.0),
)


@dataclass(frozen=True)
class Day:
    """Per-minute chat rates from ``start``: the recorded history the simulation replays."""

    start: datetime
    rates: tuple[float, ...]

    @classmethod
    def from_csv(cls, path: Path) -> Day:
        """A recorded series (``minute,chats_per_s``, one row a minute, in order, no gaps), such as
        a past promotion's export from Prometheus, to replay instead of the generated day."""
        import csv

        minutes, rates = [], []
        with open(path, newline="") as f:
            for n, row in enumerate(csv.DictReader(f), start=2):
                try:
                    t, r = datetime.fromisoformat(row["minute"]), float(row["chats_per_s"])
                except (KeyError, TypeError, ValueError) as e:
                    raise ValueError(f"{path}: line {n}: minute,chats_per_s expected ({e})") from e
                if t.tzinfo is None:
                    raise ValueError(f"{path}: line {n}: {row['minute']} has no UTC offset")
                if minutes and t - minutes[-1] != timedelta(minutes=1):
                    raise ValueError(f"{path}: line {n}: {t.isoformat()} does not follow the previous minute")
                if not r >= 0:
                    raise ValueError(f"{path}: line {n}: a rate >= 0 is required, not {r}")
                minutes.append(t)
                rates.append(r)
        if not minutes:
            raise ValueError(f"{path}: no rows")
        return cls(minutes[0], tuple(rates))

    @property
    def end(self) -> datetime:
        return self.start + timedelta(minutes=len(self.rates))

    def write_csv(self, path: Path) -> None:
        """``minute,chats_per_s``: what ``forecast.SeriesHistory.load`` reads."""
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = (f"{(self.start + timedelta(minutes=k)).isoformat()},{r}" for k, r in enumerate(self.rates))
        path.write_text("minute,chats_per_s\n" + "\n".join(rows) + "\n")

    def rate_at(self, t: datetime) -> float:
        i = int((t - self.start).total_seconds() // 60)
        return self.rates[i] if 0 <= i < len(self.rates) else 0.0


def ordinary(t: datetime) -> float:
    h = t.hour + t.minute / 60
    i = int(h)
    return ANCHORS[i] + (ANCHORS[i + 1] - ANCHORS[i]) * (h - i)


def recorded_day(growth: float = 1.3, noise: float = 0.05, seed: int = 11, surges: Sequence[Surge] = SURGES) -> Day:
    """Nov. 3 (a week before the eve) to the end of Nov. 11: ordinary days until Nov. 10,
    ``growth`` times above them from Nov. 10 (the promotion week), the surges on top."""
    rng = random.Random(seed)
    start, end = DAY - timedelta(days=8), DAY + timedelta(days=1)
    rates, t = [], start
    while t < end:
        r = ordinary(t)
        if t >= DAY - timedelta(days=1):
            r *= growth
            for s in surges:
                r *= s.factor(t)
        rates.append(round(r * (1 + rng.uniform(-noise, noise)), 3))
        t += timedelta(minutes=1)
    return Day(start, tuple(rates))


@dataclass
class Trace:
    """Per step: time, chats/s arriving, Deployment replicas, ready pods, FAQ chats/s, the plan."""

    t: list[datetime] = field(default_factory=list)
    demand: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    faq: list[float] = field(default_factory=list)
    planned: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Settings:
    per_replica: float = PER_REPLICA_CHATS_S
    pod_start_s: float = 40.0  # seed 000's cold start; ours, the server alone: 3.7 s (docs/kubernetes.md)
    target: float = 1.0
    saturation: float = 2.0
    metric_window_s: float = 30.0
    headroom: float = 1.25
    horizon_min: int = 0  # the forecast's look-ahead (0: lead + warm-up, rounded up)
    use_forecast: bool = True  # False: the calendar alone (its baselines still come from the history)


class Simulation:
    def __init__(self, day: Day, spec: Spec, settings: Settings, calendar: Calendar | None):
        self.day, self.spec, self.s, self.calendar = day, spec, settings, calendar
        # asked for to ready, at worst: a scrape of the gauge, two HPA syncs (hpa.yaml's policies
        # take the floor to the ceiling in two steps: 2 -> 6 -> 12) and the pod's start
        warmup = settings.pod_start_s + 2 * SYNC_S + STEP_S
        self.sizing = Sizing(settings.per_replica, settings.headroom, spec.min_replicas, spec.max_replicas, warmup)
        self.now = day.start
        rates = {day.start + timedelta(minutes=k): r for k, r in enumerate(day.rates)}
        self.history = fc.SeriesHistory(rates, lambda: self.now)
        lead = max((p.lead for p in calendar.promotions), default=timedelta(minutes=10)) if calendar else timedelta()
        self.horizon_min = settings.horizon_min or math.ceil((lead.total_seconds() + warmup) / 60)

    def planned(self, t: datetime) -> int:
        self.now = t
        ahead = (
            fc.ahead(self.history, t, self.horizon_min, exclude=self.calendar.windows())
            if self.s.use_forecast
            else None
        )
        baselines = {}
        for p in self.calendar.active(t, self.sizing.warmup):
            b = fc.baseline(self.history, p.start, p.end, p.asks_from(self.sizing.warmup))
            baselines[p.name] = b.rate if b else None
        return plan(t, self.calendar, ahead, self.sizing, baselines).desired

    def run(self, start: datetime, end: datetime) -> Trace:
        hpa, trace = Hpa(self.spec), Trace()
        replicas = self.spec.min_replicas
        ready_at = [start - timedelta(hours=1)] * replicas  # warm at the start
        loads: list[float] = []
        window = max(1, int(self.s.metric_window_s / STEP_S))
        every = max(1, int(SYNC_S / STEP_S))
        planned, t, k = 0, start, 0
        while t < end:
            if k % every == 0:
                ready = sum(1 for r in ready_at if r <= t)
                ratio = min(self.s.saturation, (sum(loads[-window:]) / max(1, len(loads[-window:]))) / self.s.target)
                asks = [pods_metric_replicas(replicas, ready, ratio)]
                if self.calendar is not None:
                    planned = self.planned(t)
                    asks.append(external_average_replicas(replicas, planned, 1.0))
                new = hpa.sync((t - start).total_seconds(), replicas, asks)
                if new > replicas:
                    ready_at += [t + timedelta(seconds=self.s.pod_start_s)] * (new - replicas)
                elif new < replicas:  # the controller deletes pods not ready first, then the newest
                    ready_at = sorted(ready_at)[:new]
                replicas = new
            demand = self.day.rate_at(t)
            ready = sum(1 for r in ready_at if r <= t)
            capacity = ready * self.s.per_replica
            loads.append(demand / capacity if capacity else self.s.saturation)
            trace.t.append(t)
            trace.demand.append(demand)
            trace.replicas.append(replicas)
            trace.ready.append(ready)
            trace.faq.append(max(0.0, demand - capacity))
            trace.planned.append(planned)
            t += timedelta(seconds=STEP_S)
            k += 1
        return trace


@dataclass(frozen=True)
class Peak:
    name: str
    start: datetime
    at: datetime  # the promotion's busiest minute
    rate: float
    need: int  # pods that serve that minute
    lead_min: float | None  # minutes those pods were ready before the start (< 0: after; None: never)
    faq_first_10min: float  # FAQ share of the promotion's first 10 minutes
    faq_busiest_minute: float


def _share(trace: Trace, a: datetime, b: datetime) -> float:
    idx = [i for i, t in enumerate(trace.t) if a <= t < b]
    demand = sum(trace.demand[i] for i in idx)
    return sum(trace.faq[i] for i in idx) / demand if demand else 0.0


def peaks(trace: Trace, calendar: Calendar, per_replica: float) -> list[Peak]:
    """Per promotion: how many minutes before its start the pods its busiest minute needs were
    ready (and stayed ready until then), and the FAQ's share as it began."""
    out = []
    for p in calendar.promotions:
        idx = [i for i, t in enumerate(trace.t) if p.start <= t < p.end]
        if not idx:
            continue
        top = max(idx, key=lambda i: trace.demand[i])
        need = math.ceil(trace.demand[top] / per_replica)
        first = idx[0]
        if trace.ready[first] >= need:
            while first > 0 and trace.ready[first - 1] >= need:
                first -= 1
            lead = (p.start - trace.t[first]).total_seconds() / 60
        else:
            after = next((i for i in range(first, len(trace.t)) if trace.ready[i] >= need), None)
            lead = None if after is None else -(trace.t[after] - p.start).total_seconds() / 60
        at = trace.t[top].replace(second=0)
        first_10 = _share(trace, p.start, p.start + timedelta(minutes=10))
        out.append(
            Peak(
                p.name,
                p.start,
                at,
                trace.demand[top],
                need,
                lead,
                first_10,
                _share(trace, at, at + timedelta(minutes=1)),
            )
        )
    return out


@dataclass(frozen=True)
class Summary:
    policy: str
    peaks: list[Peak]
    faq_day: float
    faq_chats_day: float
    replica_hours: float


def summarize(policy: str, trace: Trace, calendar: Calendar, per_replica: float, a: datetime, b: datetime) -> Summary:
    idx = [i for i, t in enumerate(trace.t) if a <= t < b]
    faq = sum(trace.faq[i] for i in idx) * STEP_S
    hours = sum(trace.replicas[i] for i in idx) * STEP_S / 3600
    return Summary(policy, peaks(trace, calendar, per_replica), _share(trace, a, b), faq, hours)


def table(summaries: Sequence[Summary]) -> str:
    head = (
        "| policy | promotion (start) | busiest minute: chats/s, pods needed | those pods ready "
        "| FAQ share: first 10 min, busiest minute | FAQ share, day | FAQ answers, day | replica-hours, day |"
    )
    lines = [head, "|" + "---|" * 8]
    for s in summaries:
        for p in s.peaks:
            if p.lead_min is None:
                lead = "never"
            elif p.lead_min >= 0:
                lead = f"{p.lead_min:.1f} min before the start"
            else:
                lead = f"{-p.lead_min:.1f} min after the start"
            lines.append(
                f"| {s.policy} | {p.name} ({p.start:%H:%M}) | {p.at:%H:%M}: {p.rate:.0f}, {p.need} | {lead} "
                f"| {p.faq_first_10min:.1%}, {p.faq_busiest_minute:.1%} | {s.faq_day:.2%} | {s.faq_chats_day:,.0f} "
                f"| {s.replica_hours:.1f} |"
            )
    return "\n".join(lines) + "\n"


def plot(traces: dict[str, Trace], calendar: Calendar, per_replica: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    day = report_day(calendar)
    windows = [(day - timedelta(hours=1), day + timedelta(days=1), f"{day:%b. %d}, the whole day")]
    windows += [(p.start - timedelta(minutes=20), p.start + timedelta(minutes=40), p.name) for p in calendar.promotions]
    fig, axes = plt.subplots(len(windows), 1, figsize=(11, 3.6 * len(windows)))
    colors = {"reactive HPA": "tab:red", "calendar + HPA": "tab:orange", "calendar + forecast + HPA": "tab:blue"}
    for ax, (a, b, title) in zip(axes, windows):
        any_trace = next(iter(traces.values()))
        idx = [i for i, t in enumerate(any_trace.t) if a <= t < b]
        xs = [any_trace.t[i].replace(tzinfo=None) for i in idx]
        ax.plot(xs, [any_trace.demand[i] for i in idx], color="black", lw=1, label="chats/s arriving")
        for name, tr in traces.items():
            c = colors.get(name)
            style = "--" if name == "calendar + HPA" else "-"
            ready = [tr.ready[i] * per_replica for i in idx]
            ax.plot(xs, ready, color=c, ls=style, lw=1.5, label=f"{name}: ready capacity")
            ax.fill_between(xs, 0, [tr.faq[i] for i in idx], color=c, alpha=0.25, label=f"{name}: FAQ answers/s")
        for p in calendar.promotions:
            if a <= p.start < b:
                ax.axvline((p.start - p.lead).replace(tzinfo=None), color="grey", ls=":", lw=1)
                ax.axvline(p.start.replace(tzinfo=None), color="grey", ls="--", lw=1)
        ax.set_title(f"{title} (+08:00; dashed: promotion start, dotted: start - lead)")
        ax.set_ylabel("chats/s")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report_day(calendar: Calendar) -> datetime:
    """Midnight of the day of the calendar's first promotion, in its own offset (the generated
    day's Nov. 11 for an empty calendar)."""
    if not calendar.promotions:
        return DAY
    first = calendar.promotions[0].start
    return first.replace(hour=0, minute=0, second=0, microsecond=0)


def compare(calendar: Calendar, spec: Spec, settings: Settings, day: Day | None = None) -> dict:
    """The three policies over the calendar's first promotion's day (from 22:00 the eve, so the
    HPA has settled): traces and summaries. The history must reach a week and a half hour back."""
    day = day or recorded_day()
    a = report_day(calendar)
    start, b = a - timedelta(hours=2), a + timedelta(days=1)
    if day.start > start - fc.WEEK - timedelta(minutes=fc.WINDOW_MIN) or day.end < b:
        raise ValueError(
            f"the series covers {day.start.isoformat()} to {day.end.isoformat()}: simulating "
            f"{a:%Y-%m-%d} needs {(start - fc.WEEK - timedelta(minutes=fc.WINDOW_MIN)).isoformat()} to {b.isoformat()}"
        )
    calendar_only = dataclasses.replace(settings, use_forecast=False)
    traces = {
        "reactive HPA": Simulation(day, spec, settings, None).run(start, b),
        "calendar + HPA": Simulation(day, spec, calendar_only, calendar).run(start, b),
        "calendar + forecast + HPA": Simulation(day, spec, settings, calendar).run(start, b),
    }
    summaries = [summarize(name, tr, calendar, settings.per_replica, a, b) for name, tr in traces.items()]
    return {"day": day, "traces": traces, "summaries": summaries}

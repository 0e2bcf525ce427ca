"""``python -m switchboard.ops.capacity check|plan|serve|record|simulate``: capacity before the burst.

- ``check CALENDAR``: validate a promotion calendar and list when each promotion asks.
- ``plan``: the desired replicas at a time (now), and why; ``--local`` compares it with what
  ``make serve REPLICAS=n`` runs and prints the command that would get there (a dry run);
  ``--apply`` scales the running stack to it (``launch scale``: replicas started and taken into
  HAProxy, or drained and stopped), once or ``--every-s`` seconds.
- ``serve``: the exporter the HPA's External metric reads (switchboard_capacity_desired_replicas).
- ``record``: the chat rate from Prometheus as a per-minute CSV, for ``simulate --series``.
- ``simulate``: a Double-11-shaped day, reactive HPA alone against calendar (+ forecast) + HPA:
  a markdown table and a plot (``make capacity-sim``; docs/capacity.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from switchboard import paths
from switchboard.ops import launch
from switchboard.ops.balancer import SLOTS
from switchboard.ops.capacity import calendar as cal
from switchboard.ops.capacity.exporter import DEMAND_QUERY, Exporter, HistoryError, Planner, PrometheusHistory
from switchboard.ops.capacity.forecast import SeriesHistory
from switchboard.ops.capacity.plan import PER_REPLICA_CHATS_S, Sizing
from switchboard.ops.process import pid_file

PORT = 9400
WARMUP_S = Sizing.warmup_s


def _time(text: str) -> datetime:
    try:
        t = datetime.fromisoformat(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not an ISO date-time: {text!r}") from e
    if t.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give a UTC offset: {text}+08:00 or {text}Z")
    return t


def _positive(kind):
    def read(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"> 0 is required, not {text}")
        return value

    return read


def _sizing_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--per-replica",
        type=_positive(float),
        default=PER_REPLICA_CHATS_S,
        help=f"chats/s one replica generates (default {PER_REPLICA_CHATS_S:g}: make chaos's 5x burst, one replica)",
    )
    p.add_argument("--headroom", type=float, default=1.25, help="size for the forecast rate times this (default 1.25)")
    p.add_argument("--floor", type=int, default=2, help="fewest replicas (default 2: hpa.yaml's minReplicas)")
    p.add_argument("--ceiling", type=int, default=12, help="most replicas (default 12: hpa.yaml's maxReplicas)")
    p.add_argument(
        "--warmup-s",
        type=float,
        default=WARMUP_S,
        help="seconds from asking for a pod to its readiness: a scrape, two HPA syncs, the pod's start "
        f"(default {WARMUP_S:g})",
    )


def _planner_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calendar", type=Path, required=True, help="the promotion calendar (TOML)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prometheus", help="Prometheus' URL: the chat rate history for the forecast")
    source.add_argument("--series", type=Path, help="a recorded per-minute series (CSV minute,chats_per_s) instead")
    p.add_argument(
        "--baseline-chats-per-s",
        type=float,
        default=None,
        help="what a promotion's multiplier multiplies when there is no history (default: none)",
    )
    _sizing_arguments(p)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m switchboard.ops.capacity", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate a promotion calendar")
    check.add_argument("calendar", type=Path)
    check.add_argument("--warmup-s", type=float, default=WARMUP_S, help=f"as for plan (default {WARMUP_S:g})")
    one = sub.add_parser("plan", help="the desired replicas at a time, and why")
    _planner_arguments(one)
    one.add_argument("--at", type=_time, default=None, help="ISO date-time with offset (default: now)")
    one.add_argument(
        "--local",
        action="store_true",
        help="compare with the replicas `make serve` runs (build/run) and print the command (dry run)",
    )
    one.add_argument(
        "--apply",
        action="store_true",
        help="scale the running `make serve REPLICAS=n` (n >= 2) to the plan, live (implies --local)",
    )
    one.add_argument(
        "--every-s",
        type=float,
        default=0.0,
        help="with --apply: plan and apply again every this many seconds until interrupted (default 0: once)",
    )
    one.add_argument("--run-dir", type=Path, default=paths.RUN)
    serve = sub.add_parser("serve", help="serve the plan as Prometheus gauges for the HPA")
    _planner_arguments(serve)
    serve.add_argument("--port", type=int, default=PORT, help=f"HTTP port of /metrics and /healthz (default {PORT})")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    serve.add_argument("--refresh-s", type=float, default=15.0, help="seconds a computed plan is served (default 15)")
    rec = sub.add_parser("record", help="export the chat rate from Prometheus as a series simulate --series replays")
    rec.add_argument("--prometheus", required=True, help="Prometheus' URL")
    rec.add_argument("--start", type=_time, required=True, help="first minute, ISO date-time with offset")
    rec.add_argument("--end", type=_time, required=True, help="end (excluded), ISO date-time with offset")
    rec.add_argument("--query", default=DEMAND_QUERY, help=f"the rate's PromQL (default {DEMAND_QUERY})")
    rec.add_argument("--out", type=Path, required=True, help="the CSV to write (minute,chats_per_s)")
    sim = sub.add_parser("simulate", help="the Double-11 day: a table and a plot")
    sim.add_argument("--calendar", type=Path, default=paths.ROOT / "deploy" / "capacity" / "double-11.toml")
    sim.add_argument("--hpa", type=Path, default=paths.K8S / "hpa.yaml", help="the HPA manifest (its limits, behavior)")
    sim.add_argument("--out", type=Path, default=paths.BUILD / "capacity")
    sim.add_argument(
        "--pod-start-s", type=float, default=40.0, help="a new pod's time to ready (default 40: seed 000's cold start)"
    )
    sim.add_argument("--per-replica", type=_positive(float), default=PER_REPLICA_CHATS_S)
    sim.add_argument("--headroom", type=float, default=1.25)
    sim.add_argument("--growth", type=float, default=1.3, help="this week's traffic over last week's (default 1.3)")
    sim.add_argument(
        "--series",
        type=Path,
        default=None,
        help="replay a recorded per-minute series (CSV minute,chats_per_s; 8 days up to the end of the "
        "calendar's first promotion's day) instead of the generated Double-11 day",
    )
    return p


def _planner(args: argparse.Namespace) -> Planner:
    calendar = cal.load(args.calendar)
    sizing = Sizing(args.per_replica, args.headroom, args.floor, args.ceiling, args.warmup_s)
    history = None
    if args.prometheus:
        history = PrometheusHistory(args.prometheus)
    elif args.series:
        at = getattr(args, "at", None)
        history = SeriesHistory.load(args.series, lambda: at or datetime.now(timezone.utc))
    return Planner(calendar, sizing, history, args.baseline_chats_per_s)


def _check(args: argparse.Namespace) -> int:
    calendar = cal.load(args.calendar)
    warmup = timedelta(seconds=args.warmup_s)
    print(f"{args.calendar}: {len(calendar.promotions)} promotions")
    for p in calendar.promotions:
        asks = f"x{p.multiplier:g} the baseline" if p.multiplier is not None else f"{p.replicas} replicas"
        print(
            f"- {p.name}: {p.start.isoformat()} to {p.end.isoformat()}, {asks}; asks from "
            f"{p.asks_from(warmup).isoformat()} (lead {p.lead.total_seconds() / 60:g} min, warm-up {args.warmup_s:g} s)"
        )
    return 0


def _local_replicas(run: Path) -> int | None:
    """What `make serve` runs now: replicas.json's count, 1 for a single server, None if nothing."""
    if (run / "replicas.json").exists():
        return len(json.loads((run / "replicas.json").read_text()))
    return 1 if pid_file(run, "supervisor").exists() else None


def _plan(args: argparse.Namespace) -> int:
    if args.every_s and (not args.apply or args.at):
        print("error: --every-s repeats --apply at the time of each run: give --apply, not --at", file=sys.stderr)
        return 2
    planner = _planner(args)
    while True:
        rc = _plan_once(args, planner)
        if not args.every_s or rc:
            return rc
        time.sleep(args.every_s)


def _plan_once(args: argparse.Namespace, planner) -> int:
    t = args.at or datetime.now(timezone.utc)
    p = planner.at(t)
    print(f"{t.isoformat()}: {p.reason()}; promotions asking: {', '.join(p.promotions) or 'none'}", flush=True)
    if p.forecast is not None:
        print(f"forecast: {p.forecast.rate:.1f} chats/s ({p.forecast.source}, trend x{p.forecast.trend:.2f})")
    if not (args.local or args.apply):
        return 0
    now, live = _local_replicas(args.run_dir), (args.run_dir / launch.FLEET).exists()
    want = min(p.desired, SLOTS)
    capped = f" (the balancer's {SLOTS} slots)" if want < p.desired else ""
    if now is None:
        print(f"local: `make serve` is not running ({args.run_dir}); would start: make serve REPLICAS={want}")
        return 1 if args.apply else 0
    if now == want:
        print(f"local: `make serve` runs {now} replicas, as planned{capped}")
        return 0
    if not live:  # one server (no balancer), or a stack started before `scale` existed
        print(
            f"local: `make serve` runs {now} without a balancer that scales: to run {want}, "
            f"make stop && make serve REPLICAS={want}"
        )
        return 1 if args.apply else 0
    if not args.apply:
        scaled = f"from {now} to {want} replicas{capped}"
        print(f"local: would scale `make serve` {scaled} (dry run): make scale REPLICAS={want}")
        return 0
    print(f"local: scaling `make serve` from {now} to {want} replicas{capped}", flush=True)
    return launch.scale(args.run_dir, want)


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    exporter = Exporter(_planner(args), args.port, args.host, args.refresh_s).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logging.getLogger("switchboard.capacity").info(
        "serving the capacity plan on http://%s:%d/metrics (%s)", args.host, exporter.port, args.calendar
    )
    exporter.metrics()  # a bad history or calendar shows at start, not at the first scrape
    stop.wait()
    exporter.stop()
    return 0


def _record(args: argparse.Namespace) -> int:
    """One range query a day (Prometheus answers at most 11,000 points a query); a minute
    without a sample takes the previous minute's rate (0 before the first), and is counted."""
    if args.end <= args.start:
        raise ValueError(f"--end {args.end.isoformat()} is not after --start {args.start.isoformat()}")
    history = PrometheusHistory(args.prometheus, args.query)
    start = args.start.replace(second=0, microsecond=0)
    minutes = int((args.end - start).total_seconds() // 60)
    rates: list[float | None] = []
    for first in range(0, minutes, 1440):
        rates += history.rates(start + timedelta(minutes=first), min(1440, minutes - first))
    filled, last, rows = 0, 0.0, []
    for k, r in enumerate(rates):
        if r is None:
            filled, r = filled + 1, last
        last = r
        rows.append(f"{(start + timedelta(minutes=k)).isoformat()},{r:.6g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("minute,chats_per_s\n" + "".join(row + "\n" for row in rows))
    print(f"{args.out}: {len(rows)} minutes from {start.isoformat()}; {filled} without a sample took the previous rate")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    import yaml

    from switchboard.ops.capacity import simulate
    from switchboard.ops.capacity.hpa import Spec

    calendar = cal.load(args.calendar)
    spec = Spec.from_manifest(yaml.safe_load(args.hpa.read_text()))
    settings = simulate.Settings(per_replica=args.per_replica, pod_start_s=args.pod_start_s, headroom=args.headroom)
    day = simulate.Day.from_csv(args.series) if args.series else simulate.recorded_day(growth=args.growth)
    result = simulate.compare(calendar, spec, settings, day)
    text = simulate.table(result["summaries"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(text)
    result["day"].write_csv(args.out / "series.csv")
    simulate.plot(result["traces"], calendar, args.per_replica, args.out / "double-11.png")
    print(text)
    print(f"written: {args.out / 'table.md'}, {args.out / 'double-11.png'}, {args.out / 'series.csv'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        commands = {"check": _check, "plan": _plan, "serve": _serve, "record": _record, "simulate": _simulate}
        return commands[args.command](args)
    except (cal.CalendarError, HistoryError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

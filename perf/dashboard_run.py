"""The Grafana dashboard's panels from a real run: ``python -m perf.dashboard_run``.

Starts a private stack on free ports and a real Prometheus scraping its metrics port every
second, replays mixed-priority multi-turn traffic for ``--duration-s`` (perf.workload:
Poisson session arrivals with 5x bursts, 15% priority 1, 3-6 turns, some pasting long context),
spoken questions beside it (``--speech-every-s``: to ``asr``, and every other one a turn of a
spoken conversation through ``voice_chat``) and customers with the order tools offered
(``--customer-every-s``: asking for a person, asking about an order, leaving mid-answer),
stops Redis for a few seconds (``--redis-outage-at``) and restarts tritonserver once
(``--restart-at``), with the latency breaker on (``--breaker-ttft-p99-s``), so the Redis,
cache-miss, restart, shed and Business panels have something to show. Then it
asks Prometheus for every query of every panel of the dashboard over the run (``query_range``;
Grafana's ``$__rate_interval`` becomes ``--rate-window``) and draws them in a matplotlib grid
with the dashboard's rows (three panels a line, as Grafana lays them out), titles, units and
alert thresholds. The series go to ``--data``
(``--replot`` draws them again without a run); the picture to ``--out``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import shutil
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

from perf import workload
from perf.driver import drive
from switchboard import paths
from switchboard.client import ChatClient, ChatError
from switchboard.ops import dashboard
from switchboard.ops.launch import Ports, Stack, free_ports
from switchboard.ops.monitor import Monitor
from switchboard.serving.order_demo import TOOLS

OUT = paths.ROOT / "docs" / "dashboard.png"
DATA = paths.BUILD / "dashboard" / "series.json"
DPI = 90
PER_LINE = 3  # panels side by side: the dashboard's panels are a third of its width


def log(msg: str) -> None:
    print(f"[dashboard {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    url = f"{prometheus}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt: str, labels: dict) -> str:
    """Grafana's legend format: ``{{label}}`` replaced by the series' label value."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def rows(board: dict) -> list[tuple[str, list[dict]]]:
    """(row title, its panels) in the dashboard's order."""
    out: list[tuple[str, list[dict]]] = []
    for p in board["panels"]:
        if p["type"] == "row":
            out.append((p["title"], [q for q in p.get("panels", []) if q.get("targets")]))
        elif p.get("targets"):
            if not out:
                out.append(("", []))
            out[-1][1].append(p)
    return out


def collect(board: dict, prometheus: str, start: float, end: float, step: float, window: str) -> dict:
    """Every panel's series over [start, end]: {title: [{"name", "t", "v"}...]}, t in seconds
    since ``start``."""
    data = {}
    for _, panels in rows(board):
        for p in panels:
            series = []
            for t in p["targets"]:
                for s in query_range(prometheus, dashboard.with_window(t["expr"], window), start, end, step):
                    points = [(float(ts) - start, float(v)) for ts, v in s["values"]]
                    points = [(ts, v) for ts, v in points if math.isfinite(v)]
                    if points:
                        name = legend(t.get("legendFormat", ""), s["metric"]) or t["refId"]
                        series.append({"name": name, "t": [x for x, _ in points], "v": [y for _, y in points]})
            data[p["title"]] = series
    return data


# Grafana unit -> (scale, axis label) for the picture.
def _unit(unit: str) -> tuple[float, str]:
    if unit == "s":
        return 1000.0, "ms"
    if unit == "percentunit":
        return 100.0, "%"
    if unit == "reqps":
        return 1.0, "chats/s"
    if unit.startswith("suffix:"):
        return 1.0, unit.split(":", 1)[1].strip()
    return 1.0, ""


def _threshold(panel: dict) -> float | None:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    values = [s["value"] for s in steps if s.get("value") is not None]
    return values[0] if values else None


def _stacked(panel: dict) -> bool:
    return (
        panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {}).get("mode") == "normal"
    )


def draw(board: dict, data: dict, out: Path, note: str, marks: list[tuple[float, str]] = ()) -> list[str]:
    """The picture of every panel, each row's panels three a line; returns the titles drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = rows(board)
    lines = [max(1, math.ceil(len(panels) / PER_LINE)) for _, panels in grid]
    span = max((t for series in data.values() for s in series for t in s["t"]), default=60.0) / 60
    fig = plt.figure(figsize=(15, 3.0 * sum(lines) + 1.0), dpi=DPI)
    header, *subfigs = fig.subfigures(len(grid) + 1, 1, height_ratios=[1.0] + [3.0 * n for n in lines])
    drawn = []
    title = f"{board['title']}: the panels of monitoring/grafana/switchboard.json, from a real run"
    header.text(0.5, 0.75, title, ha="center", va="center", fontsize=12, fontweight="bold")
    header.text(0.5, 0.3, note, ha="center", va="center", fontsize=8)
    for sub, n, (row_title, panels) in zip(subfigs, lines, grid):
        sub.suptitle(row_title, x=0.01, ha="left", fontsize=10, fontweight="bold")
        axes = sub.subplots(n, PER_LINE, squeeze=False).ravel()
        if n > 1:
            sub.subplots_adjust(hspace=0.45)
        for ax in axes[len(panels) :]:
            ax.set_visible(False)
        for ax, p in zip(axes, panels):
            drawn.append(p["title"])
            scale, label = _unit(p["fieldConfig"]["defaults"].get("unit", ""))
            everything = data.get(p["title"], [])
            series = [s for s in everything if any(v != 0 for v in s["v"])]  # flat zero lines left out
            colors = plt.get_cmap("tab10" if len(series) <= 10 else "tab20").colors
            if _stacked(p) and series:
                ticks = sorted({t for s in series for t in s["t"]})
                at = {t: i for i, t in enumerate(ticks)}
                stack = []
                for s in series:
                    v = [0.0] * len(ticks)
                    for t, y in zip(s["t"], s["v"]):
                        v[at[t]] = y * scale
                    stack.append(v)
                ax.stackplot(
                    [t / 60 for t in ticks], stack, labels=[s["name"] for s in series], colors=colors, alpha=0.8
                )
            else:
                for i, s in enumerate(series):
                    ax.plot(
                        [t / 60 for t in s["t"]],
                        [y * scale for y in s["v"]],
                        lw=0.9,
                        color=colors[i % len(colors)],
                        label=s["name"],
                    )
            threshold = _threshold(p)
            if threshold is not None:
                ax.axhline(threshold * scale, color="red", lw=0.8, ls="--")
            for t, _ in marks:
                ax.axvline(t / 60, color="grey", lw=0.6, ls=":")
            top = p["fieldConfig"]["defaults"].get("max")
            ax.set_ylim(0, top * scale * 1.05 if top is not None else None)
            ax.set_xlim(0, span)
            ax.set_title(p["title"], fontsize=9)
            ax.set_ylabel(label, fontsize=7)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if series:
                ax.legend(fontsize=6, ncol=2 if len(series) > 4 else 1, loc="upper left", framealpha=0.6)
            zero = len(everything) - len(series)
            if zero or not everything:
                text = f"{zero} series at 0 throughout (not drawn)" if everything else "no data"
                ax.text(0.99, 0.97, text, ha="right", va="top", transform=ax.transAxes, color="grey", fontsize=6)
        axes[max(0, len(panels) - 1)].set_xlabel("minutes into the run", fontsize=7)
    out.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=DPI, format="png")
    plt.close(fig)
    # A 256-colour palette: a third of the size of matplotlib's RGBA, for a picture committed to docs/.
    from PIL import Image

    Image.open(buffer).convert("RGB").quantize(colors=256).save(out, optimize=True)
    return drawn


def summarize(records) -> str:
    statuses = Counter("ok" if r.ok else r.status for r in records)
    fallbacks = sum(r.fallback for r in records if r.ok)
    by_priority = Counter(r.priority for r in records)
    return (
        f"{len(records)} turns ({', '.join(f'priority {p}: {n}' for p, n in sorted(by_priority.items()))}); "
        f"{', '.join(f'{k}: {n}' for k, n in statuses.most_common())}; FAQ answers {fallbacks}"
    )


def _faults(args: argparse.Namespace, stack: Stack, start: float, marks: list) -> None:
    """Redis stopped for ``--redis-outage-s`` at ``--redis-outage-at`` of the run (it comes back
    empty: no persistence), tritonserver restarted at ``--restart-at``: what the Redis, cache-miss
    and restart panels are for."""
    events = []
    if 0 < args.redis_outage_at < 1:
        events.append((args.redis_outage_at * args.duration_s, "redis"))
    if 0 < args.restart_at < 1:
        events.append((args.restart_at * args.duration_s, "restart"))
    for at, what in sorted(events):
        time.sleep(max(0.0, start + at - time.time()))
        marks.append((time.time() - start, what))
        if what == "redis":
            log(f"stopping redis-server for {args.redis_outage_s:g} s")
            stack.stop_redis()
            time.sleep(args.redis_outage_s)
            stack.start_redis()
            log("redis-server is back, empty")
        else:
            log("restarting tritonserver")
            stack.restart_triton()
            log("tritonserver is back")


def _callers(args: argparse.Namespace, stack: Stack, start: float, counts: Counter) -> None:
    """Speech beside the chats, so the Speech row and voice turns per conversation have series: a
    spoken question every ``--speech-every-s``, one at a time (one in five priority 1, one in ten
    not audio: a refusal); every other one is a turn through ``voice_chat`` instead of a
    transcription, the turns of six questions one spoken conversation, priority 1 (a caller on
    the line is live; an FAQ answer given before its session is read starts no conversation)."""
    from perf.asr_load import question_clips

    clips = question_clips(["en"], 12, seed=args.seed)
    client = ChatClient(stack.grpc_url, timeout_s=60)

    def turn(i: int) -> str:
        audio = b"not audio" if i % 10 == 9 else clips[i % len(clips)].wav
        if i % 2 and i % 10 != 9:
            session = f"dashboard-voice-{i // 6}"
            reply = client.voice_chat(
                audio, stream=False, language="en", session_id=session, priority=1, max_new_tokens=24
            )
            return "voice turns" if reply.text else "voice turns without an answer"
        client.transcribe(audio, language="en", priority=1 if i % 5 == 0 else 2)
        return "transcribed"

    _paced(start, args.duration_s, args.speech_every_s, counts, turn)


def _paced(start: float, duration_s: float, every_s: float, counts: Counter, turn) -> None:
    """``turn(i)`` every ``every_s`` from ``start`` for ``duration_s``, one at a time, each
    counted under the outcome it returns or its error's code."""
    i = 0
    while i * every_s < duration_s and time.time() - start < duration_s:
        time.sleep(max(0.0, start + i * every_s - time.time()))
        try:
            counts[turn(i)] += 1
        except ChatError as e:
            counts[e.code or "error"] += 1
        except Exception:  # the restart: UNAVAILABLE while it comes back
            counts["failed"] += 1
        i += 1


HANDOVER = {"type": "function", "function": {"name": "transfer_to_human"}}
# an answer held to 400 characters at least: still streaming when its customer leaves
LONG_NOTE = {
    "type": "json_schema",
    "schema": {"type": "object", "properties": {"note": {"type": "string", "minLength": 400}}, "required": ["note"]},
}


def _customers(args: argparse.Namespace, stack: Stack, start: float, counts: Counter) -> None:
    """Customers beside the workload's, so the Business row's hand-overs, tool calls and
    abandoned chats have series: one every ``--customer-every-s``, one at a time, in turn asking
    for a person with the order tools offered (the agent hands over: ``transfer_to_human``
    named), asking about an order with the tools offered (the model calls one or answers), and
    leaving after the first words of a long answer."""
    client = ChatClient(stack.grpc_url, timeout_s=60)

    def turn(i: int) -> str:
        order = f"SB{20260000 + i:08d}"
        if i % 3 == 0:
            reply = client.chat(
                "I want to complain, get me a person",
                stream=False,
                session_id=f"dashboard-customer-{i}",
                max_new_tokens=64,
                tools=TOOLS,
                tool_choice=HANDOVER,
            )
            return "handed over" if reply.tool_calls else "not handed over"
        if i % 3 == 1:
            reply = client.chat(
                f"Where is my order {order}?",
                stream=False,
                session_id=f"dashboard-customer-{i}",
                max_new_tokens=64,
                tools=TOOLS,
            )
            return "called a tool" if reply.tool_calls else "answered without a tool"
        events = client.chat(f"I want to return order {order}", max_new_tokens=512, response_format=LONG_NOTE)
        next(events)
        events.close()  # leaves: the stream is cancelled
        return "left mid-answer"

    _paced(start, args.duration_s, args.customer_every_s, counts, turn)


def run(args: argparse.Namespace, board: dict) -> tuple[dict, str, list[tuple[float, str]]]:
    spec = workload.WorkloadSpec(
        sessions=int(args.duration_s * args.rate * 5) + 10,
        rate_per_s=args.rate,
        burst_every_s=60.0,
        burst_length_s=10.0,
        seed=args.seed,
    )
    sessions = [s for s in workload.generate(spec) if s.arrival_s <= args.duration_s]
    run_dir = args.data.parent / "run"
    env = {"SWITCHBOARD_BREAKER_TTFT_P99_S": f"{args.breaker_ttft_p99_s:g}"} if args.breaker_ttft_p99_s else {}
    stack = Stack(Ports.free(), run_dir=run_dir, env=env)
    [prometheus_port] = free_ports(1)
    shutil.rmtree(
        run_dir / "monitor", ignore_errors=True
    )  # a previous run's series: the restart panel looks back 15 min
    monitor = Monitor([f"127.0.0.1:{stack.ports.metrics}"], run_dir / "monitor", prometheus_port, None, 1.0)
    marks: list[tuple[float, str]] = []
    log(f"starting a private stack and Prometheus (scrape 1 s) on free ports; logs in {run_dir}")
    stack.start()
    try:
        monitor.start()
        time.sleep(3)
        start = time.time()
        faults = threading.Thread(target=_faults, args=(args, stack, start, marks), daemon=True)
        faults.start()
        heard: Counter = Counter()
        speech = threading.Thread(target=_callers, args=(args, stack, start, heard), daemon=True)
        if args.speech_every_s > 0:
            speech.start()
        served: Counter = Counter()
        customers = threading.Thread(target=_customers, args=(args, stack, start, served), daemon=True)
        if args.customer_every_s > 0:
            customers.start()
        log(
            f"{args.duration_s:.0f} s of multi-turn traffic: {args.rate:g} sessions/s, 5x bursts of 10 s "
            f"every 60 s, 15% priority 1"
        )
        records, _ = drive(ChatClient(stack.grpc_url, timeout_s=60), sessions, args.duration_s, grace_s=60)
        faults.join()
        for caller in (speech, customers):
            if caller.is_alive():
                caller.join(90)
        time.sleep(3)  # the last publications and scrapes
        end = time.time()
        summary = summarize(records)
        more = [
            f"{what}: " + ", ".join(f"{n} {how}" for how, n in sorted(counts.items()))
            for what, counts in (("speech", heard), ("customers with tools", served))
            if counts
        ]
        if more:
            summary += "\n" + "; ".join(more)
        log(summary)
        data = collect(board, monitor.url, start, end, args.step, args.rate_window)
    finally:
        monitor.stop()
        stack.stop()
    what = {"redis": f"redis-server stopped for {args.redis_outage_s:g} s", "restart": "tritonserver restarted"}
    events = "; ".join(f"{what[w]} at {t / 60:.1f} min (dotted)" for t, w in marks)
    breaker = f"latency breaker at P99 TTFT {args.breaker_ttft_p99_s:g} s; " if args.breaker_ttft_p99_s else ""
    note = (
        f"{(end - start) / 60:.1f} min, {args.rate:g} sessions/s with 5x bursts, 15% priority 1; {breaker}{events}; "
        f"rate window {args.rate_window}, step {args.step:g} s\n{summary}"
    )
    return data, note, marks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.dashboard_run", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help="the picture (default docs/dashboard.png)")
    p.add_argument("--data", type=Path, default=DATA, help="the series as JSON (default build/dashboard/series.json)")
    p.add_argument("--replot", action="store_true", help="draw --data again, no run")
    p.add_argument("--duration-s", type=float, default=240.0, help="seconds of traffic (default 240)")
    p.add_argument("--rate", type=float, default=1.5, help="steady session arrivals per second (default 1.5)")
    p.add_argument(
        "--restart-at", type=float, default=0.6, help="restart tritonserver at this share of the run (0: never)"
    )
    p.add_argument("--redis-outage-at", type=float, default=0.3, help="stop Redis at this share of the run (0: never)")
    p.add_argument("--redis-outage-s", type=float, default=10.0, help="how long Redis stays down (default 10)")
    p.add_argument(
        "--breaker-ttft-p99-s",
        type=float,
        default=1.5,
        help="the server's latency breaker bound (seed 001's 1.5 s, default; 0: off as in config.pbtxt)",
    )
    p.add_argument("--rate-window", default="30s", help="what $__rate_interval becomes (default 30s)")
    p.add_argument("--step", type=float, default=2.0, help="query_range step in seconds (default 2)")
    p.add_argument(
        "--speech-every-s",
        type=float,
        default=2.0,
        help="a spoken question every this many seconds: to asr, every other one a voice_chat turn (default 2; "
        "0: no speech)",
    )
    p.add_argument(
        "--customer-every-s",
        type=float,
        default=3.0,
        help="a customer with the order tools offered, or one who leaves mid-answer, every this many "
        "seconds (default 3; 0: none)",
    )
    p.add_argument("--seed", type=int, default=26)
    args = p.parse_args(argv)
    board = dashboard.build()
    if args.replot:
        saved = json.loads(args.data.read_text())
        data, note, marks = saved["series"], saved["note"], [tuple(m) for m in saved["marks"]]
    else:
        data, note, marks = run(args, board)
        args.data.parent.mkdir(parents=True, exist_ok=True)
        args.data.write_text(json.dumps({"note": note, "marks": marks, "series": data}))
    drawn = draw(board, data, args.out, note, marks)
    empty = [title for title, series in data.items() if not series]
    size = args.out.stat().st_size // 1024
    log(f"{len(drawn)} of {len(data)} panels -> {args.out} ({size} KiB); series in {args.data}")
    if empty:
        log(f"panels without data: {', '.join(empty)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

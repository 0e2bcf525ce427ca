"""The ASR benchmark's report: ``python -m perf.asr_report build/bench/asr``.

Reads ``results.json`` (``perf.asr_bench``) and writes ``summary.md``: throughput
per model and system at 1 and 8 callers, the issue's two goals checked against them, the
faster-whisper settings tried, seed 001's short-utterance latency with length-aware and count
batching, voice-to-first-answer-token latency, the machine and its load; and
``asr-bench.png`` (throughput bars, seed 001's latency CDF). The tables are pure functions of
the results, so they are tested without a run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from perf.markdown import MISSING, ms, number, table, times
from perf.stats import ratio

GOAL_SCALING = 3.0  # Switchboard at 8 callers against itself at 1 (issue 38; seed 002 reports 3-5x)
GOAL_SEED001 = 3.0  # short-utterance P99, count batching over length batching
SYSTEM_ORDER = ("switchboard", "switchboard-whole", "faster-whisper", "litserve")


def by_run(throughput: list[dict]) -> dict:
    """{(model, system, precision): {concurrency: row}}, the rounds of one merged (``merged``)."""
    groups: dict = {}
    for row in throughput:
        key = (row["model"], row["system"], row["precision"])
        groups.setdefault(key, {}).setdefault(row["concurrency"], []).append(row)
    return {key: {c: merged(rows) for c, rows in levels.items()} for key, levels in groups.items()}


def merged(rows: list[dict]) -> dict:
    """Rounds of one measurement as one row: the median throughput and latencies (``rates``:
    every round's throughput), failures summed, the mean load."""
    if len(rows) == 1:
        return rows[0]
    out = dict(rows[0])
    rates = [r["audio_s_per_s"] for r in rows]
    out["rates"] = rates
    for key in ("audio_s_per_s", "latency_p50_s", "latency_p99_s"):
        out[key] = float(np.median([r[key] for r in rows]))
    out["failed"] = sum(r.get("failed", 0) for r in rows)
    out["load_avg"] = float(np.mean([r.get("load_avg", math.nan) for r in rows]))
    return out


def _rate(row: dict) -> str:
    """Throughput, with every round's in brackets when there were several."""
    text = number(row.get("audio_s_per_s", math.nan), 1)
    if len(row.get("rates", [])) > 1:
        text += " (" + ", ".join(number(r, 1) for r in row["rates"]) + ")"
    return text


def _order(key: tuple) -> tuple:
    model, system, precision = key
    return (SYSTEM_ORDER.index(system) if system in SYSTEM_ORDER else 9, precision != "fp32", precision)


def throughput_table(results: dict, model: str) -> str:
    runs = {k: v for k, v in by_run(results["throughput"]).items() if k[0] == model}
    rows = []
    for key in sorted(runs, key=_order):
        _, system, precision = key
        c1, c8 = runs[key].get(1, {}), runs[key].get(8, {})
        rate1, rate8 = c1.get("audio_s_per_s", math.nan), c8.get("audio_s_per_s", math.nan)
        errors = c8.get("error_rate") or c1.get("error_rate") or {}
        rows.append(
            [
                system,
                precision,
                _rate(c1),
                _rate(c8),
                times(ratio(rate8, rate1)),
                ms(c1.get("latency_p50_s")),
                ms(c8.get("latency_p50_s")),
                ms(c8.get("latency_p99_s")),
                ", ".join(f"{'WER' if k == 'en' else 'CER'} {v:.2f}" for k, v in sorted(errors.items())) or MISSING,
                f"{c1.get('failed', 0) + c8.get('failed', 0)}",
                " / ".join(number(r.get("load_avg"), 1) for r in (c1, c8) if r) or MISSING,
                (c8 or c1).get("settings", ""),
            ]
        )
    header = ["system", "precision", "c=1 audio s/s", "c=8 audio s/s", "c=8 / c=1", "c=1 P50", "c=8 P50"]
    header += ["c=8 P99", "error rate", "failed", "load avg", "settings"]
    return table(header, rows)


def goals(results: dict) -> list[dict]:
    """The issue's throughput goals per model: Switchboard ahead of each peer at concurrency 8
    (its best precision against the peer's best), and Switchboard's c=8 at least 3x its c=1
    (per precision)."""
    runs = by_run(results["throughput"])
    out = []
    for model in dict.fromkeys(k[0] for k in runs):

        def best(system: str, model=model) -> tuple[float, str]:
            rates = [
                (v[8]["audio_s_per_s"], k[2]) for k, v in runs.items() if k[0] == model and k[1] == system and 8 in v
            ]
            rates = [r for r in rates if not math.isnan(r[0])]
            return max(rates) if rates else (math.nan, "")

        ours, ours_precision = best("switchboard")
        for peer in ("faster-whisper", "litserve"):
            theirs, precision = best(peer)
            if math.isnan(theirs):
                continue
            r = ratio(ours, theirs)
            out.append(
                {
                    "model": model,
                    "goal": f"ahead of {peer} at c=8",
                    "figure": f"{number(ours, 1)} ({ours_precision}) vs {number(theirs, 1)} ({precision}) "
                    f"audio s/s: {times(r)}",
                    "met": r > 1,
                }
            )
        for (m, system, precision), levels in runs.items():
            if m != model or system != "switchboard" or 1 not in levels or 8 not in levels:
                continue
            rate1, rate8 = levels[1]["audio_s_per_s"], levels[8]["audio_s_per_s"]
            r = ratio(rate8, rate1)
            out.append(
                {
                    "model": model,
                    "goal": f"{precision}: c=8 >= {GOAL_SCALING:g}x c=1",
                    "figure": f"{number(rate8, 1)} vs {number(rate1, 1)} audio s/s: {times(r)}",
                    "met": r >= GOAL_SCALING,
                }
            )
    return out


def seed001_rows(results: dict) -> tuple[str, list[dict]]:
    """The table, and per ``workers`` the ratio of the short ones' P99 (count / length)."""
    rows, verdicts = [], []
    runs = results.get("seed001", [])
    for row in runs:
        s, lg = row["by_kind"].get("short", {}), row["by_kind"].get("long", {})
        rows.append(
            [
                row["batching"],
                row["workers"],
                number(row["rate_per_s"], 2),
                f"{s.get('requests', 0)} / {lg.get('requests', 0)}",
                ms(s.get("p50_s")),
                ms(s.get("p99_s")),
                ms(lg.get("p50_s")),
                ms(lg.get("p99_s")),
                ms(row.get("short_queued_p99_s")),
                ms(row.get("short_in_batch_p99_s")),
                number(row.get("short_batch_size_mean"), 1),
                number(row.get("drain_s"), 1, " s"),
                s.get("failed", 0) + lg.get("failed", 0),
                row.get("refused_by_breaker", "-") if row.get("breaker_p99_s") else "-",
            ]
        )
    for workers in dict.fromkeys(r["workers"] for r in runs):
        pair = {r["batching"]: r for r in runs if r["workers"] == workers}
        if {"length", "count"} <= set(pair):
            length = pair["length"]["by_kind"].get("short", {})
            count = pair["count"]["by_kind"].get("short", {})
            p99 = ratio(count.get("p99_s", math.nan), length.get("p99_s", math.nan))
            p50 = ratio(count.get("p50_s", math.nan), length.get("p50_s", math.nan))
            verdicts.append({"workers": workers, "p99_ratio": p99, "p50_ratio": p50, "met": p99 >= GOAL_SEED001})
    header = ["batching", "workers", "arrivals/s", "short / long", "short P50", "short P99", "long P50", "long P99"]
    header += ["short: queued P99", "in a batch P99", "short's batch size", "drained after", "failed"]
    header += ["of them refused by the breaker"]
    return table(header, rows), verdicts


def voice_table(results: dict) -> str:
    rows = []
    for r in results.get("voice", []):
        rows.append(
            [
                r["model"],
                r["concurrency"],
                f"{r['answered']}/{r['requests']}",
                ms(r["heard_p50_s"]),
                ms(r["first_token_p50_s"]),
                ms(r["first_token_p99_s"]),
                number(r.get("asr_ms_p50"), 0, " ms"),
                "; ".join(r.get("transcripts", []))[:80],
            ]
        )
    header = ["recognizer", "callers", "answered", "transcript P50", "first answer token P50", "P99"]
    header += ["server asr_ms P50", "heard"]
    return table(header, rows)


def summary_md(results: dict) -> str:
    m = results.get("machine", {})
    start, end = m.get("load_avg_start", []), m.get("load_avg_end", [])
    load = f"load average (1/5/15 min) {', '.join(f'{x:.2f}' for x in start)} at the start"
    if end:
        load += f", {', '.join(f'{x:.2f}' for x in end)} at the end"
    parts = [
        f"Run {results.get('started', '?')} at {m.get('commit', '?')}: `{results.get('command', '')}`, "
        f"{number(results.get('elapsed_s', math.nan) / 60, 1)} min"
        + (" (**cut short**: the figures below are what it measured before)." if results.get("interrupted") else ".")
        + (f" Resumed (`--resume`) at {', '.join(results['resumed'])}." if results.get("resumed") else ""),
        f"Machine: {m.get('cpus', '?')} cores of {m.get('cpu', '?')} (shared), {load}.",
        "",
        "Throughput is audio seconds transcribed per wall second (inverse real-time factor), closed loop: "
        "every caller sends its next clip when its last is answered (with several rounds: the median, each "
        "round's in brackets). Latency is per request as the client saw it; "
        "load avg: the machine's 1-minute load average when each run (c=1 / c=8) ended.",
    ]
    models = list(dict.fromkeys(r["model"] for r in results.get("throughput", [])))
    for model in models:
        parts += ["", f"### Throughput: {model}", "", throughput_table(results, model)]
    found = goals(results)
    if found:
        rows = [[g["model"], g["goal"], g["figure"], "met" if g["met"] else "**missed**"] for g in found]
        parts += ["", "### Goals", "", table(["model", "goal", "figure", ""], rows)]
    if results.get("fw_settings"):
        rows = [
            [r["model"], r["compute_type"], r["setting"], number(r["audio_s_per_s"], 1)] for r in results["fw_settings"]
        ]
        parts += ["", "### faster-whisper settings at c=8 (the fastest kept)", ""]
        parts.append(table(["model", "compute type", "setting", "audio s/s"], rows))
    if results.get("seed001"):
        text, verdicts = seed001_rows(results)
        cal = results.get("seed001_calibration", {})
        model = results.get("preset", {}).get("seed001_model")
        on = f", {model}" if model else ""
        parts += ["", f"### Seed 001: 2 s questions among 30 s recordings (80/20, Poisson arrivals{on})", ""]
        if cal:
            parts.append(
                f"One request at a time the pool takes {number(cal.get('short'), 2)} s for a short one and "
                f"{number(cal.get('long'), 2)} s for a long one; arrivals at {number(cal.get('rate_per_s'), 2)}/s are "
                f"{number(cal.get('load'), 2)}x what it does that way (batching makes the rest).\n"
            )
        parts.append(text)
        bounds = sorted({r["breaker_p99_s"] for r in results["seed001"] if r.get("breaker_p99_s")})
        if bounds:
            bound = ", ".join(f"{b:g}" for b in bounds)
            parts.append(
                f"\nRows `+breaker`: asr's latency breaker on (`breaker_p99_s` {bound} s, seed 001's remedy). "
                "The requests it refused (UNAVAILABLE) count as failed; the percentiles are of the answered ones."
            )
        for v in verdicts:
            parts.append(
                f"\nworkers={v['workers']}: short-utterance P99 with count batching / with length batching = "
                f"{times(v['p99_ratio'])} (P50 {times(v['p50_ratio'])}); goal >= {GOAL_SEED001:g}x: "
                + ("met" if v["met"] else "**missed**")
            )
    if results.get("voice"):
        parts += ["", "### Voice to first answer token (voice_chat, a 3 s question)", "", voice_table(results)]
    if results.get("notes"):
        parts += ["", "### Notes", ""] + [f"- {n}" for n in results["notes"]]
    return "\n".join(parts) + "\n"


def _wrap(name: str) -> str:
    return name.replace("-", "-\n")  # "faster-whisper" on two lines, or it runs into its neighbours


def plot(results: dict, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    runs = by_run(results.get("throughput", []))
    seed = results.get("seed001", [])
    if not runs and not seed:
        return None
    models = sorted({k[0] for k in runs})
    panels = len(models) + (1 if seed else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels + 1, 4.6), squeeze=False)
    axes = list(axes[0])
    # One panel per model, each on its own scale: a 1M-parameter model and a 244M one differ
    # by a hundred times.
    for model in models:
        ax = axes.pop(0)
        keys = sorted((k for k in runs if k[0] == model), key=lambda k: _order(k))
        xs = range(len(keys))
        for off, c, color in ((-0.2, 1, "tab:gray"), (0.2, 8, "tab:green")):
            ax.bar(
                [x + off for x in xs],
                [runs[k].get(c, {}).get("audio_s_per_s", 0) or 0 for k in keys],
                0.4,
                label=f"{c} caller{'s' if c > 1 else ''}",
                color=color,
            )
        ax.set_xticks(list(xs), [f"{_wrap(system)}\n{precision}" for _, system, precision in keys], fontsize=7)
        ax.set_ylabel("audio seconds per wall second")
        ax.set_title(f"ASR throughput: {model}")
        ax.legend(fontsize=8)
    if seed:
        ax = axes.pop(0)
        for row in seed:
            samples_path = path.parent / "samples" / f"seed001-{row['batching']}-w{row['workers']}.jsonl"
            if not samples_path.is_file():
                continue
            lat = sorted(
                s["done"] - s["sent"]
                for s in map(json.loads, samples_path.read_text().splitlines())
                if s["kind"] == "short" and s["ok"]
            )
            if lat:
                ax.step(lat, [(i + 1) / len(lat) for i in range(len(lat))], where="post",
                        label=f"batching={row['batching']}, workers={row['workers']}")  # fmt: skip
        ax.set_xscale("log")
        # seconds as plain numbers; matplotlib labels a log axis's minor ticks over each other
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("2 s question's latency (s)")
        ax.set_ylabel("share of requests")
        model = results.get("preset", {}).get("seed001_model")
        ax.set_title("Seed 001: 2 s among 30 s" + (f" ({model})" if model else ""))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_summary(out: Path) -> Path:
    results = json.loads((out / "results.json").read_text())
    text = summary_md(results)
    if plot(results, out / "asr-bench.png"):
        text += "\n![throughput and seed 001](asr-bench.png)\n"
    path = out / "summary.md"
    path.write_text("# ASR benchmark\n\n" + text)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.asr_report", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, nargs="?", default=Path("build/bench/asr"), help="the bench's --out")
    args = p.parse_args(argv)
    if not (args.out / "results.json").is_file():
        p.error(f"{args.out}: no results.json (run python -m perf.asr_bench first)")
    print(write_summary(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

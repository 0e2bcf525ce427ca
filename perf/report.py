"""Report for a benchmark directory: ``python -m perf.report build/bench/quick``.

Reads ``results.json`` and the per-run turn records written by ``perf.bench`` and
writes ``report.md`` with the headline ratios, per-load tables, the runtime limit, engine batch
sizes and padding, perf_analyzer sweeps, and the plots: latency CDFs per priority
(``cdf.png``), throughput and P99 against load (``load.png``), TTFT by turn number
(``turns.png``), batch-size histograms (``batches.png``) and padding waste per pool
(``padding.png``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from perf.driver import ABANDONED, REJECTED
from perf.markdown import number, table, times
from perf.stats import percentile, ratio

COLORS = {
    "optimized": "tab:green",
    "optimized-int8": "tab:olive",
    "baseline-sized": "tab:cyan",
    "baseline": "tab:red",
    "litserve": "tab:blue",
    "hf": "tab:purple",
    "llama.cpp": "tab:orange",
    "llama.cpp-q8_0": "tab:brown",
    "vllm": "tab:pink",
}


def load_records(out: Path, system: str, load: float) -> list[dict]:
    recs = []
    for f in sorted((out / "runs").glob(f"{system}-r*-l{load:g}.jsonl")):
        recs += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return recs


def aggregate(results: dict, out: Path, system: str, load: float) -> dict:
    """All rounds of one system at one load, pooled."""
    recs = load_records(out, system, load)
    wall = sum(e["wall_s"] for e in results["runs"] if e["system"] == system and e["load"] == load) or float("nan")
    ok = [r for r in recs if r["ok"]]
    ttft = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]
    e2e = [r["e2e_ms"] for r in ok]
    itl = [x for r in ok for x in r["itl_ms"]]
    vip = [r["ttft_ms"] for r in ok if r["priority"] == 1 and r["ttft_ms"] is not None]
    return {
        "turns": len(recs),
        "ok": len(ok),
        "failed": len(recs) - len(ok),
        "rejected": sum(r["status"] in REJECTED for r in recs),
        "abandoned": sum(r["status"] == ABANDONED for r in recs),
        "requests_per_s": len(ok) / wall,
        "output_tokens_per_s": sum(r["generated"] for r in ok) / wall,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "vip_ttft_p99": percentile(vip, 99),
        "e2e_p50": percentile(e2e, 50),
        "e2e_p99": percentile(e2e, 99),
        "itl_p50": percentile(itl, 50),
        "itl_p99": percentile(itl, 99),
        "fallback": sum(bool(r.get("fallback")) for r in ok),
        "reused_share": sum(r["reused"] for r in ok) / max(1, sum(r["prompt_tokens"] for r in ok)),
    }


LATENCIES = ("ttft_p50", "ttft_p99", "vip_ttft_p99", "e2e_p50", "e2e_p99")


def headline(results: dict, out: Path, load: float) -> str:
    systems = list(results["systems"])
    agg = {s: aggregate(results, out, s, load) for s in systems}
    header = ["system", "turns ok/all", "req/s", "out tok/s", "TTFT P50", "TTFT P99", "VIP TTFT P99", "E2E P50"]
    header += ["E2E P99", "ITL P50", "failed (abandoned)", "FAQ fallback", "prompt tokens from cache"]
    rows = [
        [
            s,
            f"{a['ok']}/{a['turns']}",
            number(a["requests_per_s"], 2),
            number(a["output_tokens_per_s"], 0),
            *(f"{number(a[k], 0)} ms" for k in LATENCIES),
            f"{number(a['itl_p50'], 1)} ms",
            f"{a['failed']} ({a['abandoned']})",
            a["fallback"],
            f"{a['reused_share']:.0%}",
        ]
        for s, a in agg.items()
    ]
    text = table(header, rows) + "\n"
    if "optimized" in agg and len(agg) > 1:
        o = agg["optimized"]
        # throughput: optimized / other; latency: other / optimized
        pairs = [("output_tokens_per_s", True)] + [(k, False) for k in LATENCIES]
        rows = [
            [s, *(times(ratio(o[k], a[k]) if up else ratio(a[k], o[k])) for k, up in pairs)]
            for s, a in agg.items()
            if s != "optimized"
        ]
        text += (
            "\nRatios, optimized against each (throughput: optimized / other; latency: other / optimized, "
            "so >1 means optimized is better):\n\n"
            + table(["optimized vs", "out tok/s", "TTFT P50", "TTFT P99", "VIP TTFT P99", "E2E P50", "E2E P99"], rows)
            + "\n"
        )
    return text


def engine_section(results: dict, load: float) -> tuple[str, dict]:
    """Batch sizes and padding per system and pool at ``load`` (summed over rounds)."""
    acc: dict = {}
    for e in results["runs"]:
        if e["load"] != load:
            continue
        for pool, d in e["engine"].items():
            a = acc.setdefault((e["system"], pool), {"batch_steps": {}})
            for k, v in d.items():
                if k == "batch_steps":
                    for b, n in v.items():
                        a["batch_steps"][int(b)] = a["batch_steps"].get(int(b), 0) + n
                else:
                    a[k] = a.get(k, 0) + v
    rows = []
    for (system, pool), a in sorted(acc.items()):
        steps = sum(a["batch_steps"].values())
        if not steps and not a.get("prefill_batches"):
            continue
        mean = sum(b * n for b, n in a["batch_steps"].items()) / steps if steps else float("nan")
        dec = a.get("decode_padded_columns", 0) / a["decode_columns"] if a.get("decode_columns") else float("nan")
        pre = (
            (1 - a.get("prefill_tokens", 0) / a["prefill_padded_tokens"])
            if a.get("prefill_padded_tokens")
            else float("nan")
        )
        rows.append(
            [
                system,
                pool,
                steps,
                number(mean, 2),
                max(a["batch_steps"], default=0),
                f"{number(dec * 100, 1)}%",
                f"{number(pre * 100, 1)}%",
                f"{number(a.get('busy_s', 0), 1)} s",
            ]
        )
    header = ["system", "pool", "decode steps", "mean batch", "max batch", "decode columns wasted on padding"]
    header += ["prefill positions wasted on padding", "engine busy"]
    return table(header, rows) + "\n", acc


def plots(results: dict, out: Path, engine: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems, loads = list(results["systems"]), results["loads"]
    top = max(loads)
    made = []

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for s in systems:
        recs = [r for r in load_records(out, s, top) if r["ok"]]
        for prio, style in ((1, "-"), (2, "--")):
            for ax, key in zip(axes, ("ttft_ms", "e2e_ms")):
                xs = np.sort([r[key] for r in recs if r["priority"] == prio and r[key] is not None])
                if len(xs):
                    ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), style, color=COLORS.get(s), label=f"{s} P{prio}")
    for ax, title in zip(axes, ("time to first token", "end-to-end latency")):
        ax.set_xscale("log")
        ax.set_xlabel("ms (log)")
        ax.set_ylabel("fraction of turns")
        ax.set_title(f"{title} CDF at {top:g} sessions/s (solid: priority 1, dashed: 2)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "cdf.png", dpi=110)
    plt.close(fig)
    made.append("cdf.png")

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for s in systems:
        aggs = [aggregate(results, out, s, x) for x in loads]
        axes[0].plot(loads, [a["output_tokens_per_s"] for a in aggs], "o-", color=COLORS.get(s), label=s)
        axes[1].plot(loads, [a["ttft_p99"] for a in aggs], "o-", color=COLORS.get(s), label=s)
        axes[2].plot(loads, [a["e2e_p99"] for a in aggs], "o-", color=COLORS.get(s), label=s)
    for ax, title in zip(axes, ("output tokens/s", "TTFT P99 (ms)", "E2E P99 (ms)")):
        ax.set_xlabel("offered load: sessions/s (5x in bursts)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "load.png", dpi=110)
    plt.close(fig)
    made.append("load.png")

    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / max(1, len(systems))
    for i, s in enumerate(systems):
        recs = [r for r in load_records(out, s, top) if r["ok"] and r["ttft_ms"] is not None]
        turns = sorted({r["turn"] for r in recs})
        med = [percentile([r["ttft_ms"] for r in recs if r["turn"] == t], 50) for t in turns]
        ax.bar(np.array(turns) + (i - (len(systems) - 1) / 2) * width, med, width, color=COLORS.get(s), label=s)
    ax.set_xlabel("turn number in the session")
    ax.set_ylabel("TTFT P50 (ms)")
    ax.set_title(f"time to first token by turn at {top:g} sessions/s")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out / "turns.png", dpi=110)
    plt.close(fig)
    made.append("turns.png")

    pools = [(k, v) for k, v in sorted(engine.items()) if sum(v["batch_steps"].values())]
    if pools:
        fig, axes = plt.subplots(1, len(pools), figsize=(4 * len(pools), 3.6), squeeze=False)
        for ax, ((system, pool), a) in zip(axes[0], pools):
            sizes = sorted(a["batch_steps"])
            ax.bar(sizes, [a["batch_steps"][b] for b in sizes], color=COLORS.get(system))
            ax.set_title(f"{system} / {pool}", fontsize=9)
            ax.set_xlabel("decode batch size")
            ax.set_ylabel("decode steps")
        fig.suptitle(f"batch sizes the engines formed at {top:g} sessions/s")
        fig.tight_layout()
        fig.savefig(out / "batches.png", dpi=110)
        plt.close(fig)
        made.append("batches.png")

        fig, ax = plt.subplots(figsize=(8, 3.8))
        labels = [f"{s}\n{p}" for (s, p), _ in pools]
        dec = [100 * a.get("decode_padded_columns", 0) / max(1, a.get("decode_columns", 0)) for _, a in pools]
        pre = [100 * (1 - a.get("prefill_tokens", 0) / max(1, a.get("prefill_padded_tokens", 0))) for _, a in pools]
        x = np.arange(len(pools))
        ax.bar(x - 0.2, dec, 0.4, label="decode: masked KV columns")
        ax.bar(x + 0.2, pre, 0.4, label="prefill: padding positions")
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_ylabel("% of computed positions")
        ax.set_title(f"padding waste per pool at {top:g} sessions/s")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "padding.png", dpi=110)
        plt.close(fig)
        made.append("padding.png")
    return made


def write_report(out: Path) -> Path:
    results = json.loads((out / "results.json").read_text())
    loads = results["loads"]
    top = max(loads)
    dev = results["device"]
    engine_md, engine = engine_section(results, top)
    made = plots(results, out, engine)
    md = [
        f"# Switchboard benchmark ({results['preset']})\n",
        f"Run {results['started']}, {results['elapsed_s']:.0f} s: `{results['command']}`\n",
        f"Machine: {dev.get('cpu', '?')}, {dev.get('cpus')} CPUs, {dev.get('platform')}; device: {dev['device']}"
        + (f" ({dev['gpu']})" if dev.get("gpu") else "")
        + "\n",
        f"Traffic: seeded workloads (`{out.name}/workloads/`), multi-turn sessions (3-6 turns, each sent after "
        f"the previous answer), 15% priority 1, prompts ~20-400+ tokens, Poisson arrivals with 5x bursts; "
        f"{results['seconds']:g} s of arrivals per run, turns still streaming {results['grace']:g} s later "
        f"are cancelled (abandoned); {results['rounds']} round(s), the system order rotating between runs.\n",
        "| system | what |\n|---|---|\n" + "".join(f"| {n} | {s['about']} |\n" for n, s in results["systems"].items()),
        f"## Headline: {top:g} sessions/s offered\n",
        headline(results, out, top),
    ]
    for load in sorted(loads)[:-1]:
        md += [f"\n## {load:g} sessions/s offered\n", headline(results, out, load)]
    if "optimized" in results["systems"]:
        from perf.driver import TurnRecord, summarize, summary_table

        recs = [TurnRecord(**r) for r in load_records(out, "optimized", top)]
        wall = sum(e["wall_s"] for e in results["runs"] if e["system"] == "optimized" and e["load"] == top)
        if recs:
            md += [f"\n## Optimized at {top:g} sessions/s by priority, route and turn\n"]
            md += [summary_table(summarize(recs, wall, key), key) + "\n" for key in ("priority", "route", "turn")]
    for key, system in (("limit", "optimized"), ("limit_int8", "optimized-int8")):
        md += limit_md(results.get(key), system, top)
    md += [
        f"\n## Engine batches and padding at {top:g} sessions/s\n",
        engine_md,
        "\nDecode columns wasted: masked KV positions (holes left by rows that joined with shorter "
        "histories, right-aligned). Prefill positions wasted: left padding in batched prefill.\n",
    ]
    if results.get("analyzer"):
        from perf.analyzer import markdown

        md.append("\n## perf_analyzer (gRPC streaming, every workload turn as a one-off request)\n")
        for name, rows in results["analyzer"].items():
            if rows:
                md += [f"\n### {name}\n", markdown(rows)]
    md.append("\n## Plots\n")
    md += [f"![{m}]({m})\n" for m in made]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path


def limit_md(lim: dict | None, system: str, top: float) -> list[str]:
    """The bare runtime at the batch sizes ``system`` formed, against what it served."""
    if not lim or not lim.get("tokens"):
        return []
    return [
        f"\n## The limit of {system}: the bare runtime at the same batch sizes\n",
        f"At {top:g} sessions/s the {system} engines produced {lim['tokens']:.0f} tokens; ONNX Runtime alone "
        f"(same graph, same threads, one process) needs {lim['runtime_s']:.2f} s for the same decode steps "
        f"and prefills: **{lim['tokens_per_s']:.0f} tokens/s**. Served: {lim['served_tokens_per_s']:.0f} "
        f"output tokens/s over the run's wall time; the engines were busy {lim['busy_s']:.1f} s "
        f"(engine loop incl. sampling and batching, vs {lim['runtime_s']:.2f} s of bare runtime).\n",
        "| pool | decode step ms by batch size | mean KV width | prefill rows x width |\n|---|---|---|---|\n"
        + "".join(
            f"| {p} | "
            + ", ".join(f"b{b}: {t:.2f}" for b, t in d["decode_step_ms"].items())
            + f" | {d['mean_width']} | {d['prefill_rows']} x {d['prefill_width']} |\n"
            for p, d in lim["pools"].items()
        ),
        f"\nServed tokens/s is {lim['served_tokens_per_s'] / lim['tokens_per_s']:.0%} of the runtime "
        "limit at that batch mix; below 100% means the server was not saturated (open-loop traffic "
        "arrives at its own pace) or spent time outside the runtime.\n",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.report", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="a benchmark directory (with results.json)")
    args = p.parse_args(argv)
    print(write_report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

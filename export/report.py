"""Per-export report: sizes, load times, prefill and decode-step latency per variant measured
side by side (interleaved, so machine drift hits every variant alike), and the accuracy table.
Writes ``report.md`` and ``report.png`` next to the artifacts."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from switchboard.engine.batch import prefill_inputs
from switchboard.export.accuracy import NEAR_TIE


def _feeds(manifest, dtype, batch: int, prompt: int, past: int):
    m = manifest
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, m.vocab_size, prompt).tolist() for _ in range(batch)]
    pre = prefill_inputs(prompts, [0] * batch, [None] * batch, m.num_layers, m.num_kv_heads, m.head_dim, dtype)
    kv = [
        (
            rng.standard_normal((batch, m.num_kv_heads, past, m.head_dim)).astype(dtype),
            rng.standard_normal((batch, m.num_kv_heads, past, m.head_dim)).astype(dtype),
        )
        for _ in range(m.num_layers)
    ]
    step = (
        np.full((batch, 1), 11, np.int64),
        np.ones((batch, past + 1), np.int64),
        np.full((batch, 1), past, np.int64),
        kv,
    )
    return pre[:4], step


def benchmark(
    artifacts: Path,
    variants: list[str],
    batches=(1, 8, 32),
    prompt: int = 64,
    past: int = 128,
    repeats: int = 5,
    threads: int = 2,
    progress=None,
) -> dict:
    """Median latencies; ``progress()`` is called after each measurement."""
    progress = progress or (lambda: None)
    from switchboard.artifact.manifest import Manifest
    from switchboard.engine.runtime import OnnxDecoder

    manifest = Manifest.load(artifacts)
    decoders, load_s = {}, {}
    for v in variants:
        t0 = time.perf_counter()
        decoders[v] = OnnxDecoder(artifacts, manifest, v, threads=threads)
        load_s[v] = time.perf_counter() - t0
    feeds = {b: _feeds(manifest, np.dtype(manifest.kv_dtype), b, prompt, past) for b in batches}
    samples: dict[tuple, list[float]] = {}
    for _ in range(repeats):
        for b in batches:
            for v in variants:  # interleaved: every variant sees the same machine state
                d = decoders[v]
                for kind, args in (("prefill", feeds[b][0]), ("decode", feeds[b][1])):
                    d.forward(*args)  # warm
                    t0 = time.perf_counter()
                    d.forward(*args)
                    samples.setdefault((v, kind, b), []).append((time.perf_counter() - t0) * 1000)
                progress()
    latency = {f"{v}|{k}|{b}": statistics.median(x) for (v, k, b), x in samples.items()}
    sizes = {v: manifest.variants[v]["bytes"] for v in variants}
    return {
        "load_s": load_s,
        "latency_ms": latency,
        "sizes": sizes,
        "batches": list(batches),
        "prompt": prompt,
        "past": past,
        "repeats": repeats,
        "threads": threads,
    }


def write(artifacts: Path, bench: dict, accuracy: dict, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(bench["sizes"])
    batches = bench["batches"]
    lat = bench["latency_ms"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(variants)
    for ax, kind in zip(axes, ("prefill", "decode")):
        for i, v in enumerate(variants):
            ax.bar(np.arange(len(batches)) + i * width, [lat[f"{v}|{kind}|{b}"] for b in batches], width, label=v)
        ax.set_xticks(np.arange(len(batches)) + width * (len(variants) - 1) / 2, [f"batch {b}" for b in batches])
        what = f"prefill {bench['prompt']} tokens" if kind == "prefill" else f"one decode step, past {bench['past']}"
        ax.set_title(what)
        ax.set_ylabel("ms (median)")
        ax.set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(artifacts / "report.png", dpi=110)
    plt.close(fig)

    lines = [
        f"# Export report: {title}",
        "",
        f"ONNX Runtime CPU, {bench['threads']} threads; medians of {bench['repeats']} interleaved runs.",
        "",
        "| variant | size | load | "
        + " | ".join(f"prefill b{b}" for b in batches)
        + " | "
        + " | ".join(f"decode b{b}" for b in batches)
        + " |",
        "|---" * (3 + 2 * len(batches)) + "|",
    ]
    for v in variants:
        cells = [f"{bench['sizes'][v] / 2**20:.1f} MiB", f"{bench['load_s'][v]:.2f} s"]
        cells += [f"{lat[f'{v}|prefill|{b}']:.2f} ms" for b in batches]
        cells += [f"{lat[f'{v}|decode|{b}']:.2f} ms" for b in batches]
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    lines += ["", "![latency](report.png)", ""]
    if accuracy:
        lines += [
            "## Accuracy against FP32 (held-out conversations)",
            "",
            "| variant | greedy sequences identical | differ (at an FP32 near-tie) | greedy token agreement "
            "| teacher-forced top-1 | logits cosine | perplexity | Δ perplexity | answer accuracy |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for v, a in accuracy.items():
            ans = "-" if a.get("answer_accuracy") is None else f"{a['answer_accuracy']:.2f}"
            differ = "" if v == "fp32" else f"{a.get('divergent', 0)} ({a.get('divergent_at_near_tie', 0)})"
            lines.append(
                f"| {v} | {a['greedy_sequences_identical']:.3f} | {differ} | {a['greedy_token_agreement']:.3f} "
                f"| {a['teacher_forced_top1']:.4f} | {a['logits_cosine']:.5f} | {a['perplexity']:.3f} "
                f"| {100 * a['perplexity_delta']:+.2f}% | {ans} |"
            )
        lines += [
            "",
            "differ: greedy continuations unlike FP32's; in brackets, those that first differ where "
            f"FP32's own two best logits were within {NEAR_TIE} (a near-tie: a coin flip for FP32 itself).",
        ]
        if "study-minmax-plain" in accuracy:
            lines += [
                "",
                "Calibration coverage study (not shipped): `study-minmax-covered` is MinMax calibrated on "
                "the covered set (codes, prices, phone numbers, mixed Chinese/English, long prompts), "
                "`study-minmax-plain` on the same number of plain questions only.",
            ]
        classes = sorted({k for a in accuracy.values() for k in a.get("by_class_top1", {})})
        if classes:
            lines += [
                "",
                "Teacher-forced top-1 by held-out class:",
                "",
                "| variant | " + " | ".join(classes) + " |",
                "|---" * (1 + len(classes)) + "|",
            ]
            for v, a in accuracy.items():
                if a.get("by_class_top1"):
                    lines.append(f"| {v} | " + " | ".join(f"{a['by_class_top1'][c]:.4f}" for c in classes) + " |")
    path = artifacts / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path

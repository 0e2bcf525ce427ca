"""What a prompt token costs to prefill, against a decoded token: ``python -m perf prefill-cost``.

A decode step's cost is mostly reading the weights once for the whole batch, so a token costs
less the more rows share the step, down to the runtime's ceiling at the largest batch. A prefill
pass multiplies matrices of ``rows x chunk`` tokens, which should cost a token far less again.
Where it does not (dynamic INT8 quantizing activations per pass, attention growing with the
chunk, padding), prompts take the time that decoding could have had. This measures the exported
graph on ONNX Runtime, in process, the pools' session settings:

- a decode pass at each batch size over a cache of ``--context`` tokens per row: microseconds a token;
- a prefill pass of each chunk size at each batch size (on a cached prefix of ``--prefix``
  tokens): microseconds a token, and its ratio to the decoded token at the largest batch;
- ONNX Runtime's own per-node profile of a few of those passes (``--profile``), summed by
  operator type: which operators the time goes to at each shape.

Writes ``prefill_cost.json``, ``prefill_cost.md`` and ``prefill_cost.png`` to ``--out``.

    python -m perf prefill-cost --artifacts build/artifacts/large-model --out build/prefill-cost/large
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from perf.machine import machine
from perf.markdown import table


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def pass_inputs(manifest, dtype, batch: int, prefix: int, new: int, seed: int = 0):
    """A pass of ``new`` tokens per row on a cache of ``prefix`` columns: (ids, mask, positions,
    past). Token ids and cache values are random: the cost does not depend on them."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, min(manifest.vocab_size, 4000), size=(batch, new), dtype=np.int64)
    mask = np.ones((batch, prefix + new), np.int64)
    positions = np.broadcast_to(np.arange(prefix, prefix + new, dtype=np.int64), (batch, new)).copy()
    shape = (batch, manifest.num_kv_heads, prefix, manifest.head_dim)
    past = [
        (rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype))
        for _ in range(manifest.num_layers)
    ]
    return ids, mask, positions, past


def timed_pass(decoder, inputs, repeats: int) -> float:
    """Seconds of one pass: the median of ``repeats`` after one to warm the shape."""
    decoder.forward(*inputs)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        decoder.forward(*inputs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def op_profile(trace: list[dict]) -> dict[str, float]:
    """Microseconds per operator type in an ONNX Runtime profile (its JSON's node events)."""
    out: Counter = Counter()
    for event in trace:
        if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            out[event.get("args", {}).get("op_name", "?")] += float(event.get("dur", 0))
    return dict(out)


def profiled(directory: Path, manifest, precision: str, threads: int, shape: dict, repeats: int) -> dict[str, float]:
    """Per-operator microseconds of one pass of ``shape`` (the mean of ``repeats``)."""
    import onnxruntime as ort

    from switchboard.engine.runtime import OnnxDecoder
    from switchboard.runtime import onnx

    decoder = OnnxDecoder(directory, manifest, precision, threads=threads)
    with tempfile.TemporaryDirectory() as tmp:
        opts = onnx.session_options(threads)
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "ort")
        decoder.session = ort.InferenceSession(str(decoder.path), opts, providers=onnx.CPU)
        inputs = pass_inputs(manifest, decoder.dtype, shape["batch"], shape["prefix"], shape["new"])
        decoder.forward(*inputs)  # warm: its events are dropped below
        decoder.session.end_profiling()
        decoder.session = ort.InferenceSession(str(decoder.path), opts, providers=onnx.CPU)
        decoder.forward(*inputs)  # a fresh session's first run plans its memory: not measured
        for _ in range(repeats):
            decoder.forward(*inputs)
        trace = json.loads(Path(decoder.session.end_profiling()).read_text())
    per_op = op_profile(trace)
    runs = repeats + 1
    return {op: us / runs for op, us in per_op.items()}


def measure(args) -> dict:
    from switchboard.artifact.manifest import Manifest
    from switchboard.engine.runtime import OnnxDecoder
    from switchboard.runtime.onnx import usable_cores

    manifest = Manifest.load(args.artifacts)
    threads = args.threads or usable_cores()
    precisions = args.precisions.split(",") if args.precisions else list(manifest.variants)
    results: dict = {"artifacts": str(args.artifacts), "threads": threads, "context": args.context}
    results.update(prefix=args.prefix, machine=machine(), precisions={})
    top = max(args.batches)
    for precision in precisions:
        decoder = OnnxDecoder(args.artifacts, manifest, precision, threads=threads)
        decode = {}
        for b in args.batches:
            s = timed_pass(decoder, pass_inputs(manifest, decoder.dtype, b, args.context, 1), args.repeats)
            decode[b] = s / b * 1e6
            print(f"[prefill-cost] {precision} decode batch {b}: {decode[b]:.0f} us/token", flush=True)
        prefill = {}
        for b in args.batches:
            for c in args.chunks:
                s = timed_pass(decoder, pass_inputs(manifest, decoder.dtype, b, args.prefix, c), args.repeats)
                prefill[f"{c}x{b}"] = s / (b * c) * 1e6
                print(
                    f"[prefill-cost] {precision} prefill chunk {c} batch {b}: {prefill[f'{c}x{b}']:.0f} us/token",
                    flush=True,
                )
        del decoder
        entry = {"decode_us_per_token": decode, "prefill_us_per_token": prefill, "profiles": {}}
        entry["prefill_over_decode_ceiling"] = {k: v / decode[top] for k, v in prefill.items()}
        if args.profile:
            shapes = {f"decode x{b}": {"batch": b, "prefix": args.context, "new": 1} for b in (1, top)}
            for c in (min(args.chunks), max(args.chunks)):
                shapes[f"prefill {c}x1"] = {"batch": 1, "prefix": args.prefix, "new": c}
            for name, shape in shapes.items():
                entry["profiles"][name] = profiled(args.artifacts, manifest, precision, threads, shape, args.repeats)
                print(f"[prefill-cost] {precision} profiled {name}", flush=True)
        results["precisions"][precision] = entry
    return results


def report_md(results: dict, chunks: list[int], batches: list[int]) -> str:
    top = max(batches)
    lines = [
        "# Prefill cost per token",
        "",
        f"`{results['artifacts']}`, {results['threads']} threads, decode over {results['context']} cached "
        f"tokens a row, prefill on a prefix of {results['prefix']}; {results['machine'].get('cpu', '?')}.",
        "Microseconds a token (the median of the repeats); in brackets the prefill token's cost over "
        f"a decoded token's at batch {top} (the decode ceiling).",
    ]
    for precision, entry in results["precisions"].items():
        decode, prefill = entry["decode_us_per_token"], entry["prefill_us_per_token"]
        ratio = entry["prefill_over_decode_ceiling"]
        lines += ["", f"## {precision}", ""]
        rows = [["decode", *(f"{decode[b]:.0f}" for b in batches)]]
        for c in chunks:
            cells = [f"{prefill[f'{c}x{b}']:.0f} ({ratio[f'{c}x{b}']:.2f})" for b in batches]
            rows.append([f"prefill, chunk {c}", *cells])
        lines.append(table(["us/token", *(f"batch {b}" for b in batches)], rows))
        for name, per_op in entry["profiles"].items():
            total = sum(per_op.values()) or 1.0
            ranked = sorted(per_op.items(), key=lambda kv: -kv[1])[:8]
            cells = ", ".join(f"{op} {100 * us / total:.0f}%" for op, us in ranked)
            lines.append(f"\n{name}: {total / 1000:.1f} ms of kernels; {cells}")
    return "\n".join(lines) + "\n"


def plot(results: dict, chunks: list[int], batches: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(results["precisions"]), figsize=(5.5 * len(results["precisions"]), 4), squeeze=False
    )
    for ax, (precision, entry) in zip(axes[0], results["precisions"].items()):
        for b in batches:
            ax.plot(
                chunks,
                [entry["prefill_us_per_token"][f"{c}x{b}"] for c in chunks],
                marker="o",
                label=f"prefill, batch {b}",
            )
        ceiling = entry["decode_us_per_token"][max(batches)]
        ax.axhline(ceiling, color="black", linestyle="--", label=f"decode, batch {max(batches)}")
        ax.set(xscale="log", yscale="log", xlabel="chunk (tokens a row)", ylabel="us a token", title=precision)
        ax.set_xticks(chunks, [str(c) for c in chunks])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf prefill-cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifacts", type=Path, default=Path("build/artifacts/default"), help="an export's directory")
    p.add_argument("--precisions", default="", help="comma-separated variants (default: every one exported)")
    p.add_argument("--chunks", type=_ints, default=[16, 32, 64, 128, 256], help="prefill chunk sizes")
    p.add_argument("--batches", type=_ints, default=[1, 2, 4, 8], help="rows a pass")
    p.add_argument("--context", type=int, default=256, help="cached tokens a row under a decode pass")
    p.add_argument("--prefix", type=int, default=0, help="cached tokens a row under a prefill pass")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: every usable core)")
    p.add_argument("--profile", action="store_true", help="ONNX Runtime's per-operator profile of a few passes")
    p.add_argument("--out", type=Path, default=Path("build/prefill-cost"))
    args = p.parse_args(argv)
    if not (args.artifacts / "manifest.json").exists():
        p.error(f"{args.artifacts} has no manifest.json: export a model there first (make export)")
    if not args.chunks or not args.batches or min(args.chunks + args.batches) < 1:
        p.error("--chunks and --batches need positive integers")
    results = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill_cost.json").write_text(json.dumps(results, indent=2))
    (args.out / "prefill_cost.md").write_text(report_md(results, args.chunks, args.batches))
    plot(results, args.chunks, args.batches, args.out / "prefill_cost.png")
    print(f"[prefill-cost] {args.out / 'prefill_cost.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A packed pass against the padded pass and a pass per new length: ``python -m perf packed-cost``.

The padded pass feeds every row as wide as the widest; the packed pass feeds only the real
tokens (switchboard/engine/packing.py); a pass per new length runs each group of rows that take
as many new tokens in its own padded pass (a prompt's chunk, then the decode rows). This exports
a checkpoint's padded graph (export/onnx_export.py's ``export``) and its packed graph
(``export_packed``) in FP32, unless ``--out`` holds them already, and times the three on the
same rows with ONNX Runtime in process, interleaved: a prompt's chunk beside decode rows, decode
rows alone, rows verifying drafts of different lengths. ``--profile`` adds ONNX Runtime's
profile of the packed and the chunk's own pass at the largest chunk, by operator.

Writes ``packed_cost.json`` and ``packed_cost.md`` to ``--out``.

    python -m perf packed-cost --checkpoint build/large-model --out build/packed-cost/large
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from perf.machine import machine
from perf.markdown import table
from perf.prefill_cost import op_profile
from switchboard.export import packed_choice


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def graphs(checkpoint: Path, out: Path) -> tuple[Path, Path]:
    """The checkpoint's padded and packed FP32 graphs in ``out`` (each exported when absent)."""
    padded, packed = out / "padded" / "model.onnx", out / "packed" / "model.onnx"
    if padded.exists() and packed.exists():
        return padded, packed
    import torch
    from transformers import AutoModelForCausalLM

    from switchboard.artifact.geometry import geometry
    from switchboard.export import onnx_export

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    geo = geometry(model.config)
    for path, export in ((padded, onnx_export.export), (packed, onnx_export.export_packed)):
        if not path.exists():
            print(f"[packed-cost] exporting {checkpoint} to {path}", flush=True)
            export(model, geo, path)
    return padded, packed


def measure(args) -> dict:
    from switchboard.runtime.onnx import session, session_options

    padded_path, packed_path = graphs(args.checkpoint, args.out)
    padded, packed = session(padded_path, args.threads), session(packed_path, args.threads)
    b, t = args.rows, args.context
    results = {
        "checkpoint": str(args.checkpoint),
        "rows": b,
        "context": t,
        "threads": args.threads,
        "repeats": args.repeats,
        "machine": machine(),
        "passes": packed_choice.time_passes(
            padded, packed, args.chunks, b, t, args.repeats, say=lambda line: print(f"[packed-cost] {line}", flush=True)
        ),
    }
    if args.profile:
        chunk = max(args.chunks)
        rows = packed_choice.cases([chunk], b)[f"a {chunk}-token chunk + {b - 1} decode rows"]
        past, mask, next_pos = packed_choice.cache(padded, b, t)
        feed, _ = packed_choice.packed_feed(rows, past, mask, next_pos)
        alone = packed_choice.padded_feed(rows, past, mask, next_pos, [0])
        results["profiles"] = {}
        for label, path, f in (("packed", packed_path, feed), (f"the chunk's own pass ({chunk})", padded_path, alone)):
            opts = session_options(args.threads)
            opts.enable_profiling = True
            opts.profile_file_prefix = str(args.out / "profile")
            import onnxruntime as ort

            s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            for _ in range(3):
                s.run(["logits"], f)
            trace = json.loads(Path(s.end_profiling()).read_text())
            results["profiles"][label] = {op: us / 3 for op, us in op_profile(trace).items()}
    return results


def report_md(results: dict) -> str:
    rows = []
    for name, r in results["passes"].items():
        ms = r["ms"]
        rows.append(
            [
                name,
                f"{r['tokens']} / {r['padded_tokens']}",
                f"{ms['padded']:.1f}",
                f"{ms['packed']:.1f}",
                f"{ms['per_length']:.1f}",
                f"{ms['packed'] / ms['padded']:.2f}",
                f"{ms['packed'] / ms['per_length']:.2f}",
            ]
        )
    header = ["rows in the pass", "tokens packed / padded", "padded ms", "packed ms", "a pass per length ms"]
    header += ["packed / padded", "packed / per length"]
    lines = [
        f"# Packed against padded passes: {results['checkpoint']}",
        "",
        f"ONNX Runtime FP32, {results['threads']} threads, {results['rows']} rows of {results['context']} cached "
        f"tokens each, median of {results['repeats']} interleaved runs; {results['machine'].get('cpu', '')}.",
        "",
        table(header, rows),
    ]
    for label, per_op in results.get("profiles", {}).items():
        total = sum(per_op.values()) or 1.0
        top = sorted(per_op.items(), key=lambda kv: -kv[1])[:6]
        shares = ", ".join(f"{op} {us / 1000:.0f} ms ({us / total:.0%})" for op, us in top)
        lines += ["", f"Profile, {label}: {total / 1000:.0f} ms a pass; {shares}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf packed-cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=Path("build/default-model"), help="a Hugging Face checkpoint")
    p.add_argument("--out", type=Path, default=Path("build/packed-cost/default"), help="graphs and the report")
    p.add_argument("--chunks", type=_ints, default=[16, 64, 128], help="prompt chunk sizes (default 16,64,128)")
    p.add_argument("--rows", type=int, default=8, help="rows in a pass (default 8)")
    p.add_argument("--context", type=int, default=120, help="cached tokens a row (default 120)")
    p.add_argument("--repeats", type=int, default=25, help="timed runs of each pass (default 25)")
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (default 2)")
    p.add_argument("--profile", action="store_true", help="ONNX Runtime's per-operator profile at the largest chunk")
    args = p.parse_args(argv)
    if args.rows < 2 or not args.chunks or args.repeats < 1:
        p.error("--rows needs 2 or more, --chunks one size or more, --repeats 1 or more")
    if not (args.checkpoint / "config.json").exists():
        print(f"packed-cost: {args.checkpoint} is not a checkpoint (no config.json)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results = measure(args)
    (args.out / "packed_cost.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "packed_cost.md").write_text(report_md(results))
    print(f"[packed-cost] {args.out / 'packed_cost.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from perf.machine import machine
from perf.markdown import table
from perf.prefill_cost import op_profile

DRAFTS = (0, 0, 0, 0, 2, 4, 7, 1)  # rows verifying drafts of these lengths (plus each row's next token)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def cases(chunks: list[int], rows: int, seed: int = 0) -> dict[str, list[list[int]]]:
    """The passes to time, by name: each row's new token ids (random: the cost does not depend on
    them)."""
    rng = np.random.default_rng(seed)

    def tokens(n: int) -> list[int]:
        return [int(t) for t in rng.integers(10, 4000, n)]

    out = {
        f"a {c}-token chunk + {rows - 1} decode rows": [tokens(c)] + [tokens(1) for _ in range(rows - 1)]
        for c in chunks
    }
    out[f"{rows} decode rows"] = [tokens(1) for _ in range(rows)]
    drafts = [DRAFTS[i % len(DRAFTS)] for i in range(rows)]
    out[f"{rows} rows verifying drafts of {','.join(map(str, drafts))}"] = [tokens(d + 1) for d in drafts]
    return out


def padded_feed(rows: list[list[int]], past: dict, mask: np.ndarray, next_pos: np.ndarray, idx: list[int]) -> dict:
    """The padded graph's inputs for rows ``idx``: [b, S], each row right-aligned."""
    from switchboard.engine.packing import pack

    p = pack([rows[i] for i in idx], next_pos[idx], mask[idx])
    b, s = len(idx), p.width
    ids, pos = np.zeros(b * s, np.int64), np.zeros(b * s, np.int64)
    ids[p.token_index], pos[p.token_index] = p.input_ids[0], p.position_ids[0]
    feed = {"input_ids": ids.reshape(b, s), "attention_mask": p.attention_mask, "position_ids": pos.reshape(b, s)}
    feed["logits_index"] = np.array([-1], np.int64)
    return feed | {name: a[idx] for name, a in past.items()}


def packed_feed(rows: list[list[int]], past: dict, mask: np.ndarray, next_pos: np.ndarray) -> tuple[dict, object]:
    from switchboard.engine.packing import pack

    p = pack(rows, next_pos, mask)
    return p.inputs() | past, p


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
    inputs = {i.name: i for i in padded.get_inputs()}
    pasts = [n for n in inputs if n.startswith("past_key_values")]
    _, heads, _, dim = inputs[pasts[0]].shape
    rng = np.random.default_rng(0)
    b, t = args.rows, args.context
    past = {n: rng.standard_normal((b, heads, t, dim)).astype(np.float32) for n in pasts}
    mask, next_pos = np.ones((b, t), np.int64), np.full(b, t, np.int64)
    results = {
        "checkpoint": str(args.checkpoint),
        "rows": b,
        "context": t,
        "threads": args.threads,
        "repeats": args.repeats,
        "machine": machine(),
        "passes": {},
    }
    for name, rows in cases(args.chunks, b).items():
        feed, p = packed_feed(rows, past, mask, next_pos)
        full = padded_feed(rows, past, mask, next_pos, list(range(b)))
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(len(r), []).append(i)
        per_length = [padded_feed(rows, past, mask, next_pos, idx) for idx in groups.values()]
        runs = {
            "padded": lambda full=full: padded.run(["logits"], full),
            "packed": lambda feed=feed: packed.run(["logits"], feed),
            "per_length": lambda feeds=per_length: [padded.run(["logits"], f) for f in feeds],
        }
        for run in runs.values():
            run()  # the shape warmed
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.repeats):
            for k, run in runs.items():
                t0 = time.perf_counter()
                run()
                times[k].append(time.perf_counter() - t0)
        ms = {k: statistics.median(v) * 1000 for k, v in times.items()}
        results["passes"][name] = {"tokens": p.tokens, "padded_tokens": p.padded_tokens(), "ms": ms}
        print(f"[packed-cost] {name}: {ms['padded']:.1f} / {ms['packed']:.1f} / {ms['per_length']:.1f} ms", flush=True)
    if args.profile:
        chunk = max(args.chunks)
        rows = cases([chunk], b)[f"a {chunk}-token chunk + {b - 1} decode rows"]
        feed, _ = packed_feed(rows, past, mask, next_pos)
        alone = padded_feed(rows, past, mask, next_pos, [0])
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

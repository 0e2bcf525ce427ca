"""INT8 on a checkpoint, with and without SmoothQuant: ``python -m switchboard.export.int8_study``.

What a real model's activations do to INT8, in one report:

- **outliers per layer**: for every projection's input (q/k/v, o, gate/up, down), how far its
  largest input channel stands above the median channel (``max / median`` of the per-channel
  ``max |x|`` over the calibration prompts, which cover the long tail: order codes, prices,
  phone numbers, mixed Chinese and English, long conversations), before and after smoothing;
- **the gate, both ways**: each INT8 variant exported from the plain graph and from the
  smoothed one (``--smooth-alpha``), held to the accuracy gate against FP32 on the held-out
  conversations, with teacher-forced top-1 per long-tail class.

Both exports run the whole exporter (``switchboard.export.run_export``: parity, calibration,
quantization, gate) into ``--out``/plain and ``--out``/smoothed; the report goes to ``--report``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from switchboard import paths

PROJECTIONS = (("qkv", "q/k/v in"), ("o", "o in"), ("gate_up", "gate/up in"), ("down", "down in"))


def outliers(model, prompts: list[list[int]]) -> list[dict]:
    """Per layer and projection input: max / median of the per-channel max |x|, and the max."""
    from switchboard.export import smooth

    stats = smooth.input_maxima(model, prompts)
    rows = []
    for i in range(len(model.model.layers)):
        row = {"layer": i}
        for key, _ in PROJECTIONS:
            x = stats[f"{i}.{key}"]
            row[key] = {"ratio": float(x.max() / x.median().clamp(min=1e-8)), "max": float(x.max())}
        rows.append(row)
    return rows


def study(
    model_dir: Path, out: Path, precisions: list[str], gate, alpha: float, say=print, heldout_per_class: int = 24
) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from switchboard.artifact.manifest import Manifest
    from switchboard.artifact.tokenizer import TextTokenizer
    from switchboard.engine import heads
    from switchboard.export import calibration, smooth
    from switchboard.export.__main__ import _prompts, run_export

    runs = {}
    for name, a in (("plain", 0.0), ("smoothed", alpha)):
        say(f"exporting {', '.join(precisions)} from the {name} graph")
        t0 = time.monotonic()
        run_export(model_dir, out / name, precisions, gate=gate, bench_batches=None, required={"fp32"},
                   smooth_alpha=a, heldout_per_class=heldout_per_class, console=None)  # fmt: skip
        m = Manifest.load(out / name)
        runs[name] = {
            "accuracy": m.accuracy,
            "left_out": m.left_out,
            "smoothing": m.source.get("int8_smoothing", {}),
            "seconds": round(time.monotonic() - t0),
        }
    tok = TextTokenizer(out / "plain")
    info = (
        json.loads((model_dir / "switchboard.json").read_text()) if (model_dir / "switchboard.json").is_file() else {}
    )
    prompts = _prompts(tok, info.get("system_prompt"), calibration.calibration_set(8), 512)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    heads.restrict(model, model_dir)
    before = outliers(model, prompts)
    smoothed = smooth.smoothed(model, prompts, alpha)
    after = outliers(smoothed, prompts) if smoothed is not None else None
    return {
        "model": str(model_dir),
        "alpha": alpha,
        "heldout_per_class": heldout_per_class,
        "runs": runs,
        "outliers": {"plain": before, "smoothed": after},
    }


def report(result: dict, gate, title: str) -> str:
    lines = [f"# INT8 study: {title}", ""]
    lines += [
        "Each INT8 variant exported from the plain graph and from a SmoothQuant-smoothed one (alpha "
        f"{result['alpha']}), held to the accuracy gate against FP32 ({gate.describe()}) on the "
        "held-out conversations. Command:",
        "",
        "```bash",
        f"python -m switchboard.export.int8_study --model {result['model']}"
        + (f" --heldout-per-class {n}" if (n := result.get("heldout_per_class", 24)) != 24 else ""),
        "```",
        "",
        "## The gate",
        "",
        "| graph | variant | greedy identical | top-1 | cosine | perplexity | codes | prices | phones | mixed | long "
        "| plain | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run in result["runs"].items():
        for variant, acc in run["accuracy"].items():
            if variant == "fp32":
                continue
            c = acc.get("by_class_top1", {})
            verdict = "left out: " + "; ".join(run["left_out"][variant]) if variant in run["left_out"] else "passes"
            lines.append(
                f"| {name} | {variant} | {acc['greedy_sequences_identical']:.3f} | {acc['teacher_forced_top1']:.4f} "
                f"| {acc['logits_cosine']:.5f} | {100 * acc['perplexity_delta']:+.2f}% | "
                + " | ".join(
                    f"{c.get(k, float('nan')):.3f}" for k in ("codes", "prices", "phones", "mixed", "long", "plain")
                )
                + f" | {verdict} |"
            )
    lines += ["", "## Activation outliers per layer", ""]
    lines += [
        "max / median of the per-channel largest |activation| at each projection's input, over the "
        "calibration prompts (the largest value in brackets); plain -> smoothed.",
        "",
        "| layer | " + " | ".join(label for _, label in PROJECTIONS) + " |",
        "|---|" + "---|" * len(PROJECTIONS),
    ]
    plain, smoothed = result["outliers"]["plain"], result["outliers"]["smoothed"]
    for i, row in enumerate(plain):
        cells = []
        for key, _ in PROJECTIONS:
            a = row[key]
            cell = f"{a['ratio']:.0f} ({a['max']:.0f})"
            if smoothed is not None:
                b = smoothed[i][key]
                cell += f" -> {b['ratio']:.0f} ({b['max']:.0f})"
            cells.append(cell)
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    if smoothed is None:
        lines += ["", "Smoothing was not applied (the family is not supported, or it changed the logits)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from switchboard import console
    from switchboard.export.accuracy import Gate

    p = argparse.ArgumentParser(prog="python -m switchboard.export.int8_study", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--out", type=Path, default=None, help="where both exports go (default build/int8-study/<name>)")
    p.add_argument("--precision", default="fp32,int8-dynamic,int8-minmax,int8-percentile")
    p.add_argument("--smooth-alpha", type=float, default=0.5)
    p.add_argument("--report", type=Path, help="markdown report (default <out>/study.md)")
    p.add_argument(
        "--heldout-per-class", type=int, default=24, help="held-out conversations per class in the gate (6 classes)"
    )
    args = p.parse_args(argv)
    out = args.out or paths.BUILD / "int8-study" / args.model.name
    gate = Gate(0.80, 0.97, 0.99, 0.10)
    precisions = [x.strip() for x in args.precision.split(",") if x.strip()]
    with console.step("int8-study") as c:
        result = study(args.model, out, precisions, gate, args.smooth_alpha, c.line, args.heldout_per_class)
        (out / "study.json").write_text(json.dumps(result, indent=1) + "\n")
        path = args.report or out / "study.md"
        path.write_text(report(result, gate, args.model.name))
        c.line(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

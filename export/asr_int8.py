"""INT8 on a pretrained Whisper, measured: ``python -m switchboard.export.asr_int8``.

What the speech exporter's INT8 (``switchboard.export.asr``: dynamic, per-channel weights, the
activations quantized per tensor on the fly) does to real weights, in one report:

1. Activation outliers per layer: the largest |activation| of each projection's input against
   its median channel's, while the model transcribes calibration speech (corpus FAQ questions,
   not the held-out ones, in two espeak-ng voices). One INT8 scale per tensor must cover the
   largest channel, so a ratio of 100 leaves the median channel about one step of its 127.
2. SmoothQuant (``export.smooth.smoothed_whisper``, Xiao et al. 2023): the outliers moved into
   the weights where a fold is exact (LayerNorms in front of q/k/v, fc1, cross-attention q and
   k/v; v_proj in front of each out_proj), the same function in FP32 (checked), the ratios
   measured again.
3. The accuracy gate's measure (``AsrGate``) on every held-out clip of the languages the
   checkpoint is judged in (English for pretrained Whisper: docs/voice.md): FP32, INT8 from the
   plain graphs, INT8 from the smoothed ones, and INT8 with the projections ``--keep-fp32``
   names left in FP32 (the exporter's rungs); and the graphs' sizes (speed is the benchmarks':
   ``make bench-asr-base``).

Writes ``report.md`` and ``results.json`` to ``--out`` (and the report to ``--report``, e.g.
docs/export-report-whisper-base.md); the exports it makes stay under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from switchboard import paths

CALIBRATION_VOICES = ("en-us", "en-gb+f3")


def calibration_features(n: int, seed: int = 0) -> list[np.ndarray]:
    """[80, 3000] windows of ``n`` corpus FAQ questions (the training ones: the gate's are held
    out), the voices taking turns."""
    from switchboard.asr.features import log_mel
    from switchboard.data import corpus, speech

    texts = corpus.spoken_questions("en", seed)[:n]
    out = []
    for i, text in enumerate(texts):
        samples = speech.synthesize(text, "en", CALIBRATION_VOICES[i % len(CALIBRATION_VOICES)])
        out.append(log_mel(samples, 80, frames=3000))
    return out


def drive(model, features: list[np.ndarray], batch: int = 8, max_new_tokens: int = 48):
    """A function that has ``model`` transcribe ``features`` (English, greedy): what the
    activation statistics are gathered over."""
    import torch

    def run() -> None:
        with torch.no_grad():
            for i in range(0, len(features), batch):
                x = torch.from_numpy(np.stack(features[i : i + batch]))
                model.generate(input_features=x, language="en", task="transcribe", max_new_tokens=max_new_tokens)

    return run


def same_function(a, b, features: list[np.ndarray]) -> float:
    """Largest |logit difference| of ``b`` against ``a``, relative to a's largest logit, over a
    few teacher-forced steps on the first calibration window."""
    import torch

    g = a.generation_config
    prompt = [g.decoder_start_token_id]
    if getattr(g, "is_multilingual", False):
        prompt += [g.lang_to_id["<|en|>"], g.task_to_id["transcribe"]]
    x = torch.from_numpy(features[0][None])
    ids = torch.tensor([prompt + [g.no_timestamps_token_id, 440, 1318, 307]])  # the prompt, a few words
    with torch.no_grad():
        ref = a(input_features=x, decoder_input_ids=ids).logits
        got = b(input_features=x, decoder_input_ids=ids).logits
    return float((got - ref).abs().max() / ref.abs().max())


def save_checkpoint(model, source: Path, out: Path) -> Path:
    """``model`` as a checkpoint directory beside ``source``'s side files (tokenizer, configs)."""
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    for f in source.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy2(f, out / f.name)
    return out


def export_variant(model_dir: Path, out: Path, say) -> None:
    """FP32 and INT8 graphs of ``model_dir`` in ``out``, checked against PyTorch, no gate."""
    from switchboard.export.asr import run_export

    run_export(model_dir, out, ["fp32", "int8-dynamic"], set(), None, bench_batches=(), threads=2, console=say)


def keep_variant(plain: Path, out: Path, keep: tuple[str, ...]) -> Path:
    """An export beside ``plain`` (its FP32 graphs linked) whose INT8 leaves the weight MatMuls
    under the module paths ``keep`` names in FP32, in both graphs."""
    from switchboard.asr.runtime import AsrManifest
    from switchboard.export.asr import DECODER, ENCODER, graph_files, quantize_int8_dynamic

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in plain.iterdir():
        if f.is_file() and ".int8" not in f.name and not f.name.startswith("."):
            (out / f.name).hardlink_to(f)
    enc, dec = graph_files("int8-dynamic")
    quantize_int8_dynamic(out / f"{ENCODER}.onnx", out / enc, keep)
    quantize_int8_dynamic(out / f"{DECODER}.onnx", out / dec, keep)
    AsrManifest.load(out)  # the manifest names both precisions already
    return out


def layer_table(before: dict, after: dict, side: str, layers: int) -> list[str]:
    kinds = ["qkv", "out", "fc1", "fc2"] + (["cross_q", "cross_out"] if side == "decoder" else [])
    lines = [
        f"| {side} layer | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for i in range(layers):
        cells = []
        for k in kinds:
            b, a = before[f"{side}.{i}.{k}"], after[f"{side}.{i}.{k}"]
            cells.append(f"{b['ratio']:.0f} ({b['max']:.0f}) → {a['ratio']:.0f}")
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    return lines


def report(results: dict) -> str:
    r = results
    lines = [
        f"# Export report: {r['name']} (INT8 on real weights)",
        "",
        f"Command: `{r['command']}` ({r['date']}, {r['machine']}). ONNX Runtime CPU, 2 threads.",
        "",
        "## Accuracy (the gate's measure, every held-out clip)",
        "",
        f"{r['clips']} held-out English clips (`speech.heldout_clips('en')`: the corpus's held-out questions, "
        f"slots filled, in the plain voice and the unseen one; judged in "
        f"{', '.join(r['languages'])}; {r['not_judged']}). Gate: {r['gate_rule']}.",
        "",
        "| variant | WER | word for word | of FP32's kept | transcripts as FP32's | gate | size |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in r["variants"]:
        lines.append(
            f"| {row['variant']} | {row['wer']:.3f} | {row['exact']} of {row['clips']} | {row['kept_exact']} | "
            f"{row['same_as_fp32']:.0%} | {row['verdict']} | {row['mib']:.0f} MiB |"
        )
    lines += [
        "",
        "Size: encoder and decoder graphs. Speed, served, beside faster-whisper: docs/benchmarks.md "
        "(`make bench-asr-base`).",
        "",
        "## Activation outliers per layer, and what SmoothQuant changes",
        "",
        f"Largest |activation| of each projection's input over its median channel's largest, while the model "
        f"transcribes {r['calibration_clips']} calibration clips (corpus FAQ questions, not held out; "
        f"{' and '.join(CALIBRATION_VOICES)}); in brackets the largest |activation| itself; after the arrow, the "
        f"ratio once smoothed (SmoothQuant, alpha {r['alpha']}; fc2 reads GELU(fc1), which no fold passes, so "
        f"it is unchanged). The smoothed model computes the same logits within {r['smoothed_logit_diff']:.0e} "
        f"(relative).",
        "",
    ]
    lines += layer_table(r["outliers"]["before"], r["outliers"]["after"], "encoder", r["encoder_layers"])
    lines.append("")
    lines += layer_table(r["outliers"]["before"], r["outliers"]["after"], "decoder", r["decoder_layers"])
    b, a = r["outliers"]["before"]["decoder.cross_kv"], r["outliers"]["after"]["decoder.cross_kv"]
    lines += [
        "",
        f"Cross-attention k/v (the encoder's output, read by every decoder layer): {b['ratio']:.0f} "
        f"({b['max']:.0f}) → {a['ratio']:.0f}.",
        "",
        "## What this says",
        "",
        *r["conclusions"],
        "",
    ]
    return "\n".join(lines)


def conclusions(variants: list[dict], before: dict, after: dict) -> list[str]:
    fp32 = variants[0]
    top = sorted(before.items(), key=lambda kv: -kv[1]["ratio"])[:5]
    worst_after = max(after.items(), key=lambda kv: kv[1]["ratio"])
    out = [
        "- The five largest outlier ratios: "
        + ", ".join(f"`{name}` {o['ratio']:.0f} (channel {o['top_channel']})" for name, o in top)
        + f"; smoothed, the largest left is {worst_after[1]['ratio']:.0f} at `{worst_after[0]}`.",
    ]
    for v in variants[1:]:
        if v["variant"].startswith("int8"):
            out.append(
                f"- {v['variant']}: WER {v['wer']:.3f} against FP32's {fp32['wer']:.3f}, {v['kept_exact']} of FP32's "
                f"{fp32['exact']} word-for-word transcripts kept, {v['mib']:.0f} MiB: {v['verdict']}."
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.export.asr_int8", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=paths.BUILD / "asr-whisper-base", help="Whisper checkpoint directory")
    p.add_argument("--out", type=Path, default=paths.BUILD / "int8-report" / "whisper-base", help="work folder")
    p.add_argument("--report", type=Path, help="also write the report here (e.g. docs/export-report-whisper-base.md)")
    p.add_argument("--alpha", type=float, default=0.5, help="SmoothQuant's migration strength")
    p.add_argument("--calibration-clips", type=int, default=16)
    p.add_argument("--gate-clips", type=int, default=0, help="held-out clips per language (0: all)")
    p.add_argument(
        "--keep-fp32",
        action="append",
        default=[],
        metavar="SCOPES",
        help="also INT8 with these module paths (comma-separated substrings, e.g. fc2 or decoder.layers.2.fc2) "
        "left FP32 (repeatable)",
    )
    args = p.parse_args(argv)
    if not (args.model / "config.json").is_file():
        p.error(f"--model {args.model}: no config.json (make model-asr-base builds Whisper base)")
    import torch
    from transformers import WhisperForConditionalGeneration

    from switchboard import console
    from switchboard.asr.runtime import AsrManifest
    from switchboard.export import smooth
    from switchboard.export.asr import AsrGate, evaluate, gate_clips, gate_languages

    torch.set_num_threads(2)
    command = "python -m switchboard.export.asr_int8 " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    with console.step("asr-int8", args.out / "asr-int8.log") as say:
        model = WhisperForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32).eval()
        t0 = time.monotonic()
        calib = calibration_features(args.calibration_clips)
        before = smooth.whisper_input_maxima(model, drive(model, calib))
        smoothed = smooth.smoothed_whisper(model, before, args.alpha)
        diff = same_function(model, smoothed, calib)
        if diff > 1e-3:
            raise SystemExit(f"the smoothed model's logits differ by {diff:.1e} (relative): a fold is wrong")
        after = smooth.whisper_input_maxima(smoothed, drive(smoothed, calib))
        say.line(
            f"outliers measured on {len(calib)} clips, smoothed (logits within {diff:.0e}) in "
            f"{time.monotonic() - t0:.0f} s"
        )
        smooth_dir = save_checkpoint(smoothed, args.model, args.out / "smoothed-checkpoint")
        del smoothed
        plain_out, smooth_out = args.out / "plain", args.out / "smoothed"
        export_variant(args.model, plain_out, say)
        export_variant(smooth_dir, smooth_out, say)
        manifest = AsrManifest.load(plain_out)
        langs, not_judged = gate_languages(args.model, manifest)
        clips = gate_clips(manifest, args.gate_clips, langs)
        say.line(f"transcribing {len(clips)} held-out clips four times (FP32 and INT8, plain and smoothed)")
        plain = evaluate(plain_out, ["fp32", "int8-dynamic"], clips, threads=2)
        smoothed_eval = evaluate(smooth_out, ["fp32", "int8-dynamic"], clips, threads=2)
        kept = {}
        for i, spec in enumerate(args.keep_fp32):
            keep = tuple(x.strip() for x in spec.split(",") if x.strip())
            directory = keep_variant(plain_out, args.out / f"keep-{i}", keep)
            kept[spec] = (
                directory,
                evaluate(directory, ["fp32", "int8-dynamic"], clips, 2, {"fp32": plain["fp32"]["texts"]}),
            )
        gate = AsrGate()
        lang = langs[0]

        def row(name: str, result: dict, fp32: dict, artifacts: Path, precision: str) -> dict:
            r = result["languages"][lang]
            files = [
                artifacts / f for f in AsrManifest.load(artifacts).precisions[precision].values() if isinstance(f, str)
            ]
            reasons = gate.failures(result, fp32) if precision != "fp32" else []
            return {
                "variant": name,
                "wer": r["error_rate"],
                "exact": r["exact"],
                "kept_exact": r["kept_exact"],
                "same_as_fp32": r["same_as_fp32"],
                "clips": r["clips"],
                "verdict": "-"
                if precision == "fp32"
                else ("passes" if not reasons else "refused: " + "; ".join(reasons)),
                "mib": sum(f.stat().st_size for f in files) / 2**20,
            }

        variants = [
            row("fp32", plain["fp32"], plain["fp32"], plain_out, "fp32"),
            row("int8-dynamic", plain["int8-dynamic"], plain["fp32"], plain_out, "int8-dynamic"),
            row("fp32, smoothed", smoothed_eval["fp32"], plain["fp32"], smooth_out, "fp32"),
            row("int8-dynamic, smoothed", smoothed_eval["int8-dynamic"], plain["fp32"], smooth_out, "int8-dynamic"),
        ]
        for spec, (directory, result) in kept.items():
            name = f"int8-dynamic, {spec} kept FP32"
            variants.append(row(name, result["int8-dynamic"], plain["fp32"], directory, "int8-dynamic"))
        before_o, after_o = smooth.outliers(before), smooth.outliers(after)
        about = args.model / "switchboard.json"
        info = json.loads(about.read_text()) if about.is_file() else {}
        results = {
            "name": info.get("name", args.model.name),
            "command": command,
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{os.cpu_count()} CPUs",
            "clips": len(clips),
            "languages": langs,
            "not_judged": "; ".join(f"{k} not judged: {v}" for k, v in not_judged.items()) or "every language judged",
            "gate_rule": gate.describe(),
            "alpha": args.alpha,
            "calibration_clips": len(calib),
            "smoothed_logit_diff": diff,
            "encoder_layers": model.config.encoder_layers,
            "decoder_layers": model.config.decoder_layers,
            "variants": variants,
            "outliers": {"before": before_o, "after": after_o},
            "conclusions": conclusions(variants, before_o, after_o),
        }
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        text = report(results)
        (args.out / "report.md").write_text(text)
        if args.report:
            args.report.write_text(text)
        say.line(f"report: {args.report or args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Export a Hugging Face causal LM for Switchboard: ``python -m switchboard.export``.

Writes ONNX (FP32) with KV cache, a calibrated INT8 variant, the tokenizer and a manifest
(with fingerprints) to ``--out``, checks the graph against PyTorch, and optionally installs
the artifacts into a Triton model repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
import time
from pathlib import Path

from switchboard import paths
from switchboard.artifact.tokenizer import FALLBACK_TEMPLATE
from switchboard.repository.install import CHAT_MODELS, install_chat
from switchboard.stamp import Stamp

log = logging.getLogger("switchboard.export")
HERE = Path(__file__).resolve().parent


def _digest_dir(path: Path) -> str:
    from switchboard.artifact.manifest import file_digest

    files = [p for p in sorted(Path(path).iterdir()) if p.is_file() and not p.name.startswith(".")]
    return file_digest(files)


def _inputs_digest(model_dir: Path, precisions: list[str]) -> str:
    h = hashlib.sha256(_digest_dir(model_dir).encode())
    for f in sorted(HERE.glob("*.py")) + sorted((paths.ROOT / "switchboard" / "engine").glob("*.py")):
        h.update(f.read_bytes())
    h.update(",".join(precisions).encode())
    return h.hexdigest()[:16]


def _end_of_turn(tok) -> int | None:
    """The token the chat template closes an assistant turn with (Gemma: ``<end_of_turn>``;
    most templates: EOS), read off a rendering: the first token after the answer's text."""
    marker = "Switchboard-end-of-turn-probe"
    try:
        text = tok.template.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}])
    except Exception:  # a template that refuses this conversation: fall back to EOS
        text = ""
    after = text.split(marker, 1)[1] if marker in text else ""
    for token in tok.encode(after) if after.strip() else []:
        if tok.decode([token], skip_special_tokens=False).strip():
            return token
    return tok.token_id(tok.eos_token) if tok.eos_token else None


def _prompts(tok, system_prompt: str | None, conversations: list[list[dict]], limit: int) -> list[list[int]]:
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [tok.encode(tok.template.render(system + c))[-limit:] for c in conversations]


VARIANTS = ("fp32", "int8-dynamic", "int8-minmax", "int8-entropy", "int8-percentile")
# `--precision default`: FP32 and the INT8 variants tried by default. A default INT8 variant that
# fails the accuracy gate is left out (named, with the failing metric), not shipped and not an
# error: the default path must not hinge on a variant that passes on one machine's training run
# and not on another's. A variant asked for by name must pass, or the export fails.
DEFAULT_PRECISIONS = ("fp32", "int8-dynamic", "int8-percentile")


def parse_precisions(value: str) -> tuple[list[str], set[str]]:
    """``--precision`` as (variants to build, variants that must pass the gate)."""
    if value.strip() == "default":
        return list(DEFAULT_PRECISIONS), {"fp32"}
    precisions = list(dict.fromkeys(x.strip() for x in value.split(",") if x.strip()))
    bad = set(precisions) - set(VARIANTS)
    if bad or "fp32" not in precisions:
        raise ValueError(f"fp32 is required; unknown: {', '.join(sorted(bad)) or '-'}")
    return precisions, set(precisions)


def run_export(
    model_dir: Path,
    out: Path,
    precisions: list[str],
    check: bool = True,
    parts: tuple[str, ...] = ("mlp", "attention"),
    calibration_per_class: int = 8,
    gate=None,
    heldout_per_class: int = 24,
    bench_batches: tuple[int, ...] | None = (1, 8, 32),
    bench_repeats: int = 5,
    bench_prompt: int = 64,
    required: set[str] | None = None,
    coverage_study: bool = False,
    smooth_alpha: float = 0.5,
    packed: bool = False,
    console=None,
) -> dict:
    """Export, check, quantize, gate and report; returns the manifest as a dict.

    ``required``: variants that must pass the gate (default: all of ``precisions``); the others
    are left out when they fail. ``smooth_alpha``: INT8 variants are made from a smoothed copy
    of the model (``export.smooth``; 0: from the plain graph). ``packed``: FP32 and INT8 dynamic
    also as the packed pass's graph, checked against PyTorch, timed against the padded graph and
    chosen where cheaper (``export.packed_choice``). ``console``: where the step's lines and bars go.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from switchboard import console as console_mod
    from switchboard.artifact.geometry import geometry
    from switchboard.artifact.manifest import Manifest, file_digest
    from switchboard.artifact.tokenizer import TextTokenizer
    from switchboard.engine import heads
    from switchboard.engine.runtime import OnnxDecoder
    from switchboard.export import (
        accuracy,
        calibration,
        onnx_export,
        packed_choice,
        parity,
        quantize,
        smooth,
        speculation,
    )

    say = console or console_mod.detached("export")
    required = set(precisions) if required is None else required
    t0 = time.time()
    config = AutoConfig.from_pretrained(model_dir)
    try:
        geo = geometry(config)
    except ValueError as e:
        raise SystemExit(f"{model_dir}: {e}") from None
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*"):
        if stale.is_file():
            stale.unlink()

    log.info("loading %s (%s)", model_dir, config.model_type)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not tokenizer.chat_template:
        if tokenizer.eos_token is None:
            raise SystemExit(f"{model_dir}: the tokenizer has neither a chat template nor an EOS token")
        say.line(f"{model_dir} has no chat template; using `role: content<eos>` turns")
        tokenizer.chat_template = FALLBACK_TEMPLATE
    tokenizer.save_pretrained(out)  # always writes tokenizer.json (fast tokenizer)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    output_vocabulary = heads.restrict(model, model_dir)  # a fine-tune's slice of a large vocabulary
    if output_vocabulary is not None:
        shutil.copy(model_dir / heads.FILE, out / heads.FILE)
        say.line(f"output vocabulary: {len(output_vocabulary)} of {geo.vocab_size} tokens ({heads.FILE})")
    info_path = model_dir / "switchboard.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    system_prompt = info.get("system_prompt")

    parameters = sum(p.numel() for p in model.parameters())
    say.line(f"{model_dir} ({config.model_type}, {parameters / 1e6:.1f}M parameters) -> {out}: {', '.join(precisions)}")
    log.info("exporting ONNX with KV cache")
    fp32 = onnx_export.export(model, geo, out / "model.onnx")
    tok = TextTokenizer(out)
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    gen_path = model_dir / "generation_config.json"
    if gen_path.exists():
        g = json.loads(gen_path.read_text()).get("eos_token_id")
        eos += g if isinstance(g, list) else [g] if g is not None else []
    end_id = _end_of_turn(tok)
    eos = sorted({e for e in eos + [end_id] if e is not None})

    tok_digest = file_digest([out / "tokenizer.json", out / "tokenizer_config.json"])
    variants = {}

    def add_variant(precision: str, files: list[Path]) -> None:
        weights = file_digest(files)
        fp = hashlib.sha256(f"{weights}:{tok_digest}:{precision}".encode()).hexdigest()[:24]
        variants[precision] = {
            "file": files[0].name,
            "fingerprint": fp,
            "weights_sha256": weights,
            "bytes": sum(f.stat().st_size for f in files),
        }

    add_variant("fp32", [fp32] + sorted(out.glob("model.onnx.data")))
    manifest = Manifest(
        name=info.get("name", model_dir.name),
        fingerprint=variants["fp32"]["fingerprint"],
        num_layers=geo.num_layers,
        num_kv_heads=geo.num_kv_heads,
        head_dim=geo.head_dim,
        vocab_size=geo.vocab_size,
        context_window=geo.context_window,
        eos_token_ids=eos,
        end_of_turn_id=end_id if end_id is not None else eos[0],
        system_prompt=system_prompt,
        variants=variants,
        source={
            "path": str(model_dir),
            "model_type": config.model_type,
            "tokenizer_sha256": tok_digest,
            **({"output_vocabulary": len(output_vocabulary)} if output_vocabulary else {}),
        },
    )
    manifest.save(out)

    limit = min(geo.context_window - 1, 512)
    prompts = _prompts(tok, system_prompt, calibration.calibration_set(calibration_per_class), limit)
    report = {}
    decoder = OnnxDecoder(out, manifest, "fp32")
    if check:
        log.info("checking ONNX against PyTorch (left padding, cached prefix, decode steps)")
        report = parity.check(
            model, decoder, [prompts[i] for i in range(0, len(prompts), max(1, len(prompts) // 4))][:4]
        )
        log.info("parity: %s", json.dumps(report))
        if not report["ok"]:
            raise SystemExit(f"export check failed: ONNX does not match PyTorch: {report}")
        say.line(
            f"ONNX with KV cache matches PyTorch (greedy tokens identical, logits within "
            f"{max(report['max_abs_logit_diff'], report['max_abs_logit_diff_with_cached_prefix']):.0e}, "
            f"with and without a cached prefix)"
        )
    drafting = _speculation(say, speculation, tok, manifest, decoder, system_prompt, limit, out)
    int8 = [p for p in precisions if p != "fp32"]
    packed_sources = {}  # padded graph -> its packed rendering, for the INT8 variants made packed too
    if packed:
        packed_sources[fp32] = onnx_export.export_packed(model, geo, out / "model.packed.onnx")
        if check:
            _check_packed(say, parity, model, out, manifest, prompts)
    source, source_decoder = fp32, decoder
    if int8 and smooth_alpha > 0:
        smooth_model = smooth.smoothed(model, prompts, smooth_alpha)
        if smooth_model is not None:
            source = onnx_export.export(smooth_model, geo, out / "model.smoothed.onnx")
            if packed:
                packed_path = out / "model.smoothed.packed.onnx"
                packed_sources[source] = onnx_export.export_packed(smooth_model, geo, packed_path)
            del smooth_model
            with_source = {**variants, "smoothed": {"file": source.name}}
            source_decoder = OnnxDecoder(out, Manifest(**{**manifest.__dict__, "variants": with_source}), "smoothed")
    if int8:
        log.info(
            "INT8 variants %s on parts %s from %s; calibration: %d prompts over %s",
            ",".join(int8),
            ",".join(parts),
            source.name,
            len(prompts),
            ",".join(calibration.CLASSES),
        )
    with say.bar(len(int8), "INT8 variants", "variant") as bar:
        for precision in int8:
            bar.set_postfix_str(precision)
            target = out / f"model.{precision}.onnx"
            if precision == "int8-dynamic":
                quantize.quantize_int8_dynamic(source, target, parts)
            else:
                method = precision.split("-", 1)[1]
                fixed = 96 if method in quantize.FIXED_SHAPE_METHODS else None
                quantize.quantize_int8_static(
                    source, target, calibration.feeds(source_decoder, prompts, fixed), method, parts
                )
            data = target.with_name(target.name + ".data")  # a quantizer's external data, for large models
            add_variant(precision, [target, data] if data.exists() else [target])
            if precision == "int8-dynamic" and source in packed_sources:
                quantize.quantize_int8_dynamic(packed_sources[source], out / f"model.{precision}.packed.onnx", parts)
            bar.update()
    for f in out.glob("model.smoothed.*onnx*"):
        f.unlink()
    packing = _choose_packed(say, packed_choice, out, manifest, variants, file_digest) if packed else {}
    smoothing = {"alpha": smooth_alpha, "applied": source != fp32} if int8 else {}
    manifest = Manifest(
        **{
            **manifest.__dict__,
            "variants": variants,
            "parity": report,
            "speculation": drafting,
            "packing": packing,
            "source": {**manifest.source, "int8_smoothing": smoothing},
        }
    )
    manifest.save(out)
    accuracy_report, failed, left_out = {}, {}, {}
    if int8 and info.get("random_weights"):
        say.line("random weights: INT8 agreement with FP32 is not measured or gated (the parity check ran)")
    if int8 and gate is not None:
        cases = accuracy.heldout_cases(heldout_per_class)
        log.info("accuracy of %s against FP32 on %d held-out conversations", ",".join(int8), len(cases))
        default_model = manifest.name == "switchboard-default"
        with say.bar(len(int8) + 1 + default_model * (len(int8) + 1), "accuracy gate", "part") as bar:
            results = accuracy.evaluate(out, int8, cases, answer_accuracy=default_model, progress=bar.update)
        accuracy_report = accuracy.as_dict(results)
        for v in int8:
            reasons = gate.failures(results[v])
            if reasons and v in required:
                failed[v] = reasons
            elif reasons:
                left_out[v] = reasons
        say.line(f"accuracy against FP32 on {len(cases)} held-out conversations (gate: {gate.describe()}):")
        for row in accuracy.table(results, gate, left_out, failed):
            say.line("  " + row)
        if any(p != "int8-dynamic" for p in int8) and coverage_study:
            accuracy_report.update(
                _coverage_study(
                    out,
                    decoder,
                    fp32,
                    tok,
                    system_prompt,
                    limit,
                    parts,
                    calibration_per_class,
                    heldout_per_class,
                    prompts,
                )
            )
        for v, reasons in left_out.items():
            for f in {variants[v]["file"], *(p.name for p in out.glob(f"model.{v}.*onnx*"))}:
                (out / f).unlink(missing_ok=True)
            del variants[v]
            say.line(
                f"left out {v}: {'; '.join(reasons)} (ask for it by name, e.g. --precision fp32,{v}, "
                f"to make this an error)"
            )
        packing = {v: c for v, c in manifest.packing.items() if v in variants}
        manifest = Manifest(
            **{
                **manifest.__dict__,
                "variants": variants,
                "accuracy": accuracy_report,
                "left_out": left_out,
                "packing": packing,
            }
        )
        manifest.save(out)
    shipped = [p for p in precisions if p in variants]
    if bench_batches:
        from switchboard.export import report

        log.info("report: latency of %s at batch %s", ",".join(shipped), ",".join(map(str, bench_batches)))
        with say.bar(bench_repeats * len(bench_batches) * len(shipped), "latency report", "run") as bar:
            bench = report.benchmark(
                out, shipped, batches=bench_batches, prompt=bench_prompt, repeats=bench_repeats, progress=bar.update
            )
        path = report.write(out, bench, accuracy_report, f"{manifest.name} ({config.model_type})")
        log.info("report: %s", path)
    if failed:
        lines = "; ".join(f"{v}: {', '.join(f)}" for v, f in failed.items())
        raise SystemExit(f"accuracy gate failed (not shipping): {lines}")
    say.line(
        f"exported {', '.join(shipped)} in {time.time() - t0:.0f} s"
        + (f"; report: {out / 'report.md'}" if bench_batches else "")
    )
    return manifest.__dict__


def _check_packed(say, parity, model, out: Path, manifest, prompts) -> None:
    """The packed graph against PyTorch as the padded one was (``parity.check``: left padding, a
    cached prefix, decode steps), run by ``OnnxDecoder`` on its packed passes."""
    from switchboard.artifact.manifest import Manifest
    from switchboard.engine.runtime import OnnxDecoder

    variants = {"fp32-packed": {"file": "model.packed.onnx"}}
    decoder = OnnxDecoder(out, Manifest(**{**manifest.__dict__, "variants": variants}), "fp32-packed")
    report = parity.check(model, decoder, [prompts[i] for i in range(0, len(prompts), max(1, len(prompts) // 4))][:4])
    if not report["ok"]:
        raise SystemExit(f"export check failed: the packed graph does not match PyTorch: {report}")
    say.line(f"packed graph matches PyTorch (logits within {report['max_abs_logit_diff']:.0e})")


def _choose_packed(say, packed_choice, out: Path, manifest, variants: dict, file_digest) -> dict:
    """Each variant exported packed too: its packed graph recorded beside the padded one
    (``variants[v]["packed"]``), both timed on the serving passes, and the one to serve from
    (``packing[v]``, export/packed_choice.py)."""
    from switchboard.artifact.manifest import Manifest
    from switchboard.engine.runtime import OnnxDecoder

    packing = {}
    for precision, variant in variants.items():
        graph = out / ("model.packed.onnx" if precision == "fp32" else f"model.{precision}.packed.onnx")
        if not graph.exists():
            continue
        files = [graph, *sorted(out.glob(graph.name + ".data"))]
        variant["packed"] = {
            "file": graph.name,
            "weights_sha256": file_digest(files),
            "bytes": sum(f.stat().st_size for f in files),
        }
        both = Manifest(**{**manifest.__dict__, "variants": variants, "packing": {precision: {"chosen": "packed"}}})
        padded, packed = (OnnxDecoder(out, both, precision, pack=p).session for p in (False, True))
        packing[precision] = c = packed_choice.measure(padded, packed, vocab=manifest.vocab_size)
        del padded, packed
        say.line(
            f"{precision}: packed passes {c['packed_ms']:.1f} ms against padded {c['padded_ms']:.1f} "
            f"({c['ratio']:.2f}x; its worst pass {c['worst_ratio']:.2f}x): serves {c['chosen']}"
        )
    return packing


def _speculation(say, speculation, tok, manifest, decoder, system_prompt, limit, out) -> dict:
    """The corpus's answers beside the graph, and whether drafting from them pays (export/speculation.py)."""
    answers = speculation.corpus_answers(tok, manifest.end_of_turn_id)
    speculation.write_answers(out, answers)
    prompts = speculation.heldout_prompts(tok, system_prompt, limit)
    log.info("speculation: %d corpus answers; measuring drafts on %d held-out questions", len(answers), len(prompts))
    measured = speculation.measure(decoder, manifest, prompts, answers)
    log.info("speculation: %s", json.dumps(measured))
    if "batch_8" in measured:
        say.line(
            f"drafting from {len(answers)} corpus answers: {measured['batch_1']['speedup']:.2f}x at batch 1, "
            f"{measured['batch_8']['speedup']:.2f}x at batch 8, answers identical: {measured['identical']}; "
            f"speculation {'on' if measured['enabled'] else 'off'} by default"
        )
    return measured


def _coverage_study(
    out, decoder, fp32, tok, system_prompt, limit, parts, per_class, heldout_per_class, covered_prompts
) -> dict:
    """What calibration coverage changes: MinMax calibrated on the covered set against MinMax
    calibrated on plain questions only, on the same held-out classes (study graphs are
    deleted afterwards; nothing here is shipped)."""
    from switchboard.artifact.manifest import Manifest, file_digest
    from switchboard.export import accuracy, calibration, quantize

    log.info("coverage study: MinMax calibrated on the covered set vs on plain questions only")
    plain = _prompts(tok, system_prompt, calibration.calibration_set(per_class, covered=False), limit)
    m = Manifest.load(out)
    study = dict(m.variants)
    for name, prompts in (("study-minmax-covered", covered_prompts), ("study-minmax-plain", plain)):
        target = out / f"model.{name}.onnx"
        quantize.quantize_int8_static(fp32, target, calibration.feeds(decoder, prompts), "minmax", parts)
        study[name] = {
            "file": target.name,
            "fingerprint": name,
            "weights_sha256": file_digest([target]),
            "bytes": target.stat().st_size,
        }
    Manifest(**{**m.__dict__, "variants": study}).save(out)
    names = ["study-minmax-covered", "study-minmax-plain"]
    try:
        results = accuracy.evaluate(out, names, accuracy.heldout_cases(heldout_per_class))
    finally:
        m.save(out)
        for name in names:
            (out / f"model.{name}.onnx").unlink(missing_ok=True)
    return {k: v for k, v in accuracy.as_dict(results).items() if k in names}


# What a checkpoint's switchboard.json may set under "export" (argument names).
CHECKPOINT_DEFAULTS = ("precision", "int8_parts", "bench_batches", "bench_repeats", "smooth_alpha", "packed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.export", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        help="local Hugging Face checkpoint directory, or a .gguf file (imported first)",
    )
    p.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    p.add_argument(
        "--precision",
        default="default",
        help=f"'default' ({','.join(DEFAULT_PRECISIONS)}; an INT8 variant that fails the accuracy gate is "
        f"left out with its reason) or a comma-separated list from {','.join(VARIANTS)} (every "
        f"variant listed must pass the gate, or the export fails)",
    )
    p.add_argument(
        "--int8-parts",
        default="mlp,attention",
        help="MatMuls to quantize: mlp, attention, lm_head (default: mlp,attention; the rest stays FP32)",
    )
    p.add_argument(
        "--smooth-alpha",
        type=float,
        default=0.5,
        help="INT8 variants from a model smoothed with this migration strength (SmoothQuant; 0 = off)",
    )
    p.add_argument(
        "--calibration-per-class",
        type=int,
        default=8,
        help="calibration prompts per class (plain, codes, prices, phones, mixed, long)",
    )
    p.add_argument(
        "--heldout-per-class",
        type=int,
        default=24,
        help="held-out conversations per class in the accuracy gate (6 classes)",
    )
    p.add_argument("--no-gate", action="store_true", help="skip the accuracy evaluation and gate")
    p.add_argument(
        "--packed",
        action="store_true",
        help="also export FP32 and INT8 dynamic as the packed pass's graph (rows of different lengths without "
        "padding), time it against the padded graph and serve it where cheaper (the manifest's 'packing')",
    )
    p.add_argument(
        "--coverage-study",
        action="store_true",
        help="also compare MinMax calibrated on the long-tail set with plain questions (in the report)",
    )
    p.add_argument("--bench-batches", default="1,8,32", help="report latency at these batch sizes ('' = no report)")
    p.add_argument("--bench-repeats", type=int, default=5, help="interleaved repetitions per measurement")
    p.add_argument("--bench-prompt", type=int, default=64, help="prompt tokens per sequence in the prefill measurement")
    p.add_argument("--min-greedy", type=float, default=0.80, help="gate: greedy sequences identical to FP32")
    p.add_argument("--min-top1", type=float, default=0.97, help="gate: teacher-forced top-1 agreement")
    p.add_argument("--min-cosine", type=float, default=0.99, help="gate: logits cosine to FP32")
    p.add_argument("--max-ppl-increase", type=float, default=0.10, help="gate: relative perplexity increase")
    p.add_argument("--install", type=Path, metavar="REPOSITORY", help="install into this model repository")
    p.add_argument("--no-check", action="store_true", help="skip the ONNX-vs-PyTorch check")
    p.add_argument("--force", action="store_true", help="export even if the inputs did not change")
    p.add_argument("--log", type=Path, help="where the detail goes (default build/logs/export.log)")
    args = p.parse_args(argv)
    if args.model.suffix == ".gguf":  # llama.cpp's format: imported to a checkpoint directory first
        from switchboard import console
        from switchboard.export import gguf

        with console.step("gguf") as out:
            try:
                args.model = gguf.ensure(args.model, say=out.line)
            except gguf.GgufError as e:
                raise SystemExit(str(e)) from None
    if not (args.model / "config.json").exists():
        p.error(f"--model {args.model}: no config.json (not a Hugging Face checkpoint directory or a .gguf file)")
    info_path = args.model / "switchboard.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    # A checkpoint may carry its own export defaults (switchboard.json "export"); the command
    # line still wins.
    for key, value in info.get("export", {}).items():
        if key in CHECKPOINT_DEFAULTS and getattr(args, key) == p.get_default(key):
            setattr(args, key, type(p.get_default(key))(value))
    if info.get("random_weights"):
        args.no_gate = True  # agreement with FP32 means nothing on random weights; parity still runs
    try:
        precisions, required = parse_precisions(args.precision)
    except ValueError as e:
        p.error(f"--precision: {e}")
    parts = tuple(x.strip() for x in args.int8_parts.split(",") if x.strip())
    from switchboard import console
    from switchboard.export.accuracy import Gate

    gate = None if args.no_gate else Gate(args.min_greedy, args.min_top1, args.min_cosine, args.max_ppl_increase)
    options = [
        *precisions,
        "required:" + ",".join(sorted(required)),
        *parts,
        str(args.calibration_per_class),
        str(args.heldout_per_class),
        str(args.coverage_study),
        str(args.smooth_alpha),
        repr(gate),
        *(["packed"] if args.packed else []),
    ]
    stamp = Stamp(args.out, _inputs_digest(args.model, options))
    with console.step("export", args.log) as out:
        if args.force or not stamp.current():
            batches = tuple(int(b) for b in args.bench_batches.split(",") if b.strip())
            with stamp.building():
                run_export(
                    args.model,
                    args.out,
                    precisions,
                    check=not args.no_check,
                    parts=parts,
                    calibration_per_class=args.calibration_per_class,
                    gate=gate,
                    heldout_per_class=args.heldout_per_class,
                    bench_batches=batches,
                    bench_repeats=args.bench_repeats,
                    bench_prompt=args.bench_prompt,
                    required=required,
                    coverage_study=args.coverage_study,
                    smooth_alpha=args.smooth_alpha,
                    packed=args.packed,
                    console=out,
                )
        else:
            from switchboard.artifact.manifest import Manifest

            m = Manifest.load(args.out)
            left = "".join(f"; {v} left out ({'; '.join(r)})" for v, r in m.left_out.items())
            out.line(f"artifacts in {args.out} are up to date: {', '.join(m.variants)}{left}")
        if args.install:
            install_chat(args.out, args.install)
            out.line(f"installed into {args.install}/ ({', '.join(CHAT_MODELS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

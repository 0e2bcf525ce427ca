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
import sys
import time
from pathlib import Path

log = logging.getLogger("switchboard.export")
HERE = Path(__file__).resolve().parent
REPO_MODELS = ("chat", "engine_short", "engine_long")
# For base checkpoints without a chat template (e.g. GPT-2): each turn ends with the EOS
# token, which is also what generation stops on.
FALLBACK_TEMPLATE = ("{% for message in messages %}{{ message['role'] + ': ' + message['content'] + eos_token + '\\n' }}"
                     "{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")


def _digest_dir(path: Path) -> str:
    from switchboard.manifest import file_digest

    files = [p for p in sorted(Path(path).iterdir()) if p.is_file() and not p.name.startswith(".")]
    return file_digest(files)


def _inputs_digest(model_dir: Path, precisions: list[str]) -> str:
    h = hashlib.sha256(_digest_dir(model_dir).encode())
    for f in sorted(HERE.glob("*.py")) + sorted((HERE.parent / "switchboard" / "engine").glob("*.py")):
        h.update(f.read_bytes())
    h.update(",".join(precisions).encode())
    return h.hexdigest()[:16]


def _prompts(tok, system_prompt: str | None, conversations: list[list[dict]], limit: int) -> list[list[int]]:
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [tok.encode(tok.template.render(system + c))[-limit:] for c in conversations]


VARIANTS = ("fp32", "int8-dynamic", "int8-minmax", "int8-entropy", "int8-percentile")


def run_export(model_dir: Path, out: Path, precisions: list[str], check: bool = True,
               parts: tuple[str, ...] = ("mlp", "attention"), calibration_per_class: int = 8,
               gate=None, heldout_per_class: int = 6, bench_batches: tuple[int, ...] | None = (1, 8, 32),
               bench_repeats: int = 5, bench_prompt: int = 64) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from switchboard.engine.runtime import OnnxDecoder
    from switchboard.export import accuracy, calibration, onnx_export, parity, quantize
    from switchboard.manifest import Manifest, file_digest
    from switchboard.tokenizer import TextTokenizer

    t0 = time.time()
    config = AutoConfig.from_pretrained(model_dir)
    try:
        geo = onnx_export.geometry(config)
    except ValueError as e:
        raise SystemExit(f"{model_dir}: {e}") from None
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*"):
        if stale.is_file():
            stale.unlink()

    log.info("[1/5] loading %s (%s)", model_dir, config.model_type)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not tokenizer.chat_template:
        if tokenizer.eos_token is None:
            raise SystemExit(f"{model_dir}: the tokenizer has neither a chat template nor an EOS token")
        log.warning("%s has no chat template; using `role: content<eos>` turns", model_dir)
        tokenizer.chat_template = FALLBACK_TEMPLATE
    tokenizer.save_pretrained(out)  # always writes tokenizer.json (fast tokenizer)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    info_path = model_dir / "switchboard.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    system_prompt = info.get("system_prompt")

    log.info("[2/5] exporting ONNX with KV cache")
    fp32 = onnx_export.export(model, geo, out / "model.onnx")
    tok = TextTokenizer(out)
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    gen_path = model_dir / "generation_config.json"
    if gen_path.exists():
        g = json.loads(gen_path.read_text()).get("eos_token_id")
        eos += g if isinstance(g, list) else [g] if g is not None else []
    end_id = tok.token_id(tok.eos_token) if tok.eos_token else None
    eos = sorted({e for e in eos + [end_id] if e is not None})

    tok_digest = file_digest([out / "tokenizer.json", out / "tokenizer_config.json"])
    variants = {}

    def add_variant(precision: str, files: list[Path]) -> None:
        weights = file_digest(files)
        fp = hashlib.sha256(f"{weights}:{tok_digest}:{precision}".encode()).hexdigest()[:24]
        variants[precision] = {"file": files[0].name, "fingerprint": fp, "weights_sha256": weights,
                               "bytes": sum(f.stat().st_size for f in files)}

    add_variant("fp32", [fp32] + sorted(out.glob("model.onnx.data")))
    manifest = Manifest(
        name=info.get("name", model_dir.name), fingerprint=variants["fp32"]["fingerprint"],
        num_layers=geo.num_layers, num_kv_heads=geo.num_kv_heads, head_dim=geo.head_dim,
        vocab_size=geo.vocab_size, context_window=geo.context_window, eos_token_ids=eos,
        end_of_turn_id=end_id if end_id is not None else eos[0], system_prompt=system_prompt,
        variants=variants, source={"path": str(model_dir), "model_type": config.model_type,
                                   "tokenizer_sha256": tok_digest})
    manifest.save(out)

    limit = min(geo.context_window - 1, 512)
    prompts = _prompts(tok, system_prompt, calibration.calibration_set(calibration_per_class), limit)
    report = {}
    decoder = OnnxDecoder(out, manifest, "fp32")
    if check:
        log.info("[3/5] checking ONNX against PyTorch (left padding, cached prefix, decode steps)")
        report = parity.check(model, decoder, [prompts[i] for i in range(0, len(prompts), max(1, len(prompts) // 4))][:4])
        log.info("parity: %s", json.dumps(report))
        if not report["ok"]:
            raise SystemExit(f"export check failed: ONNX does not match PyTorch: {report}")
    int8 = [p for p in precisions if p != "fp32"]
    if int8:
        log.info("[4/5] INT8 variants %s on parts %s; calibration: %d prompts over %s",
                 ",".join(int8), ",".join(parts), len(prompts), ",".join(calibration.CLASSES))
    for precision in int8:
        target = out / f"model.{precision}.onnx"
        if precision == "int8-dynamic":
            quantize.quantize_int8_dynamic(fp32, target, parts)
        else:
            method = precision.split("-", 1)[1]
            fixed = 96 if method in quantize.FIXED_SHAPE_METHODS else None
            quantize.quantize_int8_static(fp32, target, calibration.feeds(decoder, prompts, fixed), method, parts)
        add_variant(precision, [target])
        for f in out.glob("*.onnx.data"):  # quantizers may write external data next to the output
            if f.name != "model.onnx.data":
                add_variant(precision, [target, f])
    manifest = Manifest(**{**manifest.__dict__, "variants": variants, "parity": report})
    manifest.save(out)
    accuracy_report = {}
    if int8 and gate is not None:
        log.info("[5/5] accuracy of %s against FP32 on held-out conversations", ",".join(int8))
        results = accuracy.evaluate(out, int8, accuracy.heldout_cases(heldout_per_class),
                                    answer_accuracy=manifest.name == "switchboard-default")
        accuracy_report = accuracy.as_dict(results)
        manifest = Manifest(**{**manifest.__dict__, "accuracy": accuracy_report})
        manifest.save(out)
        failed = {v: gate.failures(results[v]) for v in int8 if gate.failures(results[v])}
        for v, r in results.items():
            log.info("  %-16s greedy %.3f  top-1 %.4f  cosine %.5f  ppl %.3f (%+.1f%%)%s", v,
                     r.greedy_sequences_identical, r.teacher_forced_top1, r.logits_cosine, r.perplexity,
                     100 * r.perplexity_delta, f"  answers {r.answer_accuracy:.2f}" if r.answer_accuracy is not None else "")
        coverage = _coverage_study(out, decoder, fp32, tok, system_prompt, limit, parts, calibration_per_class,
                                   heldout_per_class, prompts) if any(p != "int8-dynamic" for p in int8) else {}
        manifest = Manifest(**{**manifest.__dict__, "accuracy": {**accuracy_report, **coverage}})
        manifest.save(out)
        accuracy_report.update(coverage)
    else:
        failed = {}
    if bench_batches:
        from switchboard.export import report

        log.info("report: latency of %s at batch %s", ",".join(precisions), ",".join(map(str, bench_batches)))
        bench = report.benchmark(out, precisions, batches=bench_batches, prompt=bench_prompt, repeats=bench_repeats)
        path = report.write(out, bench, accuracy_report, f"{manifest.name} ({config.model_type})")
        log.info("report: %s", path)
    if failed:
        lines = "; ".join(f"{v}: {', '.join(f)}" for v, f in failed.items())
        raise SystemExit(f"accuracy gate failed (not shipping): {lines}")
    log.info("exported %s to %s in %.0f s", manifest.name, out, time.time() - t0)
    return manifest.__dict__


def _coverage_study(out, decoder, fp32, tok, system_prompt, limit, parts, per_class, heldout_per_class,
                    covered_prompts) -> dict:
    """What calibration coverage changes: MinMax calibrated on the covered set against MinMax
    calibrated on plain questions only, on the same held-out classes (study graphs are
    deleted afterwards; nothing here is shipped)."""
    from switchboard.export import accuracy, calibration, quantize
    from switchboard.manifest import Manifest, file_digest

    log.info("coverage study: MinMax calibrated on the covered set vs on plain questions only")
    plain = _prompts(tok, system_prompt, calibration.calibration_set(per_class, covered=False), limit)
    m = Manifest.load(out)
    study = dict(m.variants)
    for name, prompts in (("study-minmax-covered", covered_prompts), ("study-minmax-plain", plain)):
        target = out / f"model.{name}.onnx"
        quantize.quantize_int8_static(fp32, target, calibration.feeds(decoder, prompts), "minmax", parts)
        study[name] = {"file": target.name, "fingerprint": name, "weights_sha256": file_digest([target]),
                       "bytes": target.stat().st_size}
    Manifest(**{**m.__dict__, "variants": study}).save(out)
    names = ["study-minmax-covered", "study-minmax-plain"]
    try:
        results = accuracy.evaluate(out, names, accuracy.heldout_cases(heldout_per_class))
    finally:
        m.save(out)
        for name in names:
            (out / f"model.{name}.onnx").unlink(missing_ok=True)
    return {k: v for k, v in accuracy.as_dict(results).items() if k in names}


def install(artifacts: Path, repository: Path) -> None:
    """Put the artifacts into each model's version folder (hard links where possible)."""
    from switchboard.export.render import place_artifacts

    for name in REPO_MODELS:
        version = repository / name / "1"
        if not version.is_dir():
            raise SystemExit(f"{version} is not a model version folder")
        for old in version.iterdir():
            if old.name != "model.py" and old.is_file():
                old.unlink()
        place_artifacts(artifacts, version, name, "local")
    log.info("installed %s into %s", artifacts, ", ".join(f"{repository}/{n}/1" for n in REPO_MODELS))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.export", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="local Hugging Face checkpoint directory")
    p.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    p.add_argument("--precision", default="fp32,int8-dynamic,int8-minmax,int8-entropy,int8-percentile",
                   help=f"comma-separated variants from {','.join(VARIANTS)} (default: all)")
    p.add_argument("--int8-parts", default="mlp,attention",
                   help="MatMuls to quantize: mlp, attention, lm_head (default: mlp,attention; the rest stays FP32)")
    p.add_argument("--calibration-per-class", type=int, default=8,
                   help="calibration prompts per class (plain, codes, prices, phones, mixed, long)")
    p.add_argument("--no-gate", action="store_true", help="skip the accuracy evaluation and gate")
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
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not (args.model / "config.json").exists():
        p.error(f"--model {args.model}: no config.json (not a Hugging Face checkpoint directory)")
    precisions = [x.strip() for x in args.precision.split(",") if x.strip()]
    bad = set(precisions) - set(VARIANTS)
    if bad or "fp32" not in precisions:
        p.error(f"--precision: fp32 is required; unknown: {', '.join(sorted(bad)) or '-'}")
    parts = tuple(x.strip() for x in args.int8_parts.split(",") if x.strip())
    from switchboard.export.accuracy import Gate

    gate = None if args.no_gate else Gate(args.min_greedy, args.min_top1, args.min_cosine, args.max_ppl_increase)
    options = [*precisions, *parts, str(args.calibration_per_class), repr(gate)]
    digest = _inputs_digest(args.model, options)
    stamp = args.out / ".inputs"
    if args.force or not stamp.exists() or stamp.read_text().strip() != digest:
        stamp.unlink(missing_ok=True)
        batches = tuple(int(b) for b in args.bench_batches.split(",") if b.strip())
        run_export(args.model, args.out, precisions, check=not args.no_check, parts=parts,
                   calibration_per_class=args.calibration_per_class, gate=gate, bench_batches=batches,
                   bench_repeats=args.bench_repeats, bench_prompt=args.bench_prompt)
        stamp.write_text(digest + "\n")
    else:
        log.info("artifacts in %s are up to date (inputs %s)", args.out, digest)
    if args.install:
        install(args.out, args.install)
    return 0


if __name__ == "__main__":
    sys.exit(main())

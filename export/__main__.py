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
import os
import shutil
import sys
import time
from pathlib import Path

log = logging.getLogger("switchboard.export")
HERE = Path(__file__).resolve().parent
REPO_MODELS = ("chat", "engine_short", "engine_long")


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


def _calibration_prompts(tok, system_prompt: str | None, n: int) -> list[list[int]]:
    from switchboard import corpus

    questions = corpus.sample_questions(corpus.load(), n, seed=1)
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [tok.encode(tok.template.render(system + [{"role": "user", "content": q}])) for q in questions]


def run_export(model_dir: Path, out: Path, precisions: list[str], check: bool = True) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from switchboard.engine.runtime import OnnxDecoder
    from switchboard.export import onnx_export, parity, quantize
    from switchboard.manifest import Manifest, file_digest
    from switchboard.tokenizer import TextTokenizer

    t0 = time.time()
    config = AutoConfig.from_pretrained(model_dir)
    geo = onnx_export.geometry(config)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*"):
        if stale.is_file():
            stale.unlink()

    log.info("[1/4] loading %s (%s)", model_dir, config.model_type)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.save_pretrained(out)  # always writes tokenizer.json (fast tokenizer)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    info_path = model_dir / "switchboard.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    system_prompt = info.get("system_prompt")

    log.info("[2/4] exporting ONNX with KV cache")
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

    prompts = _calibration_prompts(tok, system_prompt, 48)
    report = {}
    if check:
        log.info("[3/4] checking ONNX against PyTorch (left padding, cached prefix, decode steps)")
        decoder = OnnxDecoder(out, manifest, "fp32")
        report = parity.check(model, decoder, prompts[:4])
        log.info("parity: %s", json.dumps(report))
        if not report["ok"]:
            raise SystemExit(f"export check failed: ONNX does not match PyTorch: {report}")
    if "int8" in precisions:
        log.info("[4/4] INT8: static Q/DQ calibrated on %d corpus prompts", len(prompts))
        decoder = OnnxDecoder(out, manifest, "fp32")
        quantize.quantize_int8_static(fp32, out / "model.int8.onnx", quantize.calibration_feeds(decoder, prompts))
        add_variant("int8", [out / "model.int8.onnx"])
    manifest = Manifest(**{**manifest.__dict__, "variants": variants, "parity": report})
    manifest.save(out)
    log.info("exported %s to %s in %.0f s", manifest.name, out, time.time() - t0)
    return manifest.__dict__


def install(artifacts: Path, repository: Path) -> None:
    """Put the artifacts into each model's version folder (hard links where possible)."""
    for name in REPO_MODELS:
        version = repository / name / "1"
        if not version.is_dir():
            raise SystemExit(f"{version} is not a model version folder")
        for old in version.iterdir():
            if old.name != "model.py" and old.is_file():
                old.unlink()
        for f in artifacts.iterdir():
            if f.is_file() and not f.name.startswith("."):
                try:
                    os.link(f, version / f.name)
                except OSError:
                    shutil.copy2(f, version / f.name)
    log.info("installed %s into %s", artifacts, ", ".join(f"{repository}/{n}/1" for n in REPO_MODELS))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.export", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="local Hugging Face checkpoint directory")
    p.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    p.add_argument("--precision", default="fp32,int8", help="comma-separated: fp32,int8 (default: both)")
    p.add_argument("--install", type=Path, metavar="REPOSITORY", help="install into this model repository")
    p.add_argument("--no-check", action="store_true", help="skip the ONNX-vs-PyTorch check")
    p.add_argument("--force", action="store_true", help="export even if the inputs did not change")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not (args.model / "config.json").exists():
        p.error(f"--model {args.model}: no config.json (not a Hugging Face checkpoint directory)")
    precisions = [x.strip() for x in args.precision.split(",") if x.strip()]
    bad = set(precisions) - {"fp32", "int8"}
    if bad or "fp32" not in precisions:
        p.error(f"--precision: fp32 is required; unknown: {', '.join(sorted(bad)) or '-'}")

    digest = _inputs_digest(args.model, precisions)
    stamp = args.out / ".inputs"
    if args.force or not stamp.exists() or stamp.read_text().strip() != digest:
        stamp.unlink(missing_ok=True)
        run_export(args.model, args.out, precisions, check=not args.no_check)
        stamp.write_text(digest + "\n")
    else:
        log.info("artifacts in %s are up to date (inputs %s)", args.out, digest)
    if args.install:
        install(args.out, args.install)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build the embedded default speech recognizer: ``python -m switchboard.training.asr``.

Speaks the corpus with espeak-ng, trains a tiny Whisper on it and writes a Hugging Face
Whisper directory (config, safetensors weights, generation config, tokenizer, feature
extractor config) plus ``asr_report.json`` (held-out error rates, timings). The build is
skipped when the directory holds a model made from the same inputs (corpus files, this code,
espeak-ng's version, the settings); the synthesized speech is cached apart (build/cache/asr),
so a change to the training settings alone does not synthesize again.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import sys
import time
from pathlib import Path

from switchboard import paths
from switchboard.asr.features import SAMPLE_RATE
from switchboard.data import corpus as corpus_mod
from switchboard.data import speech
from switchboard.stamp import Stamp
from switchboard.training.asr import data as data_mod
from switchboard.training.asr.model import ModelConfig
from switchboard.training.settings import override

log = logging.getLogger("switchboard.training.asr")
HERE = Path(__file__).parent
CACHE_DIR = paths.BUILD / "cache" / "asr"
REPORT = "asr_report.json"


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    data: data_mod.DataConfig = data_mod.DataConfig()
    model: ModelConfig = ModelConfig()
    evaluate: bool = True


def inputs_digest(cfg: BuildConfig, corpus_dir: Path) -> str:
    """What the model is made from: a change to any of these rebuilds it."""
    h = hashlib.sha256()
    sources = sorted(HERE.glob("*.py")) + [Path(speech.__file__), Path(corpus_mod.__file__)]
    for f in sorted(corpus_dir.glob("*.jsonl")) + sources:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    h.update(data_mod.espeak_version().encode())
    h.update(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    return h.hexdigest()[:16]


def check_window(cfg: BuildConfig) -> None:
    """The model's window holds the longest utterance kept: window_frames frames of ``hop``
    samples make max_seconds."""
    frames, hop, seconds = cfg.model.window_frames, cfg.data.hop, cfg.data.max_seconds
    if frames * hop != round(seconds * SAMPLE_RATE):
        raise ValueError(
            f"window_frames {frames} of {hop} samples is not max_seconds {seconds:g} s: "
            f"set window_frames={round(seconds * SAMPLE_RATE / hop)}"
        )


def build(
    out: Path, cfg: BuildConfig, corpus_dir: Path, cache_dir: Path | None = CACHE_DIR, workers: int = 2, bar=None
) -> dict:
    """Synthesize, train and evaluate into ``out``; ``bar(total, desc, unit)``, if given,
    makes the progress bars. Returns the report (also written to ``out/asr_report.json``).
    Torch's thread count and kernel choice are set for the build and restored after it."""
    import torch

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(max(1, min(threads, 2)))
    # Without it two builds of one seed on one machine differed after 60 steps (a threaded
    # kernel's sums in another order), and after 3,400 the models heard differently.
    torch.use_deterministic_algorithms(True)
    try:
        return _build(out, cfg, corpus_dir, cache_dir, workers, bar)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _build(out: Path, cfg: BuildConfig, corpus_dir: Path, cache_dir: Path | None, workers: int, bar) -> dict:
    import torch
    from transformers import GenerationConfig, WhisperFeatureExtractor

    from switchboard.training.asr import evaluate
    from switchboard.training.asr import model as model_mod
    from switchboard.training.asr import tokenizer as tokmod

    t0 = time.time()
    check_window(cfg)
    mcfg, hop = cfg.model, cfg.data.hop
    data, cached = data_mod.load(
        cfg.data, corpus_dir, cache_dir, workers, bar=(lambda n: bar(n, "speaking", "clip")) if bar else None
    )
    synthesis_s = time.time() - t0
    frames = data.frames
    log.info(
        "speech: %d utterances, %.1f s of audio on average (%.0f s in all), %s in %.0f s",
        len(frames),
        frames.mean() * hop / SAMPLE_RATE,
        frames.sum() * hop / SAMPLE_RATE,
        "from the cache" if cached else "synthesized",
        synthesis_s,
    )

    texts = [t for ts in data_mod.corpus_templates(corpus_mod.load(corpus_dir)).values() for t in ts]
    texts += [u.text for u in data.items]
    tok = tokmod.train_tokenizer(texts, mcfg.vocab_size)
    tokmod.save(tok, out, mcfg.max_target_positions)
    ids = tokmod.special_ids(tok)
    seqs = model_mod.token_sequences(tok, data.items, ids, mcfg.max_target_positions)

    model = model_mod.new_model(mcfg, tok.get_vocab_size(), ids)
    params = sum(p.numel() for p in model.parameters())
    log.info("model: %d parameters, %s", params, json.dumps(dataclasses.asdict(mcfg)))
    t1, cpu1 = time.time(), time.process_time()

    probe_s = [0.0]

    def probe(step: int) -> None:
        t = time.time()
        log.info("step %d: held-out error rates %s", step, evaluate.probe(model, tok, ids, hop))
        probe_s[0] += time.time() - t

    losses = model_mod.train(
        model,
        data,
        seqs,
        ids["<|endoftext|>"],
        mcfg,
        bar=bar(mcfg.steps, "training", "step") if bar else None,
        probe=probe if cfg.evaluate else None,
        joiner={"en": tok.encode(" ", add_special_tokens=False).ids},
    )
    training_s, training_cpu_s = time.time() - t1 - probe_s[0], time.process_time() - cpu1

    model.config.switchboard_window_frames = mcfg.window_frames
    model.save_pretrained(out)
    _generation_config(GenerationConfig, ids, mcfg).save_pretrained(out)
    window_s = mcfg.window_frames * hop // SAMPLE_RATE
    WhisperFeatureExtractor(feature_size=80, hop_length=hop, chunk_length=window_s).save_pretrained(out)
    # Written last and explicitly: whether an extra key survives save_pretrained is
    # transformers' business; readers need it there.
    config_path = out / "config.json"
    written = json.loads(config_path.read_text())
    written["switchboard_window_frames"] = mcfg.window_frames
    config_path.write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")

    t2 = time.time()
    heldout = evaluate.report(model, tok, ids, hop) if cfg.evaluate else {}
    info = {
        "name": "switchboard-asr-default",
        "parameters": params,
        "steps": mcfg.steps,
        "training_utterances": len(frames),
        "training_mean_seconds": round(float(frames.mean()) * hop / SAMPLE_RATE, 2),
        "training_audio_hours": round(float(frames.sum()) * hop / SAMPLE_RATE / 3600, 2),
        "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "loss_every_100_steps": [
            round(sum(losses[i : i + 100]) / len(losses[i : i + 100]), 4) for i in range(0, len(losses), 100)
        ],
        "synthesis_seconds": round(synthesis_s, 1),
        "synthesis_cached": cached,
        "training_seconds": round(training_s, 1),
        # CPU seconds of all threads: on a busy machine, what the training would cost alone.
        "training_cpu_seconds": round(training_cpu_s, 1),
        "steps_per_second": round(mcfg.steps / training_s, 3),
        "evaluation_seconds": round(time.time() - t2, 1),
        "build_seconds": round(time.time() - t0, 1),
        "voices": {
            "training_accents": speech.TRAIN_ACCENTS,
            "training_variants": speech.TRAIN_VARIANTS,
            "heldout_training_voice": speech.SEEN_VOICES,
            "heldout_unseen_voice": speech.UNSEEN_VOICES,
        },
        "config": dataclasses.asdict(cfg),
        "espeak_ng": data_mod.espeak_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **heldout,
    }
    (out / REPORT).write_text(json.dumps(info, ensure_ascii=False, indent=2) + "\n")
    return info


def _generation_config(GenerationConfig, ids: dict[str, int], cfg: ModelConfig):
    eot = ids["<|endoftext|>"]
    return GenerationConfig(
        decoder_start_token_id=ids["<|startoftranscript|>"],
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        no_timestamps_token_id=ids["<|notimestamps|>"],
        prev_sot_token_id=ids["<|startofprev|>"],
        is_multilingual=True,
        lang_to_id={f"<|{lang}|>": ids[f"<|{lang}|>"] for lang in speech.LANGS},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        suppress_tokens=[],
        begin_suppress_tokens=[eot],
        max_length=cfg.max_target_positions,
        max_initial_timestamp_index=50,
        return_timestamps=False,
        do_sample=False,
    )


def main(argv: list[str] | None = None) -> int:
    from switchboard import console

    p = argparse.ArgumentParser(prog="python -m switchboard.training.asr", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=paths.BUILD / "asr-default-model", help="model directory")
    p.add_argument("--corpus", type=Path, default=corpus_mod.CORPUS_DIR, help="corpus directory")
    p.add_argument("--steps", type=int, default=ModelConfig.steps, help="training steps")
    p.add_argument("--utterances", type=int, default=data_mod.DataConfig.utterances, help="utterances synthesized")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, its order and the initial weights")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting (e.g. --set d_model=128 --set salad=0.6); settings: "
        + ", ".join(f.name for part in (data_mod.DataConfig, ModelConfig) for f in dataclasses.fields(part)),
    )
    p.add_argument("--workers", type=int, default=2, help="synthesis processes")
    p.add_argument("--cache", type=Path, default=CACHE_DIR, help="where synthesized speech is cached")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation")
    p.add_argument("--force", action="store_true", help="rebuild even if the inputs did not change")
    p.add_argument("--log", type=Path, help="where the detail goes (default build/logs/asr-model.log)")
    args = p.parse_args(argv)

    cfg = BuildConfig(
        data_mod.DataConfig(utterances=args.utterances, seed=args.seed),
        ModelConfig(steps=args.steps, seed=args.seed),
        evaluate=not args.no_eval,
    )
    try:
        for kv in args.set:
            cfg = override(cfg, kv, parts=("data", "model"), fixed=("seed",))
        check_window(cfg)
    except ValueError as e:
        p.error(f"--set: {e}")
    if args.workers < 1:
        p.error("--workers: at least 1")
    with console.step("asr-model", args.log) as out:
        stamp = Stamp(args.out, inputs_digest(cfg, args.corpus))
        if not args.force and stamp.current():
            out.line(f"default speech model up to date ({args.out})")
            return 0
        out.line(
            f"training the default speech model from {args.corpus.name}/ ({cfg.data.utterances} utterances, "
            f"{cfg.model.steps} steps, seed {args.seed}; about 10 minutes on 2 cores; "
            f"detail in {out.log_path or 'the terminal'})"
        )
        args.out.mkdir(parents=True, exist_ok=True)
        with stamp.building():
            info = build(
                args.out,
                cfg,
                args.corpus,
                args.cache,
                args.workers,
                bar=lambda total, desc, unit: out.bar(total, desc, unit),
            )
        out.line(
            f"built {args.out}: {info['parameters'] / 1e6:.1f}M parameters, {info['steps']} steps in "
            f"{info['training_seconds']:.0f} s, {info['build_seconds']:.0f} s in all"
        )
        if "rates" in info:
            from switchboard.training.asr.evaluate import table

            for line in table(info["rates"]):
                out.line(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

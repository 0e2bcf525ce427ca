"""Build the embedded default model from the corpus: ``python -m switchboard.training.chat``.

Writes a Hugging Face checkpoint (config, safetensors weights, tokenizer with chat template)
to the output directory. The build is skipped when a checkpoint made from the same inputs
(corpus files, this code, the training config) is already there.
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

from switchboard.data import corpus as corpus_mod
from switchboard.serving.prompt import DEFAULT_SYSTEM_PROMPT
from switchboard.stamp import Stamp
from switchboard.training.settings import override

log = logging.getLogger("switchboard.training.chat")
PACKAGE = Path(__file__).parents[2]
# What the model is made from (under switchboard/): a change to any of these rebuilds it.
# order_demo.py: the tools the conversations offer.
SOURCES = (
    "training/chat/__main__.py",
    "data/augment.py",
    "data/corpus.py",
    "training/chat/tokenizer.py",
    "training/chat/train.py",
    "training/schedule.py",
    "serving/order_demo.py",
)


def inputs_digest(cfg, corpus_dir: Path) -> str:
    h = hashlib.sha256()
    files = sorted(corpus_dir.glob("*.jsonl")) + [PACKAGE / name for name in SOURCES]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    h.update(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    h.update(DEFAULT_SYSTEM_PROMPT.encode())
    return h.hexdigest()[:16]


def build(out: Path, cfg, corpus_dir: Path, bar=None) -> dict:
    """Train the default model into ``out``; ``bar(total)``, if given, makes the progress bar."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from switchboard.data.augment import noisy
    from switchboard.training.chat import tokenizer as tokmod
    from switchboard.training.chat.train import encode_conversation, train

    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    t0 = time.time()
    data = corpus_mod.load(corpus_dir)

    def rewrite(rng, question: str, lang: str) -> str:
        return noisy(rng, question, lang, cfg.noise_drop) if rng.random() < cfg.question_noise else question

    convs = corpus_mod.training_conversations(
        data,
        cfg.conversations,
        seed=cfg.seed,
        rewrite=rewrite if cfg.question_noise else None,
        tool_share=cfg.tool_share,
        tools_listed_share=cfg.tools_listed_share,
    )

    texts = [DEFAULT_SYSTEM_PROMPT] + [tokmod.message_text(m) for c in convs for m in c if m["role"] != "tools"]
    tok = tokmod.train_tokenizer(texts, cfg.vocab_size, out, cfg.context_window)
    ids = {
        "bos": tok.token_to_id(tokmod.BOS),
        "end": tok.token_to_id(tokmod.END),
        **{r.strip("<|>"): tok.token_to_id(r) for r in tokmod.ROLE_TOKENS},
    }
    pad_id = tok.token_to_id(tokmod.PAD)
    examples = [e for c in convs if (e := encode_conversation(tok, c, DEFAULT_SYSTEM_PROMPT, ids, cfg.max_len))]
    log.info(
        "tokenizer: %d tokens; %d training conversations (%d dropped as too long)",
        tok.get_vocab_size(),
        len(examples),
        len(convs) - len(examples),
    )

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.context_window,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=ids["bos"],
        eos_token_id=ids["end"],
        pad_token_id=pad_id,
    )
    model = LlamaForCausalLM(config)
    losses = train(model, examples, cfg, pad_id, bar=bar(cfg.steps) if bar else None)
    model.save_pretrained(out)
    GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["end"], pad_token_id=pad_id, do_sample=False
    ).save_pretrained(out)
    info = {
        "name": "switchboard-default",
        "system_prompt": DEFAULT_SYSTEM_PROMPT,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_config": dataclasses.asdict(cfg),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "loss_every_20_steps": [
            round(sum(losses[i : i + 20]) / len(losses[i : i + 20]), 4) for i in range(0, len(losses), 20)
        ],
        "build_seconds": round(time.time() - t0, 1),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    (out / "switchboard.json").write_text(json.dumps(info, ensure_ascii=False, indent=2) + "\n")
    return info


def main(argv: list[str] | None = None) -> int:
    from switchboard import console
    from switchboard.training.chat.train import TrainConfig

    p = argparse.ArgumentParser(prog="python -m switchboard.training.chat", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("build/default-model"), help="checkpoint directory")
    p.add_argument("--corpus", type=Path, default=corpus_mod.CORPUS_DIR, help="corpus directory")
    p.add_argument("--steps", type=int, default=TrainConfig.steps, help="training steps")
    p.add_argument("--seed", type=int, default=TrainConfig.seed, help="seed of the data order and the initial weights")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a training setting (e.g. --set lr=0.003 --set lead_weight=1); "
        f"settings: {', '.join(f.name for f in dataclasses.fields(TrainConfig))}",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if the inputs did not change")
    p.add_argument("--log", type=Path, help="where the detail goes (default build/logs/model.log)")
    args = p.parse_args(argv)

    cfg = TrainConfig(steps=args.steps, seed=args.seed)
    try:
        for kv in args.set:
            cfg = override(cfg, kv)
    except ValueError as e:
        p.error(f"--set: {e}")
    stamp = Stamp(args.out, inputs_digest(cfg, args.corpus))
    with console.step("model", args.log) as out:
        if not args.force and stamp.current():
            out.line(f"default model up to date ({args.out})")
            return 0
        out.line(
            f"training the default model from {args.corpus.name}/ ({cfg.steps} steps, seed {cfg.seed}; "
            f"about 5 minutes on 2 cores; detail in {out.log_path or 'the terminal'})"
        )
        args.out.mkdir(parents=True, exist_ok=True)
        with stamp.building():
            info = build(args.out, cfg, args.corpus, bar=lambda total: out.bar(total, "training", "step"))
        out.line(
            f"built {args.out}: {info['parameters'] / 1e6:.1f}M parameters, final loss {info['final_loss']:.3f}, "
            f"{info['build_seconds']:.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tiny random checkpoints of each supported family, built here (nothing downloaded)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

from switchboard import console
from switchboard.data import corpus
from switchboard.training.chat.tokenizer import train_tokenizer

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=256,
    initializer_range=0.2,
)


def config(family: str, vocab: int):
    if family == "llama":
        return LlamaConfig(vocab_size=vocab, num_key_value_heads=2, **SMALL)
    if family == "qwen2":
        return Qwen2Config(vocab_size=vocab, num_key_value_heads=2, **SMALL)
    if family == "mistral":
        return MistralConfig(vocab_size=vocab, num_key_value_heads=1, sliding_window=128, **SMALL)
    if family == "gemma3_text":
        # Two sliding layers (an 8-token window, so the parity prompts cross it) and a global
        # one, grouped-query attention, QK-norm, the scaled embedding, tied weights.
        return Gemma3TextConfig(
            vocab_size=vocab,
            num_key_value_heads=1,
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=8,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            **{**SMALL, "num_hidden_layers": 3},
        )
    if family == "gpt2":
        return GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=256, initializer_range=0.2)
    raise ValueError(family)


@pytest.fixture(scope="session", autouse=True)
def step_logs(tmp_path_factory):
    """Exports in these tests log to their own folder, not over build/logs/export.log."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(console, "LOG_DIR", tmp_path_factory.mktemp("logs"))
        yield console.LOG_DIR


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokenizer")
    texts = [m["content"] for c in corpus.training_conversations(corpus.load(), 400) for m in c]
    train_tokenizer(texts, 512, out, 256)
    return out


def make_checkpoint(family, tokenizer_dir, tmp_path, chat_template=True):
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(family, len(vocab) + 6))
    ckpt = tmp_path / family
    model.save_pretrained(ckpt)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, ckpt / f.name)
    if not chat_template:
        cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
        cfg.pop("chat_template")
        (ckpt / "tokenizer_config.json").write_text(json.dumps(cfg))
    return ckpt


@pytest.fixture(scope="session")
def checkpoint():
    return make_checkpoint

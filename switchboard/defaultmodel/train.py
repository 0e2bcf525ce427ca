"""Supervised training of the default model: loss on assistant tokens only.

Deterministic for a given corpus, seed and thread count: seeded data order, seeded init, a
fixed number of steps (never a time budget).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from tqdm import tqdm

IGNORE = -100


@dataclass(frozen=True)
class TrainConfig:
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 4
    intermediate_size: int = 512
    vocab_size: int = 4096
    context_window: int = 1024
    steps: int = 600
    batch_size: int = 32
    max_len: int = 256
    lr: float = 3e-3
    warmup: int = 20
    seed: int = 0
    conversations: int = 12000


def encode_conversation(tok, conv: list[dict], system: str, ids: dict[str, int],
                        max_len: int) -> tuple[list[int], list[int]] | None:
    """Token ids and labels for ``<|bos|>`` + ``<|role|>content<|end|>`` per message.

    Encoding message by message gives the same ids as encoding the rendered template (the
    special tokens cut the text there anyway) and tells which ids are the assistant's.
    """
    input_ids, labels = [ids["bos"]], [IGNORE]
    for m in [{"role": "system", "content": system}, *conv]:
        content = tok.encode(m["content"], add_special_tokens=False).ids
        piece = [ids[m["role"]], *content, ids["end"]]
        input_ids += piece
        labels += ([IGNORE] + content + [ids["end"]]) if m["role"] == "assistant" else [IGNORE] * len(piece)
    if len(input_ids) > max_len:
        return None
    return input_ids, labels


def batches(examples: list[tuple[list[int], list[int]]], cfg: TrainConfig, pad_id: int):
    """Length-bucketed random batches, so padding stays small."""
    rng = random.Random(cfg.seed)
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), i))
    chunks = [order[i:i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    while True:
        rng.shuffle(chunks)
        for chunk in chunks:
            width = max(len(examples[i][0]) for i in chunk)
            x = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            y = torch.full((len(chunk), width), IGNORE, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                ids, labels = examples[i]
                x[row, :len(ids)] = torch.tensor(ids)
                y[row, :len(ids)] = torch.tensor(labels)
                mask[row, :len(ids)] = 1
            yield x, y, mask


def answer_loss(model, x, mask, y):
    """Cross-entropy on answer tokens only, with the LM head applied only where there is a
    label (about a third of the positions), under bf16 autocast: ~1.6x faster on CPU."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.model(input_ids=x, attention_mask=mask).last_hidden_state
        targets = y[:, 1:]
        keep = targets != IGNORE
        logits = model.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep])


def train(model, examples, cfg: TrainConfig, pad_id: int, progress: bool = True) -> list[float]:
    torch.manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t)))

    model.train()
    losses: list[float] = []
    data = batches(examples, cfg, pad_id)
    bar = tqdm(range(cfg.steps), desc="training default model", unit="step", disable=None if progress else True)
    for step in bar:
        x, y, mask = next(data)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = answer_loss(model, x, mask, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    model.eval()
    return losses

"""Supervised training of the default model: loss on assistant tokens only.

Deterministic for a given corpus, seed and thread count: seeded data order, seeded init, a
fixed number of steps (never a time budget). FP32 throughout: bfloat16 autocast is emulated,
and far slower, on a CPU without native bfloat16 (AVX2 only), and a default model must build
in the same few minutes on any x86-64 machine (docs/default-model.md).

Every conversation starts with the same tokens (``<|bos|><|system|>`` + system prompt +
``<|end|>``), about a quarter of an average example. Their keys and values are computed once
per step on a batch of one and shared by every row (``shared_prefix``); the gradient through
them is the sum over rows, exactly as if each row had computed them itself.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import torch

from switchboard.training.schedule import adamw, warmup_cosine

log = logging.getLogger(__name__)
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
    steps: int = 1400
    batch_size: int = 16
    max_len: int = 256
    lr: float = 2e-3
    warmup: int = 50
    seed: int = 0
    conversations: int = 12000
    question_noise: float = 0.5  # share of FAQ questions rewritten by augment.noisy
    noise_drop: float = 0.15  # its chance of dropping each word / character
    lead_tokens: int = 3  # the first tokens of every answer, where it picks which answer...
    lead_weight: float = 4.0  # ...weigh this much in the loss
    tool_share: float = 0.25  # conversations answered through a tool call (corpus/tools.jsonl)
    tools_listed_share: float = 0.06  # conversations offering the tools, answered in text


def encode_conversation(
    tok, conv: list[dict], system: str, ids: dict[str, int], max_len: int
) -> tuple[list[int], list[int]] | None:
    """Token ids and labels for ``<|bos|>`` + ``<|role|>content<|end|>`` per message.

    Encoding message by message gives the same ids as encoding the rendered template (the
    special tokens cut the text there anyway) and tells which ids are the assistant's. A first
    ``{"role": "tools"}`` message lists the offered tools in the system message; a tool's
    result is the user's turn, as the template writes it (``message_text``).
    """
    from switchboard.training.chat.tokenizer import message_text

    input_ids, labels = [ids["bos"]], [IGNORE]
    if conv and conv[0]["role"] == "tools":
        system, conv = system + "<tools>" + conv[0]["content"] + "</tools>", conv[1:]
    for m in [{"role": "system", "content": system}, *conv]:
        content = tok.encode(message_text(m), add_special_tokens=False).ids
        piece = [ids["user" if m["role"] == "tool" else m["role"]], *content, ids["end"]]
        input_ids += piece
        labels += ([IGNORE] + content + [ids["end"]]) if m["role"] == "assistant" else [IGNORE] * len(piece)
    if len(input_ids) > max_len:
        return None
    return input_ids, labels


def shared_prefix(examples: list[tuple[list[int], list[int]]]) -> int:
    """Length of the token prefix every example shares and none is trained on."""
    first = examples[0][0]
    n = min(len(ids) for ids, _ in examples)
    for ids, labels in examples:
        n = next((i for i in range(n) if ids[i] != first[i] or labels[i] != IGNORE), n)
    return n


def loss_weights(labels: list[int], cfg: TrainConfig) -> list[float]:
    """The loss weight of every position: 0 without a label, ``lead_weight`` for the first
    ``lead_tokens`` of each answer, 1 for the rest."""
    out, run = [], 0
    for y in labels:
        run = run + 1 if y != IGNORE else 0
        out.append(0.0 if y == IGNORE else cfg.lead_weight if run <= cfg.lead_tokens else 1.0)
    return out


def batches(examples: list[tuple[list[int], list[int]]], cfg: TrainConfig, pad_id: int, skip: int = 0):
    """Length-bucketed random batches (ids, labels, mask, loss weights) of the examples less
    their first ``skip`` tokens."""
    rng = random.Random(cfg.seed)
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), i))
    chunks = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    while True:
        rng.shuffle(chunks)
        for chunk in chunks:
            width = max(len(examples[i][0]) for i in chunk) - skip
            x = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            y = torch.full((len(chunk), width), IGNORE, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            weight = torch.zeros((len(chunk), width))
            for row, i in enumerate(chunk):
                ids, labels = examples[i][0][skip:], examples[i][1][skip:]
                x[row, : len(ids)] = torch.tensor(ids)
                y[row, : len(ids)] = torch.tensor(labels)
                mask[row, : len(ids)] = 1
                weight[row, : len(ids)] = torch.tensor(loss_weights(labels, cfg))
            yield x, y, mask, weight


def answer_loss(
    model,
    prefix: torch.Tensor,
    x: torch.Tensor,
    mask: torch.Tensor,
    y: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """Cross-entropy on answer tokens only, the LM head applied only where there is a label:
    the loss to minimise (mean weighted by ``weight``, if given) and the plain mean.

    ``x`` continues ``prefix`` in every row; the prefix runs once and its cache is expanded to
    the batch (its labels are all ignored, so its own outputs are not needed).
    """
    from transformers import DynamicCache

    rows, width, p = x.shape[0], x.shape[1], prefix.shape[0]
    cache = DynamicCache(config=model.config)
    if p:
        model.model(input_ids=prefix[None], past_key_values=cache, use_cache=True)
        cache = DynamicCache(
            ddp_cache_data=[
                (layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1)) for layer in cache.layers
            ]
        )
    full_mask = torch.cat([torch.ones((rows, p), dtype=mask.dtype), mask], 1)
    positions = (p + torch.arange(width))[None].expand(rows, width)
    hidden = model.model(
        input_ids=x, attention_mask=full_mask, position_ids=positions, past_key_values=cache, use_cache=True
    ).last_hidden_state
    targets = y[:, 1:]
    keep = targets != IGNORE
    logits = model.lm_head(hidden[:, :-1][keep])
    per_token = torch.nn.functional.cross_entropy(logits, targets[keep], reduction="none")
    plain = per_token.mean()
    if weight is None:
        return plain, plain.item()
    w = weight[:, 1:][keep]
    return (per_token * w).sum() / w.sum(), plain.item()


def train(model, examples, cfg: TrainConfig, pad_id: int, bar=None) -> list[float]:
    """Train in place; returns the loss of every step. ``bar``: a tqdm-like progress bar."""
    torch.manual_seed(cfg.seed)
    opt = adamw(model.parameters(), cfg.lr, weight_decay=0.05)

    model.train()
    losses: list[float] = []
    skip = shared_prefix(examples)
    prefix = torch.tensor(examples[0][0][:skip], dtype=torch.long)
    data = batches(examples, cfg, pad_id, skip)
    for step in range(cfg.steps):
        x, y, mask, weight = next(data)
        for g in opt.param_groups:
            g["lr"] = warmup_cosine(step, cfg.lr, cfg.warmup, cfg.steps, floor=0.05)
        loss, plain = answer_loss(model, prefix, x, mask, y, weight if cfg.lead_weight != 1.0 else None)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(plain)
        if bar is not None:
            bar.update()
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}", refresh=False)
        if step % 50 == 0 or step == cfg.steps - 1:
            log.info(
                "step %d/%d: loss %.4f (last 20: %.4f)",
                step + 1,
                cfg.steps,
                losses[-1],
                sum(losses[-20:]) / len(losses[-20:]),
            )
    if bar is not None:
        bar.close()
    model.eval()
    return losses

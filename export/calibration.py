"""Calibration prompts drawn from the customer-service corpus, long tail included.

Activation ranges calibrated only on short, plain questions clip what this domain is full of:
codes that mix letters and digits (SKU-A7X92, order SB20481234, tracking JD0123456789),
prices, phone numbers, Chinese and English in one message, and long multi-turn prompts. Each
class is drawn explicitly so the calibration set covers it; ``plain`` is the naive set the
report compares against.
"""

from __future__ import annotations

import random
import re

import numpy as np

from switchboard.data import corpus as corpus_mod

CLASSES = ("plain", "codes", "prices", "phones", "mixed", "long")
_SLOTS = {"codes": ("{sku}", "{order_id}", "{tracking}"), "prices": ("{price}",), "phones": ("{phone}",)}
_HAS_HAN = re.compile(r"[\u4e00-\u9fff]")
_HAS_LATIN = re.compile(r"[A-Za-z]{3,}")


def _conversation(entries, rng, exchanges: int) -> list[dict]:
    messages = []
    for _ in range(exchanges):
        e = rng.choice(entries)
        slots = corpus_mod.sample_slots(rng, e.lang)
        messages.append({"role": "user", "content": corpus_mod.fill_slots(slots, rng.choice(e.questions))})
        messages.append({"role": "assistant", "content": corpus_mod.fill_slots(slots, e.answer)})
    return messages


def conversations(kind: str, n: int, seed: int = 0) -> list[list[dict]]:
    """``n`` conversations (ending with a user turn) of one class, from training questions only."""
    data = corpus_mod.load()
    rng = random.Random(f"{kind}:{seed}")
    faq = list(data.faq)
    out = []
    if kind == "plain":
        pool = [e for e in faq if not corpus_mod.SLOT_RE.search(" ".join(e.questions))]
        for _ in range(n):
            e = rng.choice(pool)
            out.append([{"role": "user", "content": rng.choice(e.questions)}])
    elif kind in _SLOTS:
        pool = [(e, q) for e in faq for q in e.questions if any(s in q for s in _SLOTS[kind])]
        for _ in range(n):
            e, q = rng.choice(pool)
            out.append([{"role": "user", "content": corpus_mod.fill_slots(corpus_mod.sample_slots(rng, e.lang), q)}])
    elif kind == "mixed":
        turns = [
            t["content"]
            for d in data.dialogs
            for t in d.turns
            if t["role"] == "user" and _HAS_HAN.search(t["content"]) and _HAS_LATIN.search(t["content"])
        ]
        zh = [e for e in faq if e.lang == "zh"]
        for i in range(n):
            if turns and i % 2 == 0:
                text = corpus_mod.fill_slots(corpus_mod.sample_slots(rng, "zh"), rng.choice(turns))
            else:  # a Chinese question about an English-named product code
                e = rng.choice(zh)
                text = f"{rng.choice(e.questions)} 型号 {corpus_mod.sample_slots(rng, 'en')['sku']}"
                text = corpus_mod.fill_slots(corpus_mod.sample_slots(rng, "zh"), text)
            out.append([{"role": "user", "content": text}])
    elif kind == "long":
        for _ in range(n):
            conv = _conversation(faq, rng, rng.randint(5, 8))
            out.append(conv[:-1])  # ends with the user's latest question
    else:
        raise ValueError(f"unknown calibration class {kind!r}; choose from {', '.join(CLASSES)}")
    return out


def calibration_set(per_class: int, seed: int = 0, covered: bool = True) -> list[list[dict]]:
    """The covered set draws every class; the naive one only ``plain`` questions."""
    kinds = CLASSES if covered else ("plain",)
    n = per_class if covered else per_class * len(CLASSES)
    return [c for k in kinds for c in conversations(k, n, seed)]


def feeds(decoder, prompts: list[list[int]], fixed_length: int | None = None) -> list[dict[str, np.ndarray]]:
    """ONNX Runtime feeds for calibration.

    Without ``fixed_length``: each prompt's prefill from an empty past plus one decode step on
    top of it, so both activation regimes are calibrated. With it (Entropy, Percentile need
    one shape): prefills only, every prompt left-padded or cut to ``fixed_length`` tokens.
    """
    from switchboard.engine.batch import prefill_inputs

    m = decoder.manifest

    def feed(ids, mask, pos, past):
        f = {"input_ids": ids, "attention_mask": mask, "position_ids": pos}
        for i, (k, v) in enumerate(past):
            f[f"past_key_values.{i}.key"], f[f"past_key_values.{i}.value"] = k, v
        return f

    out = []
    for prompt in prompts:
        if fixed_length:
            prompt = prompt[-fixed_length:]
            pad = fixed_length - len(prompt)
            ids, mask, pos, past, _ = prefill_inputs(
                [[0] * pad + prompt], [0], [None], m.num_layers, m.num_kv_heads, m.head_dim, decoder.dtype
            )
            mask[0, :pad] = 0
            pos[0] = np.maximum(np.arange(fixed_length) - pad, 0)
            out.append(feed(ids, mask, pos, past))
            continue
        ids, mask, pos, past, _ = prefill_inputs(
            [prompt], [0], [None], m.num_layers, m.num_kv_heads, m.head_dim, decoder.dtype
        )
        out.append(feed(ids, mask, pos, past))
        logits, present = decoder.forward(ids, mask, pos, past)
        out.append(
            feed(
                logits[:, -1:].argmax(-1).astype(np.int64),
                np.ones((1, mask.shape[1] + 1), np.int64),
                np.asarray([[len(prompt)]], np.int64),
                present,
            )
        )
    return out

"""How well the trained recognizer hears what it was not trained on.

``speech.heldout_clips()``: the corpus's held-out questions (not in training, though most of
their words are), each spoken by a voice used in training and by one never used (another
accent and variant). Scored as the ASR gate scores: WER for English, CER for Mandarin, after
``switchboard.asr.wer``'s normalization, greedy decoding with the language given.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from switchboard.asr import features as feat
from switchboard.asr import wer
from switchboard.training import speech
from switchboard.training.asr.model import greedy_decode, prompt

log = logging.getLogger(__name__)
BATCH = 32


def transcribe(model, tok, ids: dict[str, int], clips: list[speech.Clip]) -> list[str]:
    """Greedy transcripts of ``clips`` in their own language, batched by length."""
    order = sorted(range(len(clips)), key=lambda i: len(clips[i].samples))
    out = [""] * len(clips)
    for start in range(0, len(order), BATCH):
        index = order[start : start + BATCH]
        # One language per decode call (the prompts must have the same length; they do, but
        # grouping keeps it obvious that each row is forced to its own language).
        x = torch.from_numpy(feat.pad_batch([feat.log_mel(clips[i].samples, 80) for i in index]))
        prompts = [prompt(ids, clips[i].lang) for i in index]
        for i, tokens in zip(index, greedy_decode(model, x, prompts, ids["<|endoftext|>"]), strict=True):
            out[i] = tok.decode(tokens).strip()
    return out


def report(model, tok, ids: dict[str, int]) -> dict:
    """Error rates per language and voice, the held-out set's size and a few examples."""
    clips = speech.heldout_clips()
    hyps = transcribe(model, tok, ids, clips)
    rates: dict[str, dict] = {}
    examples = []
    for lang in speech.LANGS:
        for seen in (True, False):
            index = [i for i, c in enumerate(clips) if c.lang == lang and c.seen_voice == seen]
            refs = [clips[i].text for i in index]
            got = [hyps[i] for i in index]
            rates.setdefault(lang, {})["training_voice" if seen else "unseen_voice"] = {
                "metric": "cer" if lang == "zh" else "wer",
                "error_rate": round(wer.error_rate(refs, got, lang), 4),
                "exact": round(sum(wer.normalize(r) == wer.normalize(h) for r, h in zip(refs, got)) / len(refs), 4),
                "voice": clips[index[0]].voice,
                "clips": len(index),
            }
            examples += [{"voice": clips[i].voice, "ref": clips[i].text, "hyp": hyps[i]} for i in index[:4]]
    for e in examples:
        log.info("%s: %r -> %r", e["voice"], e["ref"], e["hyp"])
    return {
        "rates": rates,
        "heldout_clips": len(clips),
        "heldout_mean_seconds": round(float(np.mean([c.seconds for c in clips])), 2),
        "examples": examples,
    }


def table(rates: dict) -> list[str]:
    """The rates as a few lines of text."""
    lines = [f"{'':14}{'training voice':>16}{'unseen voice':>16}"]
    for lang, by_voice in rates.items():
        metric = by_voice["training_voice"]["metric"].upper()
        cells = "".join(f"{by_voice[k]['error_rate']:>16.3f}" for k in ("training_voice", "unseen_voice"))
        lines.append(f"{lang + ' ' + metric:14}{cells}")
    return lines

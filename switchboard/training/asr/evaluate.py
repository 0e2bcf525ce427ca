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
from switchboard.asr import segment, wer
from switchboard.data import speech
from switchboard.training.asr.model import greedy_decode, prompt

log = logging.getLogger(__name__)
BATCH = 32


def transcribe(model, tok, ids: dict[str, int], clips: list[speech.Clip], hop: int) -> list[str]:
    """Greedy transcripts of ``clips`` in their own language, as serving makes them: audio
    longer than the model's window cut at its pauses (``segment.split``), every chunk padded
    to the window (features ``hop`` samples apart), the chunks' texts joined."""
    window = 2 * model.config.max_source_positions  # the window: every input is padded to it
    seconds = window * hop / feat.SAMPLE_RATE
    chunks = []  # (clip index, features)
    for i, clip in enumerate(clips):
        for a, b in segment.split(clip.samples, max_s=seconds, rate=feat.SAMPLE_RATE):
            chunks.append((i, feat.log_mel(clip.samples[a:b], 80, frames=window, hop=hop)))
    texts: list[list[str]] = [[] for _ in clips]
    for start in range(0, len(chunks), BATCH):
        part = chunks[start : start + BATCH]
        x = torch.from_numpy(feat.pad_batch([f for _, f in part], window))
        prompts = [prompt(ids, clips[i].lang) for i, _ in part]
        # A character takes 50 ms or more to say: a longer transcript is babble.
        limit = int(seconds * 20) + 8
        for (i, _), tokens in zip(part, greedy_decode(model, x, prompts, ids["<|endoftext|>"], limit), strict=True):
            texts[i].append(tok.decode(tokens).strip())
    return [(" " if c.lang == "en" else "").join(t for t in texts[i] if t) for i, c in enumerate(clips)]


def report(model, tok, ids: dict[str, int], hop: int) -> dict:
    """Error rates per language and voice, the held-out set's size and a few examples."""
    clips = speech.heldout_clips()
    hyps = transcribe(model, tok, ids, clips, hop)
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
                "exact": round(wer.exact_share(refs, got), 4),
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


def probe(model, tok, ids: dict[str, int], hop: int, per_group: int = 12) -> dict[str, float]:
    """A quick look during training: error rates on the first ``per_group`` held-out clips
    of each language and voice."""
    clips = speech.heldout_clips()
    out = {}
    for lang in speech.LANGS:
        for seen in (True, False):
            group = [c for c in clips if c.lang == lang and c.seen_voice == seen][:per_group]
            hyps = transcribe(model, tok, ids, group, hop)
            name = f"{lang}/{'training' if seen else 'unseen'}"
            out[name] = round(wer.error_rate([c.text for c in group], hyps, lang), 3)
    return out


def table(rates: dict) -> list[str]:
    """The rates as a few lines of text."""
    lines = [f"{'':14}{'training voice':>16}{'unseen voice':>16}"]
    for lang, by_voice in rates.items():
        metric = by_voice["training_voice"]["metric"].upper()
        cells = "".join(f"{by_voice[k]['error_rate']:>16.3f}" for k in ("training_voice", "unseen_voice"))
        lines.append(f"{lang + ' ' + metric:14}{cells}")
    return lines

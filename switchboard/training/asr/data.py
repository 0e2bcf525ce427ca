"""What the recognizer hears in training: corpus sentences and word salad, many voices, noise.

Trained on the corpus's sentences alone, a tiny model recites them: it picks the nearest
sentence it knows and writes it out, whatever was said (held-out WER 0.66 in the issue's
experiment). Word sequences built from short spans of corpus text ("salad": "refund my the
tracking number arrived") have no sentence to recite, so the model must hear every word; they
keep the corpus vocabulary and its local word order.

Voices: half the utterances are spoken in each language's home voice (espeak-ng's plain
``en-us`` / ``cmn`` at its default speed and pitch, the training voice of the held-out report):
one voice to align sound and text on is what teaches the tiny model to listen within its
budget. Of the rest, most are in a plain voice (a training accent near default speed and pitch)
and the others in a random training voice (accent, variant, speed, pitch, gaps: what makes it
listen to an unseen one); some get waveform augmentation (``speech.augment``). The shares were
measured against each other (docs/benchmarks.md, "Speech").

Rendering (synthesis, augmentation, log-mel) runs in worker processes, in order, so the
result does not depend on their number. It is cached on disk by a digest of what it is made
from, so a change to the training settings alone does not synthesize again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import multiprocessing
import random
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from switchboard.asr import features as feat
from switchboard.data import corpus as corpus_mod
from switchboard.data import speech

log = logging.getLogger(__name__)
# Answers are long; the model hears sentences (and Chinese clauses: a sentence of 40 characters
# is 10 s of speech), as callers say them.
_SENTENCE_END = re.compile(r"(?<=[.!?。！？，；])\s*")
_EDGE_PUNCT = re.compile(r"^[^\w$]+|[^\w%]+$")
_ZH_PUNCT = re.compile(r"[，。？！、；：“”‘’（）,.?!;:()\s]")


@dataclass(frozen=True)
class DataConfig:
    """What is synthesized: how many utterances, which share is word salad (the rest walks
    through the corpus's sentences, each once before any twice), which share is spoken in the
    language's home voice, which share of the others in a plain voice (a training accent,
    near-default speed and pitch) rather than a random one, how many are augmented, the
    longest kept (the model's window), and the samples between feature frames (20 ms: half the
    encoder's work of Whisper's 10 ms, which bought 55% more training steps in the same time and
    lower error rates: docs/benchmarks.md)."""

    utterances: int = 9000
    salad: float = 0.68
    home: float = 0.5
    plain: float = 0.7
    augmented: float = 0.2
    max_seconds: float = 5.0
    hop: int = 320
    seed: int = 0


@dataclass(frozen=True)
class Utterance:
    text: str
    lang: str
    voice: speech.Voice
    seed: int  # of its augmentation
    augment: bool


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(text) if s.strip()]


def corpus_templates(corpus: corpus_mod.Corpus) -> dict[str, list[str]]:
    """Per language, every question and every answer sentence and dialog line of the training
    corpus, with their slot placeholders (held-out questions are not in it)."""
    out: dict[str, list[str]] = {lang: [] for lang in speech.LANGS}
    for e in corpus.faq:
        out[e.lang] += list(e.questions) + _sentences(e.answer)
    for d in corpus.dialogs:
        for t in d.turns:
            out[d.lang] += _sentences(t["content"])
    return out


def _spans_en(rng: random.Random, sentences: list[str], n_words: int) -> str:
    words: list[str] = []
    while len(words) < n_words:
        sentence = rng.choice(sentences).split()
        size = rng.randint(1, 3)
        start = rng.randrange(max(1, len(sentence) - size + 1))
        for w in sentence[start : start + size]:
            w = _EDGE_PUNCT.sub("", w)
            if w:
                words.append(w)
    return " ".join(words[:n_words])


def _spans_zh(rng: random.Random, sentences: list[str], n_chars: int) -> str:
    text = ""
    while len(text) < n_chars:
        # Slot placeholders stay whole: the span is cut from the filled sentence's pieces.
        pieces = [p for p in re.split(r"(\{\w+\})", rng.choice(sentences)) if p]
        piece = rng.choice(pieces)
        if corpus_mod.SLOT_RE.fullmatch(piece):
            text += piece
            continue
        piece = _ZH_PUNCT.sub("", piece)
        if not piece:
            continue
        size = rng.randint(1, 4)
        start = rng.randrange(max(1, len(piece) - size + 1))
        text += piece[start : start + size]
    return text


def utterances(corpus: corpus_mod.Corpus, cfg: DataConfig) -> list[Utterance]:
    """``cfg.utterances`` seeded utterances, the languages alternating."""
    rng = random.Random(cfg.seed)
    templates = corpus_templates(corpus)
    sentences = {lang: [] for lang in speech.LANGS}
    out = []
    for i in range(cfg.utterances):
        lang = speech.LANGS[i % len(speech.LANGS)]
        if rng.random() < cfg.salad:
            if lang == "zh":
                template = _spans_zh(rng, templates[lang], rng.randint(3, 12))
            else:
                template = _spans_en(rng, templates[lang], rng.randint(2, 10))
        else:
            if not sentences[lang]:
                sentences[lang] = rng.sample(templates[lang], len(templates[lang]))
            template = sentences[lang].pop()
        text = corpus_mod.fill_slots(corpus_mod.sample_slots(rng, lang), template).strip()
        if rng.random() < cfg.home:
            voice = speech.home_voice(lang)
        elif rng.random() < cfg.plain:
            voice = speech.plain_voice(rng, lang)
        else:
            voice = speech.random_voice(rng, lang)
        out.append(Utterance(text, lang, voice, rng.randrange(2**31), rng.random() < cfg.augmented))
    return out


def render(u: Utterance, hop: int = feat.HOP) -> np.ndarray:
    """[n_mels, frames] float16 features of one utterance, as the model will see them."""
    samples = speech.speak(u.text, u.lang, u.voice)
    if u.augment:
        samples = speech.augment(samples, np.random.default_rng(u.seed))
    return feat.log_mel(samples, 80, hop=hop).astype(np.float16)


def _render_all(
    items: list[Utterance], workers: int, progress: Callable[[int], None] | None, hop: int
) -> list[np.ndarray]:
    if workers <= 1:
        out = []
        for u in items:
            out.append(render(u, hop))
            if progress:
                progress(1)
        return out
    # spawn: the parent has torch loaded (and maybe its threads started), which fork copies badly.
    ctx = multiprocessing.get_context("spawn")
    out = []
    with ctx.Pool(workers) as pool:
        for f in pool.imap(functools.partial(render, hop=hop), items, chunksize=16):
            out.append(f)
            if progress:
                progress(1)
    return out


def espeak_version() -> str:
    path = shutil.which("espeak-ng")
    if path is None:
        raise speech.SpeechError("espeak-ng not found on PATH (Debian: apt-get install espeak-ng)")
    return subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout.strip()


def data_digest(cfg: DataConfig, corpus_dir: Path) -> str:
    """What the rendered features depend on: corpus, this code, the synthesizer, the config."""
    h = hashlib.sha256()
    for f in [*sorted(corpus_dir.glob("*.jsonl")), Path(__file__), Path(speech.__file__), Path(feat.__file__)]:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    h.update(espeak_version().encode())
    h.update(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    return h.hexdigest()[:16]


@dataclass
class Dataset:
    items: list[Utterance]
    features: list[np.ndarray]  # [n_mels, frames] float16 each

    @property
    def frames(self) -> np.ndarray:
        return np.array([f.shape[1] for f in self.features])


def load(
    cfg: DataConfig,
    corpus_dir: Path,
    cache_dir: Path | None,
    workers: int = 2,
    bar: Callable[[int], object] | None = None,
) -> tuple[Dataset, bool]:
    """The rendered training set and whether it came from the cache. ``bar(total)`` makes a
    progress bar (anything with ``update(n)`` and ``close()``)."""
    items = utterances(corpus_mod.load(corpus_dir), cfg)
    digest = data_digest(cfg, corpus_dir)
    path = cache_dir / digest if cache_dir is not None else None
    if path is not None and (path / "frames.npy").exists():
        frames = np.load(path / "frames.npy")
        flat = np.load(path / "features.npy", mmap_mode="r")
        bounds = np.concatenate([[0], np.cumsum(frames)])
        features = [np.array(flat[:, bounds[i] : bounds[i + 1]]) for i in range(len(frames))]
        log.info("speech: %d utterances from the cache %s", len(features), path)
        return _kept(Dataset(items, features), cfg), True
    progress = bar(len(items)) if bar else None
    try:
        features = _render_all(items, workers, progress.update if progress else None, cfg.hop)
    finally:
        if progress:
            progress.close()
    if path is not None:
        # One cached set at a time: an old one is a few hundred MB nobody will read again.
        if cache_dir.exists():
            for old in cache_dir.iterdir():
                if old.is_dir() and old.name != digest:
                    shutil.rmtree(old, ignore_errors=True)
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        np.save(tmp / "features.npy", np.concatenate(features, axis=1))
        np.save(tmp / "frames.npy", np.array([f.shape[1] for f in features]))
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
    return _kept(Dataset(items, features), cfg), False


def _kept(data: Dataset, cfg: DataConfig) -> Dataset:
    limit = int(cfg.max_seconds * feat.SAMPLE_RATE / cfg.hop)
    keep = [i for i, f in enumerate(data.features) if f.shape[1] <= limit]
    if len(keep) < len(data.items):
        log.info("speech: %d utterances longer than %.0f s left out", len(data.items) - len(keep), cfg.max_seconds)
    return Dataset([data.items[i] for i in keep], [data.features[i] for i in keep])

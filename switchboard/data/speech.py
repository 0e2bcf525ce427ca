"""Speech for the embedded recognizer: the corpus spoken by Debian's ``espeak-ng``, and noise.

The default speech recognizer is trained from the repository alone, so its audio is
synthesized. ``espeak-ng`` is a formant synthesizer: every voice is the same engine with other
formants, pitch and timing, and a model trained on one voice learns that voice. Variety is
what makes it listen: many accents (``en-us``, ``en-gb-x-rp``, ``en-029``...) crossed with
many voice variants (``+f3``, ``+m5``, ``+klatt2``...), random speed, pitch and word gaps, then
noise, gain, room echo and telephone bandwidth on the waveform.

``heldout_clips()`` is the evaluation set every ASR check shares (the INT8 gate, the default
model's report): the corpus's held-out questions, never trained on, each spoken by a voice
that training uses and by one it never hears (another accent and another variant). It is
deterministic: the same slot values, voices and samples on every run.

The synthesizer runs as a subprocess writing WAV to a pipe, read in memory (no temporary
files), resampled to 16 kHz with soxr.
"""

from __future__ import annotations

import functools
import io
import random
import re
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

from switchboard.data import corpus as corpus_mod

SAMPLE_RATE = 16_000
LANGS = ("en", "zh")

# Accents per language. Mandarin is ``cmn`` only: espeak-ng's ``zh`` is an MBROLA voice
# (not installed) and ``yue`` is Cantonese. ``cmn-latn-pinyin`` differs from ``cmn`` in how
# it reads Latin letters (order numbers, SKU codes), which is variety worth having.
TRAIN_ACCENTS = {
    "en": ("en-us", "en-us-nyc", "en-gb", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-gb-x-gbclan"),
    "zh": ("cmn", "cmn-latn-pinyin"),
}
# Voice variants (formants, pitch range, breathiness). Whispering, croaking and the robot
# variants are left out: callers do not sound like that, and they cost the tiny model capacity.
TRAIN_VARIANTS = (
    "",
    "m1",
    "m2",
    "m3",
    "m4",
    "m5",
    "m6",
    "m7",
    "f1",
    "f2",
    "f3",
    "f4",
    "klatt",
    "klatt2",
    "klatt3",
    "klatt4",
    "Alex",
    "Alicia",
    "Andy",
    "Annie",
    "aunty",
    "belinda",
    "benjamin",
    "david",
    "edward",
    "Gene",
    "iven",
    "iven3",
    "john",
    "Lee",
    "linda",
    "Michael",
    "Mike",
    "norbert",
    "paul",
    "quincy",
    "rob",
    "steph",
    "travis",
    "victor",
)
# The held-out voices: an accent and a variant that training never uses.
UNSEEN_VOICES = {"en": "en-gb-x-gbcwmd+Andrea", "zh": "cmn+f5"}
# The training voice the held-out questions are also spoken in (plain default settings).
SEEN_VOICES = {"en": "en-us", "zh": "cmn"}

DEFAULT_SPEED = 175  # espeak-ng's own default, words per minute
DEFAULT_PITCH = 50  # 0-99


class SpeechError(RuntimeError):
    """espeak-ng is missing or could not speak the text."""


@dataclass(frozen=True)
class Voice:
    """How espeak-ng speaks: voice name (accent+variant), words per minute, pitch 0-99, and
    the extra pause between words in units of 10 ms."""

    name: str
    speed: int = DEFAULT_SPEED
    pitch: int = DEFAULT_PITCH
    gap: int = 0


@dataclass(frozen=True)
class Clip:
    """A spoken sentence: 16 kHz mono float32 samples and what was said."""

    samples: np.ndarray
    text: str
    lang: str
    voice: str
    seen_voice: bool = True

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def _check_lang(lang: str) -> None:
    if lang not in LANGS:
        raise ValueError(f"lang {lang!r}: expected one of {', '.join(LANGS)}")


@functools.lru_cache(maxsize=1)
def _espeak() -> str:
    path = shutil.which("espeak-ng")
    if path is None:
        raise SpeechError("espeak-ng not found on PATH (Debian: apt-get install espeak-ng)")
    return path


@functools.lru_cache(maxsize=1)
def variants() -> frozenset[str]:
    """The voice variants this espeak-ng has (``+name`` falls back to the plain voice without a
    word when ``name`` does not exist, so names are checked here)."""
    listing = subprocess.run([_espeak(), "--voices=variant"], capture_output=True, check=False).stdout
    return frozenset(re.findall(r"!v/(\S+(?: \S+)?)(?:\s{2,}|\s*$)", listing.decode("utf-8", "replace"), re.M))


def synthesize(
    text: str,
    lang: str,
    voice: str | None = None,
    speed: int = DEFAULT_SPEED,
    pitch: int = DEFAULT_PITCH,
    gap: int = 0,
    rate: int = SAMPLE_RATE,
) -> np.ndarray:
    """``text`` spoken by espeak-ng: float32 mono samples at ``rate`` Hz.

    ``voice`` is an espeak-ng voice name with an optional variant (``en-gb+f3``); default the
    language's plain voice. ``speed`` is in words per minute (80-450), ``pitch`` 0-99, ``gap``
    an extra pause between words in 10 ms units."""
    import soundfile
    import soxr

    _check_lang(lang)
    if not text or not text.strip():
        raise ValueError("text is empty: nothing to speak")
    if not 80 <= speed <= 450:
        raise ValueError(f"speed {speed}: expected 80-450 words per minute")
    if not 0 <= pitch <= 99:
        raise ValueError(f"pitch {pitch}: expected 0-99")
    voice = voice or SEEN_VOICES[lang]
    variant = voice.partition("+")[2]
    if variant and variant not in variants():
        raise ValueError(f"voice {voice!r}: espeak-ng has no variant {variant!r}")
    cmd = [_espeak(), "-v", voice, "-s", str(speed), "-p", str(pitch), "-g", str(gap), "--stdout", "--stdin"]
    # Text goes through stdin so a sentence starting with "-" is not read as an option.
    proc = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, check=False)
    if proc.returncode != 0 or len(proc.stdout) <= 44:
        detail = proc.stderr.decode("utf-8", "replace").strip() or f"exit status {proc.returncode}, no audio"
        raise SpeechError(f"espeak-ng -v {voice} could not speak {text[:40]!r}: {detail}")
    # espeak-ng writes a streaming WAV header (sizes unknown); libsndfile reads it anyway.
    samples, source_rate = soundfile.read(io.BytesIO(proc.stdout), dtype="float32")
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    if source_rate != rate:
        samples = soxr.resample(samples, source_rate, rate, quality="HQ")
    return np.ascontiguousarray(samples, dtype=np.float32)


def speak(text: str, lang: str, voice: Voice, rate: int = SAMPLE_RATE) -> np.ndarray:
    return synthesize(text, lang, voice.name, voice.speed, voice.pitch, voice.gap, rate)


def random_voice(rng: random.Random, lang: str) -> Voice:
    """A training voice: accent, variant, speed, pitch and word gap drawn from ``rng``."""
    _check_lang(lang)
    accent = rng.choice(TRAIN_ACCENTS[lang])
    variant = rng.choice(TRAIN_VARIANTS)
    name = f"{accent}+{variant}" if variant else accent
    # Mandarin syllables are dense: espeak's words-per-minute reads them faster than English.
    speed = int(rng.triangular(120, 240, 170) if lang == "en" else rng.triangular(110, 210, 150))
    pitch = int(rng.triangular(15, 90, 50))
    gap = rng.choice((0, 0, 0, 1, 2, 4))
    return Voice(name, speed, pitch, gap)


def home_voice(lang: str) -> Voice:
    """The language's plain voice at espeak-ng's default speed and pitch: the training voice the
    held-out questions are spoken in."""
    _check_lang(lang)
    return Voice(SEEN_VOICES[lang])


def plain_voice(rng: random.Random, lang: str) -> Voice:
    """A training accent in its plain variant, near the default speed and pitch: the easy
    voices a model first learns to listen with."""
    _check_lang(lang)
    speed = int(rng.uniform(0.9, 1.1) * (DEFAULT_SPEED if lang == "en" else 150))
    return Voice(rng.choice(TRAIN_ACCENTS[lang]), speed, int(rng.uniform(40, 60)), 0)


# --- the held-out set ----------------------------------------------------------------------


def heldout_sentences(lang: str | None = None, seed: int = 0) -> list[tuple[str, str]]:
    """(text, lang) for every held-out question, slots filled with seeded values."""
    if lang is not None:
        _check_lang(lang)
    out = []
    for entry in corpus_mod.load().faq:
        if lang is not None and entry.lang != lang:
            continue
        for j, question in enumerate(entry.heldout):
            # One generator per question, so adding a question elsewhere changes nothing here.
            rng = random.Random(f"{seed}:{entry.id}:{j}")
            out.append((corpus_mod.fill_slots(corpus_mod.sample_slots(rng, entry.lang), question), entry.lang))
    return out


@functools.lru_cache(maxsize=4)
def _heldout(seed: int, lang: str) -> tuple[Clip, ...]:
    # one language at a time: a gate that judges English alone does not wait for Mandarin
    clips = []
    for text, lng in heldout_sentences(lang, seed):
        for voice, seen in ((SEEN_VOICES[lng], True), (UNSEEN_VOICES[lng], False)):
            samples = synthesize(text, lng, voice)
            samples.flags.writeable = False  # shared by every caller of the cache
            clips.append(Clip(samples, text, lng, voice, seen))
    return tuple(clips)


def heldout_clips(lang: str | None = None, seed: int = 0) -> list[Clip]:
    """The held-out questions (never in training) spoken twice: by a training voice
    (``seen_voice=True``) and by a voice training never uses. Deterministic for a ``seed``;
    ``lang`` keeps one language ("en" or "zh")."""
    if lang is not None:
        _check_lang(lang)
    return [c for lng in ((lang,) if lang else LANGS) for c in _heldout(seed, lng)]


# --- augmentation on the waveform ------------------------------------------------------------


def gain(samples: np.ndarray, db: float) -> np.ndarray:
    """Louder or quieter by ``db`` decibels, clipped to [-1, 1] as a real input would be."""
    return np.clip(samples * np.float32(10 ** (db / 20)), -1.0, 1.0).astype(np.float32)


def _colored_noise(rng: np.random.Generator, n: int, color: str) -> np.ndarray:
    white = rng.standard_normal(n)
    if color == "white":
        return white
    # Shape the spectrum: power falling as 1/f (pink) or 1/f^2 (brown), like hum and rumble.
    exponent = {"pink": 0.5, "brown": 1.0}.get(color)
    if exponent is None:
        raise ValueError(f"noise color {color!r}: expected white, pink or brown")
    spectrum = np.fft.rfft(white)
    freqs = np.fft.rfftfreq(n)
    freqs[0] = freqs[1] if n > 1 else 1.0
    return np.fft.irfft(spectrum / freqs**exponent, n)


def add_noise(samples: np.ndarray, snr_db: float, rng: np.random.Generator, color: str = "white") -> np.ndarray:
    """Noise added at a signal-to-noise ratio of ``snr_db`` decibels."""
    if len(samples) == 0:
        return samples.astype(np.float32)
    noise = _colored_noise(rng, len(samples), color)
    signal_power = float(np.mean(samples.astype(np.float64) ** 2)) or 1e-10
    noise_power = float(np.mean(noise**2)) or 1e-10
    noise *= np.sqrt(signal_power / (noise_power * 10 ** (snr_db / 10)))
    return np.clip(samples + noise, -1.0, 1.0).astype(np.float32)


def reverb(samples: np.ndarray, rng: np.random.Generator, rt60: float = 0.3, wet: float = 0.4) -> np.ndarray:
    """A small room: the samples convolved with exponentially decaying noise (reverberation
    time ``rt60`` seconds), mixed ``wet`` with the dry signal, level kept."""
    n_ir = max(1, int(rt60 * SAMPLE_RATE))
    t = np.arange(n_ir) / SAMPLE_RATE
    ir = rng.standard_normal(n_ir) * np.exp(-6.9 * t / rt60)  # -60 dB at rt60
    ir[0] = 0.0
    ir /= np.sqrt(np.sum(ir**2)) or 1.0
    n = len(samples) + n_ir - 1
    size = 1 << (n - 1).bit_length()
    tail = np.fft.irfft(np.fft.rfft(samples, size) * np.fft.rfft(ir, size), size)[: len(samples)]
    out = (1 - wet) * samples + wet * tail
    peak = float(np.max(np.abs(out))) if len(out) else 0.0
    ref = float(np.max(np.abs(samples))) if len(samples) else 0.0
    if peak > 0 and ref > 0:
        out *= ref / peak
    return out.astype(np.float32)


def telephone(samples: np.ndarray, rate: int = 8000) -> np.ndarray:
    """Narrowband: down to ``rate`` and back, so nothing above ``rate / 2`` Hz is left (a phone
    line carries up to about 3.4 kHz)."""
    import soxr

    narrow = soxr.resample(samples, SAMPLE_RATE, rate, quality="HQ")
    out = soxr.resample(narrow, rate, SAMPLE_RATE, quality="HQ")
    return np.ascontiguousarray(out[: len(samples)], dtype=np.float32)


def pad_silence(samples: np.ndarray, rng: np.random.Generator, max_seconds: float = 0.4) -> np.ndarray:
    """Random silence before and after: callers do not start speaking at sample zero."""
    before, after = (int(rng.uniform(0, max_seconds) * SAMPLE_RATE) for _ in range(2))
    return np.pad(samples, (before, after)).astype(np.float32)


@dataclass(frozen=True)
class Augment:
    """How often each waveform change is applied, and its range."""

    p_noise: float = 0.6
    snr_db: tuple[float, float] = (5.0, 35.0)
    p_reverb: float = 0.25
    rt60: tuple[float, float] = (0.1, 0.5)
    p_telephone: float = 0.2
    gain_db: tuple[float, float] = (-18.0, 6.0)
    silence_s: float = 0.4


def augment(samples: np.ndarray, rng: np.random.Generator, cfg: Augment = Augment()) -> np.ndarray:
    """One random version of a clip: silence around it, maybe echo, maybe phone bandwidth,
    maybe noise, a random level."""
    out = pad_silence(samples, rng, cfg.silence_s)
    if rng.random() < cfg.p_reverb:
        out = reverb(out, rng, rt60=rng.uniform(*cfg.rt60), wet=rng.uniform(0.2, 0.6))
    if rng.random() < cfg.p_telephone:
        out = telephone(out, int(rng.choice([8000, 11025])))
    if rng.random() < cfg.p_noise:
        out = add_noise(out, rng.uniform(*cfg.snr_db), rng, color=str(rng.choice(["white", "pink", "brown"])))
    return gain(out, rng.uniform(*cfg.gain_db))

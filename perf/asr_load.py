"""The ASR benchmark's audio, load and arithmetic (``perf.asr_bench``).

Every system hears the same files: corpus questions spoken by Debian's espeak-ng, encoded as
16 kHz 16-bit WAV, in one fixed order. A system is a ``call(clip) -> Reply`` (Switchboard's
SDK, an HTTP client of the LitServe peer, faster-whisper in process), and the suite's two
loops (``perf.load``) drive each: ``closed_loop`` (``concurrency`` callers, each sending its
next clip as soon as its last one is answered: throughput) and ``open_loop`` (arrivals on a
seeded Poisson schedule, whatever is in flight: latency under a load that does not wait for
the server, seed 001's experiment).

Throughput is counted in audio seconds transcribed per wall second (the inverse real-time
factor) from the first request sent to the last answered, so a system that batches well and
one that runs requests side by side are measured alike.

The clip sets are built here from the corpus; everything else is pure (no clock but the one
passed in, no threads but those ``perf.load``'s loops start), so the unit tests run it with
fakes.
"""

from __future__ import annotations

import io
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from perf import load
from perf.stats import percentile
from switchboard.data import corpus

SAMPLE_RATE = 16_000
INDEX = "clips.json"


@dataclass(frozen=True)
class Clip:
    """One audio file every system transcribes: what was said, in which language, how long."""

    id: str
    text: str
    lang: str
    seconds: float
    wav: bytes = field(repr=False, default=b"")
    kind: str = "question"  # question, short or long (seed 001's mix), voice


@dataclass
class Reply:
    """What a system answered: the transcript, and what the server said of its work."""

    text: str
    extra: dict = field(default_factory=dict)  # e.g. Switchboard's queue_ms, batch_size, chunks


@dataclass
class Sample:
    """One request as the client saw it (seconds on ``time.monotonic``)."""

    clip: str
    kind: str
    seconds: float  # audio
    sent: float
    done: float
    ok: bool
    text: str = ""
    error: str = ""
    scheduled: float | None = None  # open loop: when it was due (``sent`` - this: the sender's lag)
    extra: dict = field(default_factory=dict)

    @property
    def latency(self) -> float:
        return self.done - self.sent


# -- audio ------------------------------------------------------------------------------------
def wav_bytes(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, np.clip(samples, -1.0, 1.0), rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def fit(samples: np.ndarray, seconds: float, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``samples`` padded with silence (half before, half after) or cut to exactly ``seconds``."""
    n = int(round(seconds * rate))
    if len(samples) >= n:
        return samples[:n].astype(np.float32, copy=False)
    before = (n - len(samples)) // 2
    return np.concatenate(
        [np.zeros(before, np.float32), samples.astype(np.float32), np.zeros(n - len(samples) - before, np.float32)]
    )


# Voices every model's clips rotate through: the plain voice of each language and two accents
# or variants, so no system is measured on one voice's quirks.
VOICES = {"en": ("en-us", "en-gb-x-rp", "en-us+f3"), "zh": ("cmn", "cmn+f3", "cmn+m3")}


def spoken(text: str, lang: str, voice: str) -> np.ndarray:
    from switchboard.data import speech

    return speech.synthesize(text, lang, voice)


def question_clips(
    langs: Sequence[str], count: int, seed: int = 0, speak: Callable = spoken, max_s: float = 8.0
) -> list[Clip]:
    """``count`` spoken questions, the languages taking turns; questions longer than ``max_s``
    are passed over."""
    pools = {lang: iter(corpus.spoken_questions(lang, seed)) for lang in langs}
    clips: list[Clip] = []
    i = 0
    while len(clips) < count:
        lang = langs[i % len(langs)]
        i += 1
        text = next(pools[lang], None)
        if text is None:
            raise ValueError(f"the corpus has too few {lang} questions for {count} clips")
        voice = VOICES[lang][len(clips) % len(VOICES[lang])]
        samples = speak(text, lang, voice)
        if len(samples) / SAMPLE_RATE > max_s:
            continue
        clips.append(Clip(f"q{len(clips):03d}-{lang}", text, lang, len(samples) / SAMPLE_RATE, wav_bytes(samples)))
    return clips


def fitted_clip(text: str, lang: str, seconds: float, ident: str, kind: str, speak: Callable = spoken) -> Clip:
    """``text`` spoken and padded with silence to ``seconds`` (the 3 s voice question)."""
    samples = speak(text, lang, VOICES[lang][0])
    if len(samples) / SAMPLE_RATE > seconds:
        raise ValueError(f"{text!r} takes {len(samples) / SAMPLE_RATE:.1f} s spoken, more than {seconds} s")
    return Clip(ident, text, lang, seconds, wav_bytes(fit(samples, seconds)), kind)


def mix_clips(
    lang: str,
    short_s: float = 2.0,
    long_s: float = 30.0,
    shorts: int = 8,
    longs: int = 3,
    gap_s: float = 0.6,
    seed: int = 0,
    speak: Callable = spoken,
) -> list[Clip]:
    """Seed 001's two lengths: questions that fit in ``short_s``, padded to it; and recordings
    of ``long_s``: questions one after another with ``gap_s`` of silence between them (the
    pauses a long recording is cut at), padded to exactly ``long_s``."""
    pool = corpus.spoken_questions(lang, seed)
    short, spoken_all = [], []
    for text in pool:
        samples = speak(text, lang, VOICES[lang][len(spoken_all) % len(VOICES[lang])])
        spoken_all.append((text, samples))
        if len(short) < shorts and len(samples) / SAMPLE_RATE <= short_s - 0.1:
            short.append(Clip(f"short{len(short):02d}", text, lang, short_s, wav_bytes(fit(samples, short_s)), "short"))
        if len(short) == shorts and len(spoken_all) >= 4 * longs:
            break
    if len(short) < shorts:
        raise ValueError(f"only {len(short)} {lang} questions fit in {short_s} s; {shorts} wanted")
    longs_out = []
    gap = np.zeros(int(gap_s * SAMPLE_RATE), np.float32)
    k = 0
    for n in range(longs):
        parts, texts, total = [], [], 0
        limit = int((long_s - gap_s) * SAMPLE_RATE)
        while True:
            text, samples = spoken_all[k % len(spoken_all)]
            if total + len(samples) + len(gap) > limit:
                break
            parts += [samples, gap]
            texts.append(text)
            total += len(samples) + len(gap)
            k += 1
        audio = np.concatenate([gap, *parts]) if parts else gap
        longs_out.append(
            Clip(f"long{n:02d}", " ".join(texts), lang, long_s, wav_bytes(fit(audio, long_s)), "long")
        )  # fmt: skip
    return short + longs_out


def save_clips(clips: Sequence[Clip], directory: Path) -> Path:
    """The WAV files and an index (``clips.json``): what the peers' processes read."""
    directory.mkdir(parents=True, exist_ok=True)
    index = []
    for c in clips:
        (directory / f"{c.id}.wav").write_bytes(c.wav)
        index.append({k: v for k, v in asdict(c).items() if k != "wav"} | {"file": f"{c.id}.wav"})
    path = directory / INDEX
    path.write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n")
    return path


def load_clips(directory: Path) -> list[Clip]:
    index = json.loads((directory / INDEX).read_text())
    return [
        Clip(
            e["id"], e["text"], e["lang"], e["seconds"], (directory / e["file"]).read_bytes(), e.get("kind", "question")
        )
        for e in index
    ]


# -- load -------------------------------------------------------------------------------------
def _sample(record: load.Sent) -> Sample:
    clip: Clip = record.item
    if record.error is not None:
        error = f"{type(record.error).__name__}: {record.error}"[:300]
        return Sample(clip.id, clip.kind, clip.seconds, record.sent, record.done, False, error=error)
    reply: Reply = record.result
    return Sample(clip.id, clip.kind, clip.seconds, record.sent, record.done, True, reply.text, extra=reply.extra)


def closed_loop(
    call: Callable[[Clip], Reply],
    clips: Sequence[Clip],
    concurrency: int,
    requests: int,
    warmup: int = 0,
    clock: Callable[[], float] = time.monotonic,
) -> list[Sample]:
    """``requests`` requests from ``concurrency`` callers, each sending the next clip of
    ``clips`` (in order, wrapping) when its last one is answered (``load.closed_loop``).
    ``warmup`` requests first, at the same concurrency and not returned (first-call costs stay
    out)."""
    if concurrency < 1 or requests < 1:
        raise ValueError(f"concurrency {concurrency} and requests {requests} must be at least 1")
    if not clips:
        raise ValueError("no clips to send")
    if warmup:
        load.closed_loop(call, [clips[i % len(clips)] for i in range(warmup)], concurrency, clock)
    return [
        _sample(r) for r in load.closed_loop(call, [clips[i % len(clips)] for i in range(requests)], concurrency, clock)
    ]


def poisson_arrivals(rate_per_s: float, duration_s: float, mix: dict[str, float], seed: int = 0) -> list[tuple]:
    """(time, kind) of arrivals over ``duration_s`` at ``rate_per_s`` on average, each of a
    kind drawn with the weights of ``mix`` (e.g. {"short": 0.8, "long": 0.2})."""
    draw = load.weighted(mix)
    return load.poisson_schedule(rate_per_s, duration_s, random.Random(f"asr-arrivals:{seed}"), draw)


def open_loop(
    call: Callable[[Clip], Reply],
    arrivals: Sequence[tuple],
    clips_by_kind: dict[str, Sequence[Clip]],
    max_in_flight: int = 256,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Sample]:
    """Each arrival (time from now, kind) sends the next clip of its kind at its time, whether
    or not earlier requests were answered (``load.open_loop``)."""
    counters = dict.fromkeys(clips_by_kind, 0)
    schedule = []
    for at, kind in arrivals:
        schedule.append((at, clips_by_kind[kind][counters[kind] % len(clips_by_kind[kind])]))
        counters[kind] += 1
    out = []
    for record in load.open_loop(call, schedule, clock, sleep, max_in_flight):
        sample = _sample(record)
        sample.scheduled = record.scheduled
        out.append(sample)
    return out


# -- arithmetic -------------------------------------------------------------------------------
def throughput(samples: Sequence[Sample]) -> dict:
    """Audio seconds transcribed per wall second, and the rest of a closed-loop run's figures."""
    ok = [s for s in samples if s.ok]
    wall = (max(s.done for s in samples) - min(s.sent for s in samples)) if samples else float("nan")
    audio = sum(s.seconds for s in ok)
    lat = [s.latency for s in ok]
    return {
        "requests": len(samples),
        "failed": len(samples) - len(ok),
        "audio_s": audio,
        "wall_s": wall,
        "audio_s_per_s": audio / wall if wall and wall > 0 else float("nan"),
        "requests_per_s": len(ok) / wall if wall and wall > 0 else float("nan"),
        "latency_p50_s": percentile(lat, 50),
        "latency_p99_s": percentile(lat, 99),
    }


def latency_by_kind(samples: Sequence[Sample]) -> dict:
    """Per kind of clip: count, failures, latency P50/P90/P99 and the largest (seconds)."""
    out = {}
    for kind in sorted({s.kind for s in samples}):
        mine = [s for s in samples if s.kind == kind]
        lat = [s.latency for s in mine if s.ok]
        out[kind] = {
            "requests": len(mine),
            "failed": sum(not s.ok for s in mine),
            "p50_s": percentile(lat, 50),
            "p90_s": percentile(lat, 90),
            "p99_s": percentile(lat, 99),
            "max_s": max(lat) if lat else float("nan"),
        }
    return out


def error_rates(samples: Sequence[Sample], clips: Sequence[Clip]) -> dict:
    """WER (English) and CER (Mandarin) of the answered requests against what was said."""
    from switchboard.asr.wer import error_rate

    said = {c.id: c for c in clips}
    out = {}
    for lang in sorted({said[s.clip].lang for s in samples if s.clip in said}):
        pairs = [(said[s.clip].text, s.text) for s in samples if s.ok and s.clip in said and said[s.clip].lang == lang]
        if pairs:
            refs, hyps = zip(*pairs)
            out[lang] = error_rate(list(refs), list(hyps), lang)
    return out


# -- checkpoints and audio, shared by the bench and its peers ---------------------------------
def window_seconds(checkpoint: Path) -> float:
    """The input window stock Whisper code pads to: ``2 * max_source_positions`` frames, of
    ``hop_length`` samples each."""
    from switchboard.asr.checkpoint import hop_length

    config = json.loads((Path(checkpoint) / "config.json").read_text())
    return 2 * config["max_source_positions"] * hop_length(checkpoint) / SAMPLE_RATE


def generation(checkpoint: Path) -> dict:
    path = Path(checkpoint) / "generation_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def multilingual(checkpoint: Path) -> bool:
    return bool(generation(checkpoint).get("is_multilingual", False))


def decode_audio(data: bytes):
    """16 kHz mono float32 samples of an audio file, in memory."""
    import soundfile
    import soxr

    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    if rate != SAMPLE_RATE:
        samples = soxr.resample(samples, rate, SAMPLE_RATE)
    return np.ascontiguousarray(samples, dtype=np.float32)

"""Which voices a recognizer hears: ``python -m perf.asr_voices``.

The held-out report (``switchboard.training.asr.evaluate``) scores two voices per language: the
training voice, and one voice training never uses, an unseen accent in an unseen variant. This
splits "unseen" apart. The same held-out questions are spoken by voices that differ from
training in the accent, in the variant (formants, pitch, breath), in both or in neither. Each
recognizer given transcribes them as the pool decodes (``AsrModel`` on PyTorch, greedy, the
language given; audio longer than the window cut at its pauses). By default the recognizers are
the embedded one and OpenAI's tiny.en. tiny.en was trained on real speech and never on
espeak-ng, so a voice it cannot follow either is a hard voice, not a deaf model.

``--questions fresh`` takes instead 40 English questions that are in no file of corpus/
(``FRESH_QUESTIONS``, checked by a unit test): what a new user would ask, never seen by the
corpus-trained recognizer's training or held-out sets. A recognizer is a Hugging Face checkpoint
(run in PyTorch, as above), an export directory (``DIR@PRECISION``: the ONNX graphs the pool
serves, ``fp32`` or ``int8-dynamic``) or ``faster-whisper:SOURCE@COMPUTE`` (faster-whisper on the
CTranslate2 weights a pinned package carries, ``switchboard.checkpoints.whisper_ct2.SOURCES``:
the same weights; greedy, no timestamps, the language given, as the pool decodes).

``--windows whole,fitted`` measures each recognizer twice: every chunk padded to the model's
window, and padded to a window fitted to it (asr/config.pbtxt's ``windows``). ``--long`` adds, per
voice, its questions strung into recordings of about 28 s (0.6 s of silence between them), cut
at pauses into chunks as the pool cuts them.

Writes ``results.json`` and ``summary.md`` to ``--out``; ``docs/benchmarks.md`` keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from switchboard import paths

# Per language: the training voice, voices near it, then ever further from training.
VOICES = {
    "en": (
        "en-us",
        "en-gb+f3",
        "en-gb-x-rp+m3",
        "en-us+f5",
        "en-us+Andrea",
        "en-gb-x-gbcwmd",
        "en-gb-x-gbcwmd+m3",
        "en-gb-x-gbcwmd+Andrea",
    ),
    "zh": ("cmn", "cmn+f3", "cmn-latn-pinyin+m3", "cmn+Andrea", "cmn+f5"),
}
DEFAULT_MODELS = {
    "whisper-base": paths.BUILD / "asr-whisper-base",
    "default": paths.BUILD / "asr-default-model",
    "tiny-en": paths.BUILD / "asr-tiny-en",
}
# What a new user might ask, in words no file of corpus/ holds (tests/bench/test_asr_voices.py
# checks): the trained-from-scratch recognizer never heard them, in training or held out.
FRESH_QUESTIONS = (
    "Where is my parcel? It has not arrived yet.",
    "The courier says he delivered it but I never got anything.",
    "Can you tell me when my package will get here?",
    "I ordered a jacket last Tuesday and it still has not shipped.",
    "How much does it cost to send something to Canada?",
    "Do you deliver on Sundays?",
    "The box was crushed and the glass inside is broken.",
    "I would like to send these shoes back because they are too small.",
    "How many days do I have to return a gift?",
    "My money still has not come back after the return.",
    "Why was my card declined when I tried to pay?",
    "Can I split the payment over three months?",
    "I think you charged me the wrong amount.",
    "Please cancel the second item in my basket.",
    "I forgot my password and the reset email never comes.",
    "How can I change the email address on my profile?",
    "I want to close my account for good.",
    "Someone else logged into my account without asking me.",
    "Is there a discount for students?",
    "My promo code says it has expired but the advert says it is valid.",
    "Can I collect my order from a shop instead?",
    "What time does your customer service close today?",
    "I need to speak to a real person please.",
    "The size chart is confusing, which size should I pick for a small child?",
    "Will this charger work in Europe?",
    "Does the laptop come with a warranty?",
    "The screen of my new phone stopped working after two days.",
    "Can I swap the blue one for the red one?",
    "I was sent the wrong colour.",
    "How do I know if my order went through?",
    "Can you send the receipt to my work email?",
    "Is it safe to save my card details on your website?",
    "The tracking page has not updated for a week.",
    "Can I add a note for the driver?",
    "My neighbour took the parcel in, is that okay?",
    "How long does a refund take to reach my bank?",
    "I have been waiting on hold for an hour.",
    "Can I buy a gift card for my sister?",
    "Why do I have to pay customs fees?",
    "Thank you, that solves my problem.",
)


def relation(voice: str, lang: str) -> str:
    """How ``voice`` (an espeak-ng ``accent+variant``) stands to what training speaks."""
    from switchboard.data import speech

    if voice == speech.SEEN_VOICES[lang]:
        return "the training voice"
    accent, _, variant = voice.partition("+")
    known = (accent in speech.TRAIN_ACCENTS[lang], variant in speech.TRAIN_VARIANTS)
    text = {
        (True, True): "training accent and variant",
        (True, False): "training accent, unseen variant",
        (False, True): "unseen accent, training variant",
        (False, False): "unseen accent and variant",
    }[known]
    return text + (" (the report's unseen voice)" if voice == speech.UNSEEN_VOICES[lang] else "")


def parse_models(specs: list[str]) -> dict[str, Path]:
    """``NAME=PATH`` each (a bare path is named by its folder; PATH may end in @PRECISION or be
    faster-whisper:SOURCE@COMPUTE, see the module docstring); none: the defaults that exist."""
    if not specs:
        return {name: path for name, path in DEFAULT_MODELS.items() if (path / "config.json").exists()}
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        path = Path(path if sep else name)
        out[name if sep else path.name] = path
    return out


class FasterWhisperHears:
    """faster-whisper as ``transcribe`` below calls a recognizer: the CTranslate2 model a pinned
    package carries (``whisper_ct2.ct2_files``: from memory), each chunk decoded greedily with
    no timestamps in its clip's language, as the pool decodes; no VAD, no fallback."""

    max_seconds = 30.0

    def __init__(self, source: str, compute_type: str = "int8"):
        from faster_whisper import WhisperModel

        from switchboard.checkpoints import whisper_ct2

        src = whisper_ct2.SOURCES[source]
        self.model = WhisperModel(src.name, device="cpu", compute_type=compute_type, files=whisper_ct2.ct2_files(src))
        self.multilingual = self.model.model.is_multilingual
        self.languages = ["en", "zh"] if self.multilingual else ["en"]

    def features(self, samples):
        return samples  # faster-whisper computes its own

    def transcribe(self, features: list, languages: list) -> list:
        from types import SimpleNamespace

        out = []
        for samples, lang in zip(features, languages, strict=True):
            segments, _ = self.model.transcribe(
                samples,
                language=lang if self.multilingual else None,
                beam_size=1,
                temperature=0.0,
                without_timestamps=True,
                condition_on_previous_text=False,
                vad_filter=False,
            )
            out.append(SimpleNamespace(text="".join(s.text for s in segments)))
        return out


def load_recognizer(spec: Path, fitted: bool):
    """The recognizer ``spec`` names (see ``parse_models``), windows fitted or whole."""
    from switchboard.asr.model import AsrModel

    text = str(spec)
    if text.startswith("faster-whisper:"):
        source, _, compute = text.removeprefix("faster-whisper:").partition("@")
        return FasterWhisperHears(source, compute or "int8")
    path, _, precision = text.partition("@")
    if (Path(path) / "asr.json").is_file():  # an export: the graphs the pool serves
        return AsrModel.load(Path(path), precision or "fp32", fitted_windows=fitted)
    return AsrModel.from_checkpoint(Path(path), device="cpu", dtype="float32", steps="growing", fitted_windows=fitted)


def spec_problem(spec: Path) -> str | None:
    """Why ``spec`` names no recognizer (None: it does)."""
    from switchboard.checkpoints import whisper_ct2

    text = str(spec)
    if text.startswith("faster-whisper:"):
        source = text.removeprefix("faster-whisper:").partition("@")[0]
        return (
            None
            if source in whisper_ct2.SOURCES
            else f"no CTranslate2 source {source!r} ({', '.join(whisper_ct2.SOURCES)})"
        )
    path = Path(text.partition("@")[0])
    if (path / "asr.json").is_file() or ((path / "config.json").is_file() and "@" not in text):
        return None
    return f"{path} is not a Hugging Face checkpoint (no config.json) nor an export (no asr.json)"


def sentences(lang: str, questions: str, per_language: int) -> list[str]:
    """The texts to speak: the corpus's held-out questions, or ``FRESH_QUESTIONS`` (English)."""
    from switchboard.data import speech

    if questions == "fresh":
        return list(FRESH_QUESTIONS) if lang == "en" else []
    return [text for text, _ in speech.heldout_sentences(lang)][: per_language or None]


def transcribe(model, clips: list) -> list[str]:
    """Each clip's transcript, in its own language: cut at pauses into chunks as the pool cuts
    it (asr/config.pbtxt's chunk_s, at most the model's window), and the chunks' texts joined."""
    from switchboard.asr import segment
    from switchboard.asr.features import SAMPLE_RATE
    from switchboard.repository.config import AsrConfig

    chunk_s = min(AsrConfig().chunk_s, model.max_seconds)
    chunks = []  # (clip index, features)
    for i, clip in enumerate(clips):
        for a, b in segment.split(clip.samples, max_s=chunk_s, rate=SAMPLE_RATE):
            chunks.append((i, model.features(clip.samples[a:b])))
    texts: list[list[str]] = [[] for _ in clips]
    for start in range(0, len(chunks), 8):
        part = chunks[start : start + 8]
        done = model.transcribe([f for _, f in part], [clips[i].lang for i, _ in part])
        for (i, _), t in zip(part, done, strict=True):
            texts[i].append(t.text.strip())
    return [(" " if c.lang == "en" else "").join(t for t in texts[i] if t) for i, c in enumerate(clips)]


def recordings(clips: list, seconds: float = 28.0, gap_s: float = 0.6) -> list:
    """``clips`` (one voice's) strung into recordings of at most ``seconds``, ``gap_s`` of
    silence before each."""
    import numpy as np

    from switchboard.asr.features import SAMPLE_RATE
    from switchboard.data import speech

    gap = np.zeros(int(gap_s * SAMPLE_RATE), np.float32)
    out, parts, texts = [], [], []

    def flush():
        if texts:
            sep = " " if clips[0].lang == "en" else ""
            out.append(speech.Clip(np.concatenate(parts), sep.join(texts), clips[0].lang, clips[0].voice, False))

    for clip in clips:
        if texts and sum(map(len, parts)) + len(gap) + len(clip.samples) > seconds * SAMPLE_RATE:
            flush()
            parts, texts = [], []
        parts += [gap, clip.samples]
        texts.append(clip.text)
    flush()
    return out


def measure(
    models: dict[str, Path],
    voices: dict[str, tuple[str, ...]],
    per_language: int,
    windows: tuple[str, ...] = ("whole",),
    long: bool = False,
    questions: str = "heldout",
) -> dict:
    from switchboard.asr import wer
    from switchboard.data import speech

    rows, labels = [], {}
    for name, spec in models.items():
        for how in windows:
            label = name if windows == ("whole",) else f"{name}, {how} windows"
            labels[label] = str(spec)
            model = load_recognizer(spec, fitted=how == "fitted")
            for lang, names in voices.items():
                texts = sentences(lang, questions, per_language)
                if lang not in model.languages or not texts:
                    continue
                for voice in names:
                    started = time.monotonic()
                    clips = [speech.Clip(speech.synthesize(t, lang, voice), t, lang, voice, False) for t in texts]
                    sets = [("questions", clips)] + ([("recordings", recordings(clips))] if long else [])
                    for kind, items in sets:
                        refs = [c.text for c in items]
                        hyps = transcribe(model, items)
                        rows.append(
                            {
                                "model": label,
                                "lang": lang,
                                "voice": voice if kind == "questions" else f"{voice}, recordings",
                                "relation": relation(voice, lang),
                                "metric": "cer" if lang == "zh" else "wer",
                                "error_rate": round(wer.error_rate(refs, hyps, lang), 4),
                                "exact": round(wer.exact_share(refs, hyps), 4),
                                "clips": len(items),
                                "example": {"ref": refs[0], "hyp": hyps[0]},
                            }
                        )
                        r, took = rows[-1], time.monotonic() - started
                        print(
                            f"{label:24s} {r['voice']:36s} {r['metric'].upper()} {r['error_rate']:.3f}  ({took:.0f} s)",
                            flush=True,
                        )
            del model
    return {"models": labels, "per_language": per_language, "questions": questions, "rows": rows}


def summary(results: dict) -> str:
    """One table per language: a row per voice, a column per recognizer (error rate, and the
    share of transcripts word for word)."""
    models = list(results["models"])
    n = results["per_language"]
    questions = f"The first {n} held-out questions of each language" if n else "Every held-out question"
    if results.get("questions") == "fresh":
        questions = f"The {len(FRESH_QUESTIONS)} English questions in no file of corpus/ (FRESH_QUESTIONS)"
    lines = [f"{questions}, spoken by each voice.", ""]
    for lang in ("en", "zh"):
        rows = [r for r in results["rows"] if r["lang"] == lang]
        if not rows:
            continue
        have = [m for m in models if any(r["model"] == m for r in rows)]
        metric = rows[0]["metric"].upper()
        lines += [
            f"| {lang} voice | to the embedded model's training | "
            + " | ".join(f"{m}: {metric} (exact)" for m in have)
            + " |",
            "|---|---|" + "---|" * len(have),
        ]
        for voice in dict.fromkeys(r["voice"] for r in rows):
            cells = []
            for m in have:
                hit = [r for r in rows if r["model"] == m and r["voice"] == voice]
                cells.append(f"{hit[0]['error_rate']:.2f} ({hit[0]['exact']:.0%})" if hit else "–")
            relation_text = next(r["relation"] for r in rows if r["voice"] == voice)
            lines.append(f"| `{voice}` | {relation_text} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.asr_voices", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a Hugging Face Whisper checkpoint, an export directory with @PRECISION, or "
        "faster-whisper:SOURCE@COMPUTE (repeatable; default: build/asr-whisper-base, build/asr-default-model "
        "and build/asr-tiny-en, those that are built)",
    )
    p.add_argument("--voices", help="comma-separated espeak-ng voices, each lang:voice (default: the built-in ladder)")
    p.add_argument("--questions", type=int, default=60, help="held-out questions per language (0: all)")
    p.add_argument(
        "--question-set",
        choices=["heldout", "fresh"],
        default="heldout",
        help="the corpus's held-out questions, or 40 English questions in no file of corpus/",
    )
    p.add_argument(
        "--windows",
        default="whole",
        help="comma-separated: whole (every chunk padded to the model's window), fitted (to a window fitted to it)",
    )
    p.add_argument("--long", action="store_true", help="also each voice's questions strung into 28 s recordings")
    p.add_argument("--out", type=Path, default=paths.BUILD / "bench" / "asr-voices", help="where results go")
    args = p.parse_args(argv)
    windows = tuple(w.strip() for w in args.windows.split(",") if w.strip())
    if not windows or set(windows) - {"whole", "fitted"}:
        p.error(f"--windows {args.windows!r}: expected whole, fitted or both")
    models = parse_models(args.model)
    if not models:
        p.error("no recognizer: build one (make model-asr, make model-asr-tiny-en) or pass --model NAME=PATH")
    voices: dict[str, tuple[str, ...]] = VOICES
    if args.voices:
        voices = {}
        for spec in args.voices.split(","):
            lang, sep, voice = spec.partition(":")
            if not sep or lang not in VOICES:
                p.error(f"--voices: {spec!r}: expected lang:voice with lang en or zh")
            voices[lang] = (*voices.get(lang, ()), voice)
    if args.questions < 0:
        p.error("--questions: 0 (all) or more")
    for name, spec in models.items():
        problem = spec_problem(spec)
        if problem:
            p.error(f"--model {name}: {problem}")
    from switchboard.data import speech

    for lang, names in voices.items():
        for voice in names:
            try:  # a name espeak-ng does not know fails here, not after an hour of others
                speech.synthesize("a" if lang == "en" else "好", lang, voice)
            except (ValueError, speech.SpeechError) as e:
                p.error(f"--voices: {lang}:{voice}: {e}")
    results = measure(models, voices, args.questions, windows, args.long, args.question_set)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    text = summary(results)
    (args.out / "summary.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

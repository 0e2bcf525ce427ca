"""Which voices a recognizer hears: ``python -m switchboard.perf.asr_voices``.

The held-out report (``switchboard.training.asr.evaluate``) scores two voices per language: the
training voice, and one voice training never uses, an unseen accent in an unseen variant. This
splits "unseen" apart. The same held-out questions are spoken by voices that differ from
training in the accent, in the variant (formants, pitch, breath), in both or in neither. Each
recognizer given transcribes them as the pool decodes (``AsrModel`` on PyTorch, greedy, the
language given; audio longer than the window cut at its pauses). By default the recognizers are
the embedded one and OpenAI's tiny.en. tiny.en was trained on real speech and never on
espeak-ng, so a voice it cannot follow either is a hard voice, not a deaf model.

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
DEFAULT_MODELS = {"default": paths.BUILD / "asr-default-model", "tiny-en": paths.BUILD / "asr-tiny-en"}


def relation(voice: str, lang: str) -> str:
    """How ``voice`` (an espeak-ng ``accent+variant``) stands to what training speaks."""
    from switchboard.training import speech

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
    """``NAME=PATH`` each (a bare path is named by its folder); none: the defaults that exist."""
    if not specs:
        return {name: path for name, path in DEFAULT_MODELS.items() if (path / "config.json").exists()}
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        path = Path(path if sep else name)
        out[name if sep else path.name] = path
    return out


def transcribe(model, clips: list) -> list[str]:
    """Each clip's transcript, in its own language: cut at pauses into chunks as the pool cuts
    it (asr/config.pbtxt's chunk_s, at most the model's window), and the chunks' texts joined."""
    from switchboard.asr import segment
    from switchboard.asr.features import SAMPLE_RATE
    from switchboard.triton.config import AsrConfig

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
    from switchboard.training import speech

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
) -> dict:
    from switchboard.asr import wer
    from switchboard.asr.model import AsrModel
    from switchboard.training import speech

    rows, labels = [], {}
    for name, checkpoint in models.items():
        for how in windows:
            label = name if windows == ("whole",) else f"{name}, {how} windows"
            labels[label] = str(checkpoint)
            model = AsrModel.from_checkpoint(
                checkpoint, device="cpu", dtype="float32", steps="growing", fitted_windows=how == "fitted"
            )
            for lang, names in voices.items():
                if lang not in model.languages:
                    continue
                sentences = [text for text, _ in speech.heldout_sentences(lang)][: per_language or None]
                for voice in names:
                    started = time.monotonic()
                    clips = [speech.Clip(speech.synthesize(t, lang, voice), t, lang, voice, False) for t in sentences]
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
    return {"models": labels, "per_language": per_language, "rows": rows}


def summary(results: dict) -> str:
    """One table per language: a row per voice, a column per recognizer (error rate, and the
    share of transcripts word for word)."""
    models = list(results["models"])
    n = results["per_language"]
    questions = f"The first {n} held-out questions of each language" if n else "Every held-out question"
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
    p = argparse.ArgumentParser(prog="python -m switchboard.perf.asr_voices", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a Hugging Face Whisper checkpoint (repeatable; default: build/asr-default-model and "
        "build/asr-tiny-en, those that are built)",
    )
    p.add_argument("--voices", help="comma-separated espeak-ng voices, each lang:voice (default: the built-in ladder)")
    p.add_argument("--questions", type=int, default=60, help="held-out questions per language (0: all)")
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
    for name, path in models.items():
        if not (path / "config.json").is_file():
            p.error(f"--model {name}: {path} is not a Hugging Face checkpoint (no config.json)")
    from switchboard.training import speech

    for lang, names in voices.items():
        for voice in names:
            try:  # a name espeak-ng does not know fails here, not after an hour of others
                speech.synthesize("a" if lang == "en" else "好", lang, voice)
            except (ValueError, speech.SpeechError) as e:
                p.error(f"--voices: {lang}:{voice}: {e}")
    results = measure(models, voices, args.questions, windows, args.long)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    text = summary(results)
    (args.out / "summary.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

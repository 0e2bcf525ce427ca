"""Which voices a recognizer hears: ``python -m switchboard.perf.asr_voices``.

The held-out report (``switchboard.training.asr.evaluate``) scores two voices per language: the
training voice, and one voice training never uses, an unseen accent in an unseen variant. This
splits "unseen" apart. The same held-out questions are spoken by voices that differ from
training in the accent, in the variant (formants, pitch, breath), in both or in neither. Each
recognizer given transcribes them as the pool decodes (``AsrModel`` on PyTorch, greedy, the
language given; audio longer than the window cut at its pauses). By default the recognizers are
the embedded one and OpenAI's tiny.en. tiny.en was trained on real speech and never on
espeak-ng, so a voice it cannot follow either is a hard voice, not a deaf model.

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
    """Each clip's transcript, in its own language: cut at pauses to the model's window, as
    the pool cuts it, and the chunks' texts joined."""
    from switchboard.asr import segment
    from switchboard.asr.features import SAMPLE_RATE

    chunks = []  # (clip index, features)
    for i, clip in enumerate(clips):
        for a, b in segment.split(clip.samples, max_s=model.max_seconds, rate=SAMPLE_RATE):
            chunks.append((i, model.features(clip.samples[a:b])))
    texts: list[list[str]] = [[] for _ in clips]
    for start in range(0, len(chunks), 8):
        part = chunks[start : start + 8]
        done = model.transcribe([f for _, f in part], [clips[i].lang for i, _ in part])
        for (i, _), t in zip(part, done, strict=True):
            texts[i].append(t.text.strip())
    return [(" " if c.lang == "en" else "").join(t for t in texts[i] if t) for i, c in enumerate(clips)]


def measure(models: dict[str, Path], voices: dict[str, tuple[str, ...]], per_language: int) -> dict:
    from switchboard.asr import wer
    from switchboard.asr.model import AsrModel
    from switchboard.training import speech

    rows = []
    for name, checkpoint in models.items():
        model = AsrModel.from_checkpoint(checkpoint, device="cpu", dtype="float32", steps="growing")
        for lang, names in voices.items():
            if lang not in model.languages:
                continue
            sentences = [text for text, _ in speech.heldout_sentences(lang)][: per_language or None]
            for voice in names:
                started = time.monotonic()
                clips = [speech.Clip(speech.synthesize(t, lang, voice), t, lang, voice, False) for t in sentences]
                hyps = transcribe(model, clips)
                rows.append(
                    {
                        "model": name,
                        "lang": lang,
                        "voice": voice,
                        "relation": relation(voice, lang),
                        "metric": "cer" if lang == "zh" else "wer",
                        "error_rate": round(wer.error_rate(sentences, hyps, lang), 4),
                        "exact": round(wer.exact_share(sentences, hyps), 4),
                        "clips": len(sentences),
                        "example": {"ref": sentences[0], "hyp": hyps[0]},
                    }
                )
                r, took = rows[-1], time.monotonic() - started
                print(f"{name:10s} {voice:24s} {r['metric'].upper()} {r['error_rate']:.3f}  ({took:.0f} s)", flush=True)
        del model
    return {"models": {k: str(v) for k, v in models.items()}, "per_language": per_language, "rows": rows}


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
    p.add_argument("--out", type=Path, default=paths.BUILD / "bench" / "asr-voices", help="where results go")
    args = p.parse_args(argv)
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
    results = measure(models, voices, args.questions)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    text = summary(results)
    (args.out / "summary.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

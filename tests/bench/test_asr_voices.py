"""The voice ladder's pure parts: how a voice stands to training, the recognizers named on the
command line, long clips cut and joined as the pool does, and the summary's tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from perf import asr_voices
from switchboard.data import speech

RATE = 16_000


def test_each_voice_is_placed_by_its_accent_and_variant():
    relation = asr_voices.relation
    assert relation("en-us", "en") == "the training voice"
    assert relation("en-gb+f3", "en") == "training accent and variant"
    assert relation("en-us+f5", "en") == "training accent, unseen variant"
    assert relation("en-gb-x-gbcwmd", "en") == "unseen accent, training variant"
    assert relation(speech.UNSEEN_VOICES["en"], "en") == "unseen accent and variant (the report's unseen voice)"
    assert relation(speech.UNSEEN_VOICES["zh"], "zh") == "training accent, unseen variant (the report's unseen voice)"
    # The ladder holds each language's training voice and its report's unseen voice.
    for lang, voices in asr_voices.VOICES.items():
        assert {speech.SEEN_VOICES[lang], speech.UNSEEN_VOICES[lang]} <= set(voices)


def test_recognizers_are_named_or_take_their_folders_name(tmp_path):
    assert asr_voices.parse_models(["mine=/x/ckpt", "/y/whisper-small"]) == {
        "mine": Path("/x/ckpt"),
        "whisper-small": Path("/y/whisper-small"),
    }


@dataclass
class _Done:
    text: str


class _Model:
    """One second a window; a chunk's transcript is its length in tenths of a second."""

    max_seconds = 1.0

    def __init__(self):
        self.batches = []

    def features(self, samples):
        return samples

    def transcribe(self, features, languages):
        self.batches.append(list(languages))
        return [_Done(f" {round(len(f) / RATE * 10)} ") for f in features]


def _tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def test_a_clip_longer_than_the_window_is_cut_at_its_pause_and_joined():
    pause = np.zeros(int(0.5 * RATE), np.float32)
    long = np.concatenate([_tone(0.6), pause, _tone(0.7)])  # 1.8 s: two chunks
    clips = [
        speech.Clip(long, "", "en", "v", False),
        speech.Clip(long, "", "zh", "v", False),
        speech.Clip(_tone(0.5), "", "en", "v", False),
    ]
    model = _Model()
    texts = asr_voices.transcribe(model, clips)
    assert [len(t.split()) for t in texts[:1]] == [2]  # English chunks joined by a space
    assert texts[1] == texts[0].replace(" ", "")  # Mandarin's without
    assert texts[2] == "5"
    assert model.batches == [["en", "en", "zh", "zh", "en"]]  # each chunk in its clip's language


def test_the_summary_has_a_table_per_language_and_a_column_per_recognizer():
    def row(model, lang, voice, rate, exact):
        metric = "cer" if lang == "zh" else "wer"
        relation = asr_voices.relation(voice, lang)
        return {
            "model": model,
            "lang": lang,
            "voice": voice,
            "relation": relation,
            "metric": metric,
            "error_rate": rate,
            "exact": exact,
        }

    results = {
        "models": {"default": "a", "tiny-en": "b"},
        "per_language": 0,
        "rows": [
            row("default", "en", "en-us", 0.48, 0.21),
            row("default", "zh", "cmn", 0.42, 0.3),
            row("tiny-en", "en", "en-us", 0.31, 0.4),
        ],
    }
    text = asr_voices.summary(results)
    assert text.startswith("Every held-out question, spoken by each voice.")
    en, zh = text.split("| zh voice")
    assert "default: WER (exact) | tiny-en: WER (exact)" in en
    assert "| `en-us` | the training voice | 0.48 (21%) | 0.31 (40%) |" in en
    assert "tiny-en" not in zh  # English-only: no Mandarin column
    assert "| `cmn` | the training voice | 0.42 (30%) |" in zh


def test_a_model_that_is_no_checkpoint_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        asr_voices.main(["--model", f"mine={tmp_path}"])
    assert e.value.code == 2
    assert f"--model mine: {tmp_path} is not a Hugging Face checkpoint" in capsys.readouterr().err


def test_one_voices_questions_are_strung_into_recordings_of_at_most_28_s():
    clips = [speech.Clip(_tone(s), f"q{i}", "en", "v", False) for i, s in enumerate([10.0, 10.0, 7.0, 12.0, 3.0])]
    recs = asr_voices.recordings(clips)
    assert [r.text for r in recs] == ["q0 q1", "q2 q3 q4"]  # q2 with its 0.6 s of silence: 28.8 s, too long
    assert [len(r.samples) / RATE for r in recs] == pytest.approx([21.2, 23.8])
    zh = [speech.Clip(_tone(1.0), t, "zh", "v", False) for t in ("你好", "再见")]
    assert [r.text for r in asr_voices.recordings(zh)] == ["你好再见"]


def test_an_unknown_windows_choice_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        asr_voices.main(["--windows", "whole,short", "--model", f"x={tmp_path}"])
    assert "--windows 'whole,short': expected whole, fitted or both" in capsys.readouterr().err


def test_the_fresh_questions_are_in_no_file_of_the_corpus():
    """What a new user asks, not what the corpus-trained recognizer was trained or held out on:
    no fresh question is, after normalization, inside any text of corpus/."""
    from switchboard.asr.wer import normalize
    from switchboard.paths import CORPUS

    corpus_text = " ".join(normalize(f.read_text()) for f in sorted(CORPUS.glob("*.jsonl")))
    assert len(asr_voices.FRESH_QUESTIONS) == len(set(asr_voices.FRESH_QUESTIONS)) == 40
    assert [q for q in asr_voices.FRESH_QUESTIONS if normalize(q) in corpus_text] == []
    assert asr_voices.sentences("en", "fresh", 5) == list(asr_voices.FRESH_QUESTIONS)
    assert asr_voices.sentences("zh", "fresh", 5) == []  # espeak-ng's Mandarin: docs/voice.md


def test_a_recognizer_is_a_checkpoint_an_export_or_faster_whisper(tmp_path):
    ckpt, export = tmp_path / "ckpt", tmp_path / "export"
    ckpt.mkdir()
    export.mkdir()
    (ckpt / "config.json").write_text("{}")
    (export / "asr.json").write_text("{}")
    models = asr_voices.parse_models([f"a={ckpt}", f"b={export}@int8-dynamic", "c=faster-whisper:base@int8"])
    assert [asr_voices.spec_problem(s) for s in models.values()] == [None, None, None]
    assert "no CTranslate2 source 'large'" in asr_voices.spec_problem(Path("faster-whisper:large"))
    assert "nor an export" in asr_voices.spec_problem(Path(f"{ckpt}@int8-dynamic"))  # a precision needs an export

"""The chaos audio burst's pure parts: how its outcomes are judged, the recordings it sends."""

from __future__ import annotations

import shutil

import pytest

from perf.chaos import LONG_S, SHORT_S, AudioOutcome, judge_audio, recognizer_missing, spoken_clips
from switchboard.asr.audio import decode


def outcome(kind="short", ok=True, seconds=1.0, code=None, said="where is my order", heard="Where is my order?"):
    return AudioOutcome(kind, 3.0, ok, seconds, code, said, heard if ok else "")


def test_transcripts_and_refusals_when_full_pass_and_are_counted():
    outcomes = [outcome(seconds=s) for s in (0.5, 1.0, 2.0)]
    outcomes += [outcome(ok=False, code="UNAVAILABLE"), outcome("long", seconds=9.0), outcome("voice", seconds=3.0)]
    rows, problems = judge_audio(outcomes)
    assert problems == []
    short, long, voice = rows
    assert short[:6] == ["short (2-4 s) to asr", 4, 3, 1, 0, 0]
    assert "P50 1000 ms, P99 2000 ms" in short[6] and "WER 0.00" in short[7]
    assert long[:6] == ["long (20-40 s) to asr", 1, 1, 0, 0, 0] and voice[1:3] == [1, 1]


@pytest.mark.parametrize(
    "bad, problem",
    [
        (outcome(ok=False, code="INTERNAL"), "short (2-4 s) to asr: {'INTERNAL': 1}"),
        (outcome("long", ok=False, code="DEADLINE_EXCEEDED"), "long (20-40 s) to asr: 1 without a response"),
        (outcome("voice", ok=False, code="EMPTY"), "voice_chat: {'EMPTY': 1}"),
    ],
)
def test_any_other_answer_or_a_hang_fails_the_scenario(bad, problem):
    rows, problems = judge_audio([outcome(), bad])
    assert len(problems) == 1 and problems[0].startswith(problem), problems
    row = next(r for r in rows if r[0].startswith(problem.split(":")[0]))
    assert row[4] + row[5] == 1  # an error or a hang, never a refusal


def test_no_short_recording_transcribed_fails_it():
    _, problems = judge_audio([outcome(ok=False, code="UNAVAILABLE"), outcome("long")])
    assert problems == ["no short recording was transcribed"]


def test_without_a_recognizer_the_scenario_says_how_to_install_one(tmp_path):
    assert "make test-recognizer" in recognizer_missing(tmp_path)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="Debian's espeak-ng is not installed")
def test_the_burst_is_short_questions_and_long_recordings():
    questions = ["Where is my order?", "How do I track my package?", "Can I use two coupons?"]
    clips = spoken_clips(questions, n_short=3, n_long=1, seed=1)
    assert [kind for kind, *_ in clips] == ["short"] * 3 + ["long"]
    for kind, wav, seconds, said in clips:
        lo, hi = SHORT_S if kind == "short" else LONG_S
        assert lo <= seconds <= hi + 0.01 and decode(wav, 60.0).seconds == pytest.approx(seconds, abs=0.01)
        assert said in questions if kind == "short" else said.startswith(tuple(questions))

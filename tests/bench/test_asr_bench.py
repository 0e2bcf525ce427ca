"""The ASR benchmark's pure parts: the audio sets (with a fake synthesizer), the closed and open
loops (with fake systems and a fake clock), the arithmetic, the capped manifest and private
repositories, the peers' helpers, and the report's tables and goals."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import threading
import time

import numpy as np
import pytest
import soundfile as sf

from perf import asr_bench, asr_load, asr_peers, asr_report, asr_served
from perf.asr_load import Clip, Reply, Sample
from switchboard.data import corpus

RATE = asr_load.SAMPLE_RATE


def fake_speak(text: str, lang: str, voice: str) -> np.ndarray:
    """0.1 s of tone per word (per character in Mandarin): lengths follow the text."""
    units = len(text.split()) if lang == "en" else len(text)
    return np.full(int(0.1 * units * RATE), 0.1, np.float32)


def clip(i: int, seconds: float = 2.0, kind: str = "question", lang: str = "en", text: str = "hello there") -> Clip:
    return Clip(f"c{i}", text, lang, seconds, b"RIFF", kind)


# -- audio ----------------------------------------------------------------------------------------
def test_fit_pads_around_and_cuts_to_the_exact_length():
    padded = asr_load.fit(np.ones(RATE, np.float32), 3.0)
    assert len(padded) == 3 * RATE and padded[: RATE // 2].max() == 0 and padded[RATE] == 1
    assert len(asr_load.fit(np.ones(5 * RATE, np.float32), 2.0)) == 2 * RATE


def test_wav_bytes_are_16_bit_16_khz_and_clipped():
    samples, rate = sf.read(io.BytesIO(asr_load.wav_bytes(np.array([2.0, -0.5], np.float32))), dtype="float32")
    info = sf.info(io.BytesIO(asr_load.wav_bytes(np.zeros(10, np.float32))))
    assert rate == RATE and info.subtype == "PCM_16"
    assert samples[0] == pytest.approx(1.0, abs=1e-3) and samples[1] == pytest.approx(-0.5, abs=1e-3)


def test_questions_are_seeded_and_leave_out_slots():
    en = corpus.spoken_questions("en", seed=0)
    assert en and all("{" not in q for q in en)
    assert en == corpus.spoken_questions("en", seed=0) and en != corpus.spoken_questions("en", seed=1)
    assert corpus.spoken_questions("zh") and set(corpus.spoken_questions("zh")).isdisjoint(en)


def test_question_clips_take_turns_by_language_and_skip_long_ones():
    clips = asr_load.question_clips(("en", "zh"), 6, speak=fake_speak, max_s=4.0)
    assert [c.lang for c in clips] == ["en", "zh"] * 3
    assert all(c.seconds <= 4.0 for c in clips) and len({c.id for c in clips}) == 6
    assert all(sf.info(io.BytesIO(c.wav)).samplerate == RATE for c in clips)


def test_question_clips_say_when_the_corpus_runs_out():
    with pytest.raises(ValueError, match="too few en questions"):
        asr_load.question_clips(("en",), 10_000, speak=fake_speak)


def test_mix_clips_are_exactly_two_and_thirty_seconds():
    mix = asr_load.mix_clips("en", shorts=4, longs=2, speak=fake_speak)
    short = [c for c in mix if c.kind == "short"]
    long = [c for c in mix if c.kind == "long"]
    assert len(short) == 4 and len(long) == 2
    for c in mix:
        assert sf.info(io.BytesIO(c.wav)).frames == int(c.seconds * RATE)
    assert {c.seconds for c in short} == {2.0} and {c.seconds for c in long} == {30.0}
    assert all(len(c.text.split()) > 20 for c in long)  # several questions, one after another


def test_fitted_clip_refuses_text_longer_than_its_length():
    assert asr_load.fitted_clip("where is my order", "en", 3.0, "v", "voice", speak=fake_speak).seconds == 3.0
    with pytest.raises(ValueError, match="more than 1"):
        asr_load.fitted_clip("one two three four five six seven eight nine ten eleven", "en", 1.0, "v", "voice",
                             speak=fake_speak)  # fmt: skip


def test_clips_survive_a_round_trip_through_their_directory(tmp_path):
    clips = asr_load.question_clips(("en",), 3, speak=fake_speak)
    asr_load.save_clips(clips, tmp_path / "set")
    assert asr_load.load_clips(tmp_path / "set") == clips


# -- load -----------------------------------------------------------------------------------------
class FakeSystem:
    """Answers after ``delay`` s; fails clips whose id is in ``fail``; counts callers at once."""

    def __init__(self, delay: float = 0.002, fail: tuple = ()):
        self.delay, self.fail = delay, set(fail)
        self.lock = threading.Lock()
        self.now = self.peak = 0
        self.seen: list[str] = []

    def __call__(self, c: Clip) -> Reply:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.seen.append(c.id)
        time.sleep(self.delay)
        with self.lock:
            self.now -= 1
        if c.id in self.fail:
            raise RuntimeError("refused")
        return Reply(c.text.upper(), {"batch_size": 1})


def test_closed_loop_sends_every_clip_in_order_at_the_concurrency():
    system = FakeSystem(delay=0.01)
    clips = [clip(i) for i in range(5)]
    samples = asr_load.closed_loop(system, clips, concurrency=4, requests=12, warmup=3)
    assert [s.clip for s in samples] == [f"c{i % 5}" for i in range(12)]
    assert len(system.seen) == 15  # the warm-up went out too, and is not in the samples
    assert system.peak == 4
    assert all(s.ok and s.text == "HELLO THERE" and s.extra == {"batch_size": 1} for s in samples)


def test_closed_loop_counts_failures_and_goes_on():
    samples = asr_load.closed_loop(FakeSystem(fail=("c1",)), [clip(i) for i in range(3)], 2, 6)
    failed = [s for s in samples if not s.ok]
    assert [s.clip for s in failed] == ["c1", "c1"] and "RuntimeError: refused" in failed[0].error
    assert asr_load.throughput(samples)["failed"] == 2


@pytest.mark.parametrize("concurrency, requests", [(0, 1), (1, 0)])
def test_closed_loop_refuses_nonsense(concurrency, requests):
    with pytest.raises(ValueError):
        asr_load.closed_loop(FakeSystem(), [clip(0)], concurrency, requests)
    with pytest.raises(ValueError, match="no clips"):
        asr_load.closed_loop(FakeSystem(), [], 1, 1)


def test_poisson_arrivals_are_seeded_at_the_rate_with_the_mix():
    arrivals = asr_load.poisson_arrivals(10.0, 200.0, {"short": 0.8, "long": 0.2}, seed=3)
    assert arrivals == asr_load.poisson_arrivals(10.0, 200.0, {"short": 0.8, "long": 0.2}, seed=3)
    times = [t for t, _ in arrivals]
    assert times == sorted(times) and 0 < times[0] and times[-1] < 200
    assert len(arrivals) == pytest.approx(2000, rel=0.1)
    assert sum(k == "long" for _, k in arrivals) / len(arrivals) == pytest.approx(0.2, abs=0.03)


@pytest.mark.parametrize("rate, seconds, mix", [(0, 1, {"a": 1}), (1, 0, {"a": 1}), (1, 1, {}), (1, 1, {"a": 0})])
def test_poisson_arrivals_refuse_nonsense(rate, seconds, mix):
    with pytest.raises(ValueError):
        asr_load.poisson_arrivals(rate, seconds, mix)


def test_open_loop_sends_on_schedule_whatever_is_in_flight():
    clock = {"t": 100.0}
    system = FakeSystem(delay=0.0)
    by_kind = {"short": [clip(0, kind="short"), clip(1, kind="short")], "long": [clip(9, 30.0, "long")]}
    arrivals = [(0.5, "short"), (1.0, "long"), (1.5, "short"), (2.0, "short")]
    samples = asr_load.open_loop(
        system, arrivals, by_kind, clock=lambda: clock["t"], sleep=lambda d: clock.__setitem__("t", clock["t"] + d)
    )
    assert [s.clip for s in samples] == ["c0", "c9", "c1", "c0"]  # each kind's clips in turn
    assert [s.scheduled for s in samples] == [100.5, 101.0, 101.5, 102.0]
    assert [s.kind for s in samples] == ["short", "long", "short", "short"]


# -- arithmetic -----------------------------------------------------------------------------------
def sample(i: int, sent: float, done: float, seconds: float = 2.0, ok: bool = True, kind: str = "question"):
    return Sample(f"c{i}", kind, seconds, sent, done, ok, "hello there" if ok else "")


def test_throughput_is_audio_seconds_over_the_wall_from_first_sent_to_last_done():
    samples = [sample(0, 10.0, 11.0), sample(1, 10.0, 12.0), sample(2, 11.0, 14.0, ok=False)]
    t = asr_load.throughput(samples)
    assert t["wall_s"] == 4.0 and t["audio_s"] == 4.0 and t["audio_s_per_s"] == 1.0
    assert t["requests"] == 3 and t["failed"] == 1 and t["requests_per_s"] == 0.5
    assert t["latency_p50_s"] == 1.5  # answered requests only


def test_throughput_of_nothing_is_nan_not_a_crash():
    assert math.isnan(asr_load.throughput([])["audio_s_per_s"])


def test_latency_by_kind_and_error_rates():
    samples = [sample(i, 0.0, 1.0 + i, kind="short") for i in range(5)] + [sample(9, 0.0, 30.0, 30, kind="long")]
    by_kind = asr_load.latency_by_kind(samples)
    assert by_kind["short"]["requests"] == 5 and by_kind["short"]["p50_s"] == 3.0 and by_kind["short"]["max_s"] == 5
    assert by_kind["long"]["p99_s"] == 30.0
    clips = [clip(i, text="hello there") for i in range(5)] + [Clip("c9", "你好", "zh", 30.0)]
    rates = asr_load.error_rates(samples, clips)
    assert rates["en"] == 0.0 and rates["zh"] == 5.0  # "hello there" for 你好: 10 characters for 2


# -- repositories and presets ---------------------------------------------------------------------
MANIFEST = {
    "name": "fake",
    "source": "x",
    "n_mels": 80,
    "window_frames": 3000,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "multilingual": False,
    "languages": {"en": None},
    "special": {"start": 1, "eos": 2, "notimestamps": 3},
    "suppress_tokens": [],
    "begin_suppress_tokens": [],
    "num_layers": 1,
    "num_heads": 1,
    "head_dim": 4,
    "vocab_size": 10,
    "precisions": {"fp32": {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}},
}


def test_capped_manifest_leaves_room_for_the_prompt_and_the_cap():
    assert asr_served.capped_manifest(MANIFEST, 12)["max_target_positions"] == 14
    assert asr_served.capped_manifest(MANIFEST | {"multilingual": True}, 12)["max_target_positions"] == 16
    assert asr_served.capped_manifest(MANIFEST | {"max_target_positions": 10}, 12)["max_target_positions"] == 10
    with pytest.raises(ValueError, match="at least 1"):
        asr_served.capped_manifest(MANIFEST, 0)


def test_asr_repository_holds_asr_alone_and_never_writes_through_to_the_artifacts(tmp_path):
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    (artifacts / "asr.json").write_text(json.dumps(MANIFEST))
    for name in ("encoder.onnx", "decoder.onnx", "tokenizer.json"):
        (artifacts / name).write_bytes(b"x")
    (artifacts / ".inputs").write_text("digest")

    repo = asr_served.asr_repository(artifacts, tmp_path / "repo", cap_tokens=12)
    version = repo / "asr" / "1"
    assert sorted(p.name for p in repo.iterdir()) == ["asr"]
    assert (repo / "asr" / "config.pbtxt").read_text().startswith("#")
    assert sorted(p.name for p in version.iterdir()) == [
        "asr.json", "decoder.onnx", "encoder.onnx", "model.py", "tokenizer.json"
    ]  # fmt: skip
    assert json.loads((version / "asr.json").read_text())["max_target_positions"] == 14
    assert json.loads((artifacts / "asr.json").read_text())["max_target_positions"] == 448
    assert asr_served.precisions_of(artifacts) == ["fp32"]

    voice = asr_served.voice_repository(repo, tmp_path / "voice")
    assert {"asr", "chat", "engine_short", "engine_long", "voice_chat"} <= {p.name for p in voice.iterdir()}
    assert (voice / "chat").is_symlink() and not (voice / "asr").is_symlink()
    assert json.loads((voice / "asr" / "1" / "asr.json").read_text())["max_target_positions"] == 14


def test_presets_measure_what_the_issue_asks():
    for name, preset in asr_bench.PRESETS.items():
        assert set(preset.models) <= set(asr_bench.MODELS), name
        assert set(asr_bench.CONCURRENCY) <= set(preset.requests) and set(preset.warmup) >= set(preset.requests)
        assert preset.fw_settings and set(preset.fw_compute) <= set(asr_bench.FW_COMPUTE)
    full = asr_bench.PRESETS["full"]
    assert set(full.models) == {"tiny-en", "default", "large"} and set(full.precisions) == {"fp32", "int8-dynamic"}
    assert full.litserve and set(full.fw_compute) == {"int8", "float32"} and full.seed001_s and full.voice_models
    assert asr_bench.MODELS["large"].cap_tokens  # random weights never end a transcript


def test_the_large_model_sends_fewer_requests_in_whole_rounds():
    bench = asr_bench.Bench.__new__(asr_bench.Bench)
    bench.preset = asr_bench.PRESETS["full"]
    assert bench.requests(asr_bench.MODELS["tiny-en"], 8) == 48
    assert bench.requests(asr_bench.MODELS["large"], 8) == 16
    assert bench.requests(asr_bench.MODELS["large"], 1) == 3
    # the embedded default answers in milliseconds: more requests, or the run is over in a blink
    assert bench.requests(asr_bench.MODELS["default"], 8) == 384


def test_bad_arguments_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        asr_bench.main(["--models", "tiny-en,huge"])
    assert "unknown huge" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        asr_bench.main(["--parts", "everything"])
    with pytest.raises(SystemExit):
        asr_bench.main(["--seed001-workers", "two"])
    with pytest.raises(SystemExit):
        asr_bench.main(["--seed001-breaker", "0"])
    assert "--seed001-breaker 0: expected a bound in seconds" in capsys.readouterr().err


# -- peers ----------------------------------------------------------------------------------------
def test_write_window_sets_the_padding_and_replaces_a_link(tmp_path):
    source = tmp_path / "checkpoint.json"
    source.write_text(json.dumps({"feature_size": 80, "chunk_length": 30, "n_samples": 480000}))
    (tmp_path / "ct2").mkdir()
    (tmp_path / "ct2" / "preprocessor_config.json").hardlink_to(source)
    asr_peers.write_window(tmp_path / "ct2", 15.0)
    written = json.loads((tmp_path / "ct2" / "preprocessor_config.json").read_text())
    assert written == {
        "feature_size": 80,
        "chunk_length": 15,
        "n_samples": 240000,
        "nb_max_frames": 1500,
        "hop_length": 160,
    }
    assert json.loads(source.read_text())["chunk_length"] == 30
    asr_peers.write_window(tmp_path / "ct2", 5.0, hop=320)
    written = json.loads((tmp_path / "ct2" / "preprocessor_config.json").read_text())
    assert (written["n_samples"], written["nb_max_frames"], written["hop_length"]) == (80000, 250, 320)


def test_window_and_languages_come_from_the_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_source_positions": 750}))
    assert asr_load.window_seconds(tmp_path) == 15.0
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"hop_length": 320}))
    assert asr_load.window_seconds(tmp_path) == 30.0  # frames 20 ms apart
    assert not asr_load.multilingual(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"is_multilingual": True}))
    assert asr_load.multilingual(tmp_path)


def test_multilingual_wrapper_answers_true_and_passes_the_rest_on():
    class Model:
        is_multilingual = False

        def generate(self):
            return "generated"

    wrapped = asr_peers._Multilingual(Model())
    assert wrapped.is_multilingual and wrapped.generate() == "generated"


def test_decode_audio_gives_16_khz_mono():
    stereo = np.stack([np.linspace(-0.5, 0.5, 8000), np.zeros(8000)], axis=1).astype(np.float32)
    out = io.BytesIO()
    sf.write(out, stereo, 8000, format="WAV")
    samples = asr_load.decode_audio(out.getvalue())
    assert samples.dtype == np.float32 and samples.ndim == 1 and len(samples) == pytest.approx(16000, abs=2)


# -- the report -----------------------------------------------------------------------------------
def run_row(model, system, precision, c, rate, **kw):
    row = {"model": model, "system": system, "precision": precision, "concurrency": c, "audio_s_per_s": rate}
    return row | {"latency_p50_s": 0.5, "latency_p99_s": 0.9, "failed": 0, "error_rate": {"en": 0.1}} | kw


RESULTS = {
    "started": "2026-11-25 15:00:00",
    "command": "python -m perf.asr_bench --preset quick",
    "elapsed_s": 300.0,
    "machine": {"cpus": 2, "cpu": "EPYC", "commit": "abc1234", "load_avg_start": [0.5, 1.0, 1.2]},
    "throughput": [
        run_row("tiny-en", "switchboard", "fp32", 1, 10.0),
        run_row("tiny-en", "switchboard", "fp32", 8, 35.0),
        run_row("tiny-en", "switchboard", "int8", 1, 12.0),
        run_row("tiny-en", "switchboard", "int8", 8, 24.0),
        run_row("tiny-en", "faster-whisper", "int8", 1, 11.0),
        run_row("tiny-en", "faster-whisper", "int8", 8, 30.0),
        run_row("tiny-en", "litserve", "fp32", 1, 2.0),
        run_row("tiny-en", "litserve", "fp32", 8, 40.0),
    ],
    "seed001": [
        {
            "batching": "length",
            "workers": 1,
            "rate_per_s": 1.0,
            "drain_s": 1.0,
            "short_batch_size_mean": 2.0,
            "by_kind": {
                "short": {"requests": 40, "failed": 0, "p50_s": 0.5, "p99_s": 1.0},
                "long": {"requests": 10, "failed": 0, "p50_s": 3.0, "p99_s": 6.0},
            },
        },
        {
            "batching": "count",
            "workers": 1,
            "rate_per_s": 1.0,
            "drain_s": 1.0,
            "short_batch_size_mean": 4.0,
            "by_kind": {
                "short": {"requests": 40, "failed": 0, "p50_s": 2.0, "p99_s": 4.0},
                "long": {"requests": 10, "failed": 0, "p50_s": 3.0, "p99_s": 5.0},
            },
        },
    ],  # fmt: skip
    "voice": [
        {
            "model": "tiny-en",
            "concurrency": 1,
            "requests": 4,
            "answered": 4,
            "failed": 0,
            "heard_p50_s": 0.4,
            "first_token_p50_s": 0.45,
            "first_token_p99_s": 0.5,
            "asr_ms_p50": 380.0,
            "transcripts": ["Where?"],
        }
    ],  # fmt: skip
    "notes": ["large: skipped"],
}


def test_goals_compare_best_against_best_at_eight_and_scaling_per_precision():
    found = {(g["goal"]): g for g in asr_report.goals(RESULTS)}
    assert found["ahead of faster-whisper at c=8"]["met"]  # 35 (fp32) against 30
    assert "35.0 (fp32) vs 30.0 (int8)" in found["ahead of faster-whisper at c=8"]["figure"]
    assert not found["ahead of litserve at c=8"]["met"]  # 35 against 40
    assert found["fp32: c=8 >= 3x c=1"]["met"] and not found["int8: c=8 >= 3x c=1"]["met"]  # 3.5x, 2.0x


def test_seed001_verdict_is_the_short_p99_ratio():
    text, verdicts = asr_report.seed001_rows(RESULTS)
    assert verdicts == [{"workers": 1, "p99_ratio": 4.0, "p50_ratio": 4.0, "met": True}]
    assert "| length | 1 | 1.00 | 40 / 10 | 500 ms | 1000 ms |" in text


def test_seed001_rows_with_the_breaker_show_what_it_refused_and_leave_the_verdict_alone():
    guarded = dict(
        RESULTS["seed001"][1],  # the count row, with the breaker on
        batching="count+breaker",
        refused_by_breaker=12,
        breaker_p99_s=1.5,
        by_kind={
            "short": {"requests": 40, "failed": 10, "p50_s": 0.6, "p99_s": 1.4},
            "long": {"requests": 10, "failed": 2, "p50_s": 3.0, "p99_s": 5.0},
        },
    )
    text, verdicts = asr_report.seed001_rows(dict(RESULTS, seed001=[*RESULTS["seed001"], guarded]))
    assert verdicts == [{"workers": 1, "p99_ratio": 4.0, "p50_ratio": 4.0, "met": True}]  # length vs count
    assert "| count+breaker | 1 | 1.00 | 40 / 10 | 600 ms | 1400 ms |" in text
    assert text.splitlines()[-1].endswith("| 12 | 12 |") and "| 0 | - |" in text


def test_summary_has_every_table_and_the_missed_goals_stand_out(tmp_path):
    text = asr_report.summary_md(RESULTS)
    for heading in ("### Throughput: tiny-en", "### Goals", "### Seed 001", "### Voice", "### Notes"):
        assert heading in text
    assert "| switchboard | fp32 | 10.0 | 35.0 | 3.50x |" in text
    assert text.count("**missed**") == 2 and "4.00x" in text
    assert "load average (1/5/15 min) 0.50, 1.00, 1.20" in text


def test_missing_figures_read_as_dashes_not_nan():
    partial = {"throughput": [run_row("large", "switchboard", "fp32", 1, math.nan)], "machine": {}}
    text = asr_report.summary_md(partial)
    assert "nan" not in text.lower() and "| switchboard | fp32 | – | – | – |" in text


def test_write_summary_writes_the_markdown_and_the_plot(tmp_path):
    (tmp_path / "samples").mkdir()
    for batching, delay in (("length", 0.5), ("count", 2.0)):
        rows = [asdict_sample(sample(i, 0.0, delay + i / 10, kind="short")) for i in range(10)]
        (tmp_path / "samples" / f"seed001-{batching}-w1.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))
    path = asr_report.write_summary(tmp_path)
    assert path.read_text().startswith("# ASR benchmark") and "asr-bench.png" in path.read_text()
    assert (tmp_path / "asr-bench.png").stat().st_size > 10_000


def asdict_sample(s: Sample) -> dict:
    from dataclasses import asdict

    return asdict(s)


def test_rounds_merge_into_the_median_with_every_round_shown():
    rows = [
        run_row("tiny-en", "switchboard", "fp32", 8, rate, round=i, load_avg=load, failed=1)
        for i, (rate, load) in enumerate([(10.0, 1.0), (30.0, 2.0), (20.0, 3.0)])
    ]
    merged = asr_report.by_run(rows)[("tiny-en", "switchboard", "fp32")][8]
    assert merged["audio_s_per_s"] == 20.0 and merged["rates"] == [10.0, 30.0, 20.0]
    assert merged["load_avg"] == 2.0 and merged["failed"] == 3
    assert "| 20.0 (10.0, 30.0, 20.0) |" in asr_report.throughput_table({"throughput": rows}, "tiny-en")


def test_a_resumed_run_keeps_what_was_measured_and_skips_it(tmp_path):
    earlier = dict(RESULTS, fw_settings=[], seed001_calibration={"rate_per_s": 0.5})
    earlier["throughput"] = [run_row("tiny-en", "switchboard", "fp32", c, 5.0) for c in (1, 8)]
    (tmp_path / "results.json").write_text(json.dumps(earlier))

    class Quiet:
        def line(self, text):
            pass

    bench = asr_bench.Bench(asr_bench.PRESETS["quick"], tmp_path, Quiet())
    bench.resume()
    assert bench.measured("tiny-en", "switchboard fp32", 0)
    assert not bench.measured("tiny-en", "switchboard int8", 0) and not bench.measured("tiny-en", "switchboard fp32", 1)
    assert bench.results["seed001_calibration"]["rate_per_s"] == 0.5 and bench.results["resumed"]
    bench.save()
    assert "Resumed (`--resume`)" in asr_report.summary_md(json.loads((tmp_path / "results.json").read_text()))


def test_seed001_policies_become_the_servers_settings():
    preset = asr_bench.PRESETS["quick"]
    assert asr_bench.seed001_env("length", 1, preset) == {
        "SWITCHBOARD_PRECISION": "fp32",
        "SWITCHBOARD_BATCHING": "length",
        "SWITCHBOARD_WORKERS": "1",
    }
    guarded = asr_bench.seed001_env("count+breaker", 2, dataclasses.replace(preset, seed001_breaker_s=1.5))
    assert guarded["SWITCHBOARD_BATCHING"] == "count" and guarded["SWITCHBOARD_BREAKER_P99_S"] == "1.5"
    torch = dataclasses.replace(preset, seed001_runtime="torch-static")
    whole = asr_bench.seed001_env("count+whole", 1, torch)
    assert whole["SWITCHBOARD_JOIN_RUNNING"] == "false" and whole["SWITCHBOARD_TORCH_STEPS"] == "static"
    assert whole["SWITCHBOARD_RUNTIME"] == "torch" and whole["SWITCHBOARD_DEVICE"] == "cpu"
    assert "SWITCHBOARD_JOIN_RUNNING" not in asr_bench.seed001_env("length", 1, torch)


def test_a_checkpoint_written_after_its_export_is_named(tmp_path):
    """The bench measures what build/artifacts holds; a model retrained since is named, not
    measured silently as if it were the export."""
    checkpoint, artifacts = tmp_path / "model", tmp_path / "export"
    checkpoint.mkdir()
    artifacts.mkdir()
    for name in ("config.json", "model.safetensors", ".inputs"):
        (checkpoint / name).write_text("x")
        os.utime(checkpoint / name, (1000, 1000))
    (artifacts / "asr.json").write_text("{}")
    os.utime(artifacts / "asr.json", (2000, 2000))
    assert asr_bench.newer_than_export(checkpoint, artifacts) == []
    os.utime(checkpoint / "model.safetensors", (3000, 3000))
    os.utime(checkpoint / ".inputs", (3000, 3000))
    assert asr_bench.newer_than_export(checkpoint, artifacts) == ["model.safetensors"]

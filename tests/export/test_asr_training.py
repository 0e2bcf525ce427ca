"""The default speech recognizer's build: espeak-ng speech, its data, and a few steps on a
micro config making a Whisper directory that transformers loads, built once."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from transformers import WhisperForConditionalGeneration, WhisperTokenizer

from switchboard.asr import features as feat
from switchboard.data import speech
from switchboard.training.asr import data as data_mod
from switchboard.training.asr import model as model_mod
from switchboard.training.asr.__main__ import REPORT, main

MICRO = [
    "d_model=32",
    "encoder_layers=1",
    "decoder_layers=1",
    "heads=2",
    "ffn=64",
    "vocab_size=300",
    "max_target_positions=24",
    "window_frames=150",
    "max_seconds=3",
    "batch=4",
    "warmup=2",
    "probe_every=2",
]


def test_synthesize_speaks_16k_float32_and_names_bad_input():
    samples = speech.synthesize("Where is my order?", "en", "en-gb+f3", speed=200, pitch=70)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert 0.5 < len(samples) / speech.SAMPLE_RATE < 3 and 0.05 < np.abs(samples).max() <= 1.0
    assert len(speech.synthesize("我的订单到哪了", "zh")) > 8000
    with pytest.raises(ValueError, match="no variant 'nope'"):
        speech.synthesize("hi", "en", "en-us+nope")
    with pytest.raises(ValueError, match="lang 'fr'"):
        speech.synthesize("bonjour", "fr")
    with pytest.raises(ValueError, match="empty"):
        speech.synthesize("  ", "en")
    with pytest.raises(speech.SpeechError, match="xx-zz"):
        speech.synthesize("hi", "en", "xx-zz")


def test_heldout_clips_are_fixed_and_one_voice_is_never_trained_on():
    clips = speech.heldout_clips("zh")
    again = speech.heldout_clips("zh")
    assert len(clips) == len(again) > 100 and all(c.lang == "zh" for c in clips)
    assert all(np.array_equal(a.samples, b.samples) and a.text == b.text for a, b in zip(clips, again))
    assert "{" not in "".join(c.text for c in clips)
    unseen = {c.voice for c in clips if not c.seen_voice}
    assert unseen == {speech.UNSEEN_VOICES["zh"]}
    rng = random.Random(0)
    for lang, voice in speech.UNSEEN_VOICES.items():
        accent, _, variant = voice.partition("+")
        trained = {speech.random_voice(rng, lang).name for _ in range(500)}
        assert voice not in trained and variant not in speech.TRAIN_VARIANTS
        assert accent not in speech.TRAIN_ACCENTS[lang] or lang == "zh"  # Mandarin has one accent


def test_augmentation_is_seeded_and_noise_has_its_snr():
    clean = speech.synthesize("How long does delivery take?", "en")
    a = speech.augment(clean, np.random.default_rng(3))
    b = speech.augment(clean, np.random.default_rng(3))
    assert np.array_equal(a, b) and a.dtype == np.float32
    quiet = clean * 0.1
    noisy = speech.add_noise(quiet, 10.0, np.random.default_rng(0), "pink")
    snr = 10 * np.log10(np.mean(quiet**2) / np.mean((noisy - quiet) ** 2))
    assert snr == pytest.approx(10.0, abs=0.5)


def test_batches_cover_every_item_once_per_epoch():
    order = model_mod.batches(50, 8, random.Random(0))
    epoch = [i for _ in range(6) for i in next(order)]
    assert len(epoch) == 48 and len(set(epoch)) == 48  # the last 2 wait for the next epoch
    assert sorted(next(model_mod.batches(3, 8, random.Random(0)))) == [0, 1, 2]  # fewer items than a batch


def test_packing_joins_two_utterances_of_a_language_that_fit_the_window():
    EOT = 9
    items = [
        data_mod.Utterance(t, lang, speech.Voice("x"), 0, False)
        for t, lang in [("a", "en"), ("b", "en"), ("c", "zh"), ("d", "en")]
    ]
    frames = [100, 120, 100, 400]
    features = [np.full((4, n), float(k), np.float16) for k, n in enumerate(frames)]
    seqs = [[1, 2, 3, 4, 10 + k, EOT] for k in range(4)]
    cfg = model_mod.ModelConfig(window_frames=300, pack=1.0, pack_gap_frames=30)
    packer = model_mod.Packer(data_mod.Dataset(items, features), seqs, {"en": [7]}, cfg)
    rng = np.random.default_rng(0)
    f, seq = packer.item(0, EOT, rng)  # "a" joins "b" (the only other English item that fits)
    assert f.shape == (4, 100 + 30 + 120) and f[0, 0] == 0 and f[0, -1] == 1
    assert seq == [1, 2, 3, 4, 10, 7, 11, EOT]
    assert packer.item(2, EOT, rng) == (features[2], seqs[2])  # no other Mandarin item
    assert packer.item(3, EOT, rng) == (features[3], seqs[3])  # no room left in the window
    off = model_mod.Packer(data_mod.Dataset(items, features), seqs, {}, model_mod.ModelConfig(window_frames=300))
    assert off.item(0, EOT, rng) == (features[0], seqs[0])


def test_utterances_walk_the_sentences_and_mix_voices():
    from switchboard.data import corpus as corpus_mod

    corpus = corpus_mod.load(corpus_mod.CORPUS_DIR)
    cfg = data_mod.DataConfig(utterances=400, salad=0.5, home=0.0, plain=0.5)
    items = data_mod.utterances(corpus, cfg)
    assert items == data_mod.utterances(corpus, cfg)  # seeded
    assert [u.lang for u in items[:4]] == ["en", "zh", "en", "zh"]
    said = [u.text for u in items]
    assert len(set(said)) > 0.9 * len(said)  # no sentence twice before every one once
    plain = [u for u in items if "+" not in u.voice.name]
    assert 0.4 < len(plain) / len(items) < 0.8
    assert {u.voice.name.partition("+")[0] for u in items} <= {a for v in speech.TRAIN_ACCENTS.values() for a in v}


def test_a_home_share_is_spoken_in_the_heldout_sets_training_voice():
    from switchboard.data import corpus as corpus_mod

    corpus = corpus_mod.load(corpus_mod.CORPUS_DIR)
    items = data_mod.utterances(corpus, data_mod.DataConfig(utterances=400, home=0.5))
    home = [u for u in items if u.voice == speech.home_voice(u.lang)]
    assert 0.4 < len(home) / len(items) < 0.6
    assert {u.lang for u in home} == set(speech.LANGS)
    none = data_mod.utterances(corpus, data_mod.DataConfig(utterances=400, home=0.0))
    assert len([u for u in none if u.voice == speech.home_voice(u.lang)]) < 0.05 * len(none)
    clip = next(c for c in speech.heldout_clips("zh") if c.seen_voice)  # the voice the report's "training voice" is
    assert np.array_equal(speech.speak(clip.text, "zh", speech.home_voice("zh")), clip.samples)


@pytest.fixture(scope="module")
def micro_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("asr") / "model"
    cache = tmp_path_factory.mktemp("asr-cache")
    argv = ["--out", str(out), "--cache", str(cache), "--utterances", "24", "--steps", "4", "--workers", "1"]
    argv += [a for kv in MICRO for a in ("--set", kv)]
    assert main(argv) == 0
    return out, argv


def test_a_micro_build_is_a_whisper_directory_transformers_loads(micro_build):
    out, _ = micro_build
    config = json.loads((out / "config.json").read_text())
    assert config["switchboard_window_frames"] == 150 and config["max_source_positions"] == 75
    preprocessor = json.loads((out / "preprocessor_config.json").read_text())
    assert preprocessor["hop_length"] == 320 and preprocessor["chunk_length"] == 3
    model = WhisperForConditionalGeneration.from_pretrained(out).eval()
    tok = WhisperTokenizer.from_pretrained(out, language="zh", task="transcribe")
    gen = model.generation_config
    assert gen.is_multilingual and set(gen.lang_to_id) == {"<|en|>", "<|zh|>"}
    assert tok.prefix_tokens == [
        gen.decoder_start_token_id,
        gen.lang_to_id["<|zh|>"],
        gen.task_to_id["transcribe"],
        gen.no_timestamps_token_id,
    ]
    assert gen.no_timestamps_token_id == len(tok) - 1  # no id is taken for a timestamp
    assert tok.decode(tok("订单SB12345678", add_special_tokens=False).input_ids) == "订单SB12345678"
    x = torch.from_numpy(feat.log_mel(speech.synthesize("hello", "en"), 80, frames=150, hop=320))[None]
    ids = model_mod.greedy_decode(model, x, [tok.prefix_tokens], gen.eos_token_id, max_new_tokens=5)
    assert len(ids) == 1 and len(ids[0]) <= 5
    report = json.loads((out / REPORT).read_text())
    assert report["steps"] == 4 and report["parameters"] == sum(p.numel() for p in model.parameters())
    assert set(report["rates"]) == {"en", "zh"}
    assert report["rates"]["en"]["unseen_voice"]["voice"] == speech.UNSEEN_VOICES["en"]


def test_the_same_inputs_skip_the_build_and_a_change_rebuilds(micro_build, capfd):
    out, argv = micro_build
    weights = (out / "model.safetensors").stat().st_mtime_ns
    assert main(argv) == 0
    assert "up to date" in capfd.readouterr().out
    assert (out / "model.safetensors").stat().st_mtime_ns == weights
    assert main([*argv, "--no-eval", "--steps", "2"]) == 0
    assert "up to date" not in capfd.readouterr().out
    assert (out / "model.safetensors").stat().st_mtime_ns != weights
    assert json.loads((out / REPORT).read_text())["steps"] == 2


def test_a_window_that_is_not_max_seconds_of_frames_is_refused(tmp_path, capsys):
    argv = ["--out", str(tmp_path / "m"), "--cache", str(tmp_path / "c"), "--utterances", "4", "--steps", "1"]
    argv += [a for kv in [*MICRO, "window_frames=300"] for a in ("--set", kv)]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "window_frames 300 of 320 samples is not max_seconds 3 s: set window_frames=150" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_vtlp_moves_formants_by_the_drawn_factor_and_keeps_the_shape():
    """A band at 1 kHz read from a throat 10% shorter (alpha 1.1) sits about 10% higher."""
    centers = model_mod._mel_centers(80)
    band = int(np.argmin(np.abs(centers - 1000)))
    x = np.full((1, 80, 5), -1.0, np.float32)
    x[0, band] = 1.0

    class Fixed:  # rng.uniform -> the factor asked for
        def __init__(self, alpha):
            self.alpha = alpha

        def uniform(self, lo, hi):
            assert lo < self.alpha < hi
            return self.alpha

    for alpha in (1.1, 0.9):
        y = x.copy()
        model_mod._vtlp(y, model_mod.ModelConfig(vtlp=0.15), Fixed(alpha))
        assert y.shape == x.shape and y.min() >= -1.0 and y.max() <= 1.0
        peak = centers[int(np.argmax(y[0, :, 0]))]
        assert peak == pytest.approx(1000 * alpha, rel=0.05), alpha
        assert (y[0, :, 0] == y[0, :, 4]).all()  # the same warp for every frame of an item


def test_vtlp_home_zero_leaves_the_home_voices_rows_alone():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 80, 5)).astype(np.float32)
    home = [True, False, True, False]
    y = x.copy()
    model_mod._vtlp(y, model_mod.ModelConfig(vtlp=0.15, vtlp_home=0.0), np.random.default_rng(1), home)
    for row, is_home in enumerate(home):
        assert (y[row] == x[row]).all() == is_home, row


def test_a_build_runs_deterministic_kernels_and_restores_torchs_settings(monkeypatch, tmp_path):
    from switchboard.training.asr import __main__ as asr_main

    seen = []

    def failing_build(*args):
        seen.append((torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()))
        raise RuntimeError("stop here")

    threads = torch.get_num_threads()
    monkeypatch.setattr(asr_main, "_build", failing_build)
    torch.set_num_threads(1)
    try:
        with pytest.raises(RuntimeError, match="stop here"):
            asr_main.build(tmp_path, asr_main.BuildConfig(), tmp_path)
        assert seen == [(1, True)]
        assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == (1, False)
    finally:
        torch.set_num_threads(threads)


def test_the_weight_average_warms_up_then_moves_at_its_decay():
    weight = torch.nn.Parameter(torch.zeros(3))
    average = model_mod.Average([weight], 0.9)
    with torch.no_grad():
        weight.fill_(1.0)
    average.update(0)  # decay 1/10 at the first step: the average is mostly the new weights
    assert torch.allclose(average.shadow[0], torch.full((3,), 0.9))
    with torch.no_grad():
        weight.fill_(2.0)
    average.update(1000)  # past the warm-up: decay 0.9
    assert torch.allclose(average.shadow[0], torch.full((3,), 0.9 * 0.9 + 0.1 * 2.0))
    assert torch.equal(weight.detach(), torch.full((3,), 2.0))  # the weights train on untouched
    average.apply()
    assert torch.allclose(weight.detach(), torch.full((3,), 1.01)) and weight.requires_grad

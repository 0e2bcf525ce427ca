"""The GPU bench's packing (switchboard/perf/asr_gpu.py): what crosses to the GPU machine."""

import json

import numpy as np
import pytest

from perf import asr_gpu

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def test_rows_quantize_within_half_a_step_and_zero_rows_survive():
    w = np.random.default_rng(0).standard_normal((64, 300)).astype(np.float32)
    w[3] = 0.0
    q, scale = asr_gpu.quantize_rows(w)
    assert q.dtype == np.int8 and scale.shape == (64, 1)
    assert np.abs(q).max() <= 127
    assert np.all(np.abs(q.astype(np.float32) * scale - w) <= scale / 2 + 1e-7)
    assert not q[3].any()


def test_pack_then_unpack_gives_the_checkpoint_back(tmp_path):
    rng = np.random.default_rng(1)
    weights = {
        "big": rng.standard_normal((512, 256)).astype(np.float32),  # quantized
        "small": rng.standard_normal((4, 8)).astype(np.float32),  # float16
        "bias": rng.standard_normal(256).astype(np.float32),  # float16
    }
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    safetensors_numpy.save_file(weights, ckpt / "model.safetensors")
    (ckpt / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    packed = asr_gpu.pack_checkpoint(ckpt, tmp_path / "packed")
    stored = safetensors_numpy.load_file(packed / asr_gpu.PACKED)
    assert stored["big.q"].dtype == np.int8 and stored["small"].dtype == np.float16
    assert (packed / asr_gpu.PACKED).stat().st_size < (ckpt / "model.safetensors").stat().st_size / 3
    back = safetensors_numpy.load_file(asr_gpu.unpack_checkpoint(packed, tmp_path / "back") / "model.safetensors")
    assert sorted(back) == sorted(weights)
    for name, w in weights.items():
        assert back[name].dtype == np.float32 and back[name].shape == w.shape
        np.testing.assert_allclose(back[name], w, atol=np.abs(w).max() / 127)
    assert (tmp_path / "back" / "config.json").read_text() == (ckpt / "config.json").read_text()


def test_summary_takes_the_better_of_one_and_two_workers_for_the_ratios():
    rows = [
        {"model": "m", "dtype": "float16", "setting": label, "audio_s_per_s": rate}
        for (label, *_), rate in zip(asr_gpu.SETTINGS, (10.0, 30.0, 12.0, 40.0))
    ]
    peer = "transformers generate, batches of 8"
    rows += [{"model": "m", "dtype": "float16", "setting": peer, "audio_s_per_s": 50.0}]
    text = asr_gpu.summary({"gpu": "G", "device": "cuda", "torch": "t", "rows": rows})
    line = next(x for x in text.splitlines() if x.startswith("| m | float16 | growing |"))
    assert "| 4.00x | 3.33x |" in line and line.endswith("| 0.80x |")


def test_a_steps_mode_sets_the_runtimes_switches_and_the_pools():
    from types import SimpleNamespace

    from switchboard.asr.runtime import AsrManifest

    manifest = AsrManifest("m", "src", 80, 3000, 1500, 448, False, {"en": None}, {}, [], [], 4, 6, 64, 51864)
    held = ["a buffer set"]
    runtime = SimpleNamespace(manifest=manifest, _free=held)
    model = SimpleNamespace(runtime=runtime, manifest=manifest)
    for mode, want in {
        "graphs": ("graphs", True, True, True, False),
        "graphs-host": ("graphs", False, True, True, False),
        "static-host": ("static", False, True, True, False),
        "graphs-eager": ("graphs", True, False, True, False),
        "graphs-whole": ("graphs", True, True, False, False),
        "graphs-fitted": ("graphs", True, True, True, True),
        "static-fitted": ("static", True, True, True, True),
        "growing": ("growing", True, True, True, False),
    }.items():
        assert mode in asr_gpu.STEPS
        join = asr_gpu.set_mode(model, mode)
        got = (
            runtime.steps_mode,
            runtime.choose_on_device,
            runtime.encoder_graphs,
            join,
            model.manifest.fitted_windows,
        )
        assert got == want, mode
        assert runtime.manifest.fitted_windows == model.manifest.fitted_windows
    assert not held  # buffers made for whole windows are not reused for fitted ones


def test_seed001_refuses_an_unknown_steps_mode(capsys):
    with pytest.raises(SystemExit):
        asr_gpu.main(["seed001", "--steps", "graphs,sometimes"])
    assert "--steps: sometimes" in capsys.readouterr().err


def test_profile_takes_one_steps_mode(capsys):
    with pytest.raises(SystemExit):
        asr_gpu.main(["profile", "--steps", "graphs,graphs-fitted"])
    assert "--steps: one mode to profile, not 2" in capsys.readouterr().err

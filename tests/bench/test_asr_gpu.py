"""The GPU bench in process (perf/asr_gpu.py): its summary, its decoding modes and its options
(its pack: tests/tools/test_gpu_pack.py)."""

import pytest

from perf import asr_gpu

safetensors_numpy = pytest.importorskip("safetensors.numpy")


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

"""TensorRT engines: built only where TensorRT and an NVIDIA GPU exist (skipped here with the
reason); the optimization profiles and the Q/DQ graph TensorRT consumes are checked anyway
(the Q/DQ graphs run in ONNX Runtime in test_quantize.py)."""

import importlib.util
import json

import pytest

from switchboard.artifact.manifest import Manifest
from switchboard.export.__main__ import main as export_main
from switchboard.export.tensorrt import gpu_name, pool_profile
from switchboard.export.tensorrt import main as trt_main
from switchboard.repository.models import POOLS

MANIFEST = Manifest(
    name="tiny",
    fingerprint="fp",
    num_layers=2,
    num_kv_heads=2,
    head_dim=8,
    vocab_size=100,
    context_window=1024,
    eos_token_ids=[1],
    end_of_turn_id=1,
    system_prompt=None,
)


def test_profiles_match_the_routing_pools():
    short, long = (pool_profile(p, MANIFEST) for p in POOLS)
    assert short.shapes["input_ids"][2] == (16, 160)  # engine batch 16, prompts up to the routing threshold
    assert long.shapes["input_ids"][2] == (8, 1024)  # engine batch 8, prompts up to the context window
    for prof in (short, long):
        lo, opt, hi = prof.shapes["past_key_values.1.key"]
        assert lo[2] == 0 and hi[2] == 1023 and lo[1] == opt[1] == hi[1] == 2
        assert all(a <= b <= c for a, b, c in zip(*prof.shapes["attention_mask"]))


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is None,
    reason="TensorRT is not installed (it needs an NVIDIA GPU; none on this machine)",
)
def test_build_engines_from_the_qdq_graph(tmp_path, tokenizer_dir, checkpoint):
    if gpu_name() is None:
        pytest.skip("no NVIDIA GPU: TensorRT builds engines for the GPU it runs on")
    ckpt = checkpoint("llama", tokenizer_dir, tmp_path)
    out = tmp_path / "artifacts"
    assert (
        export_main(
            [
                "--model",
                str(ckpt),
                "--out",
                str(out),
                "--precision",
                "fp32,int8-percentile",
                "--calibration-per-class",
                "2",
                "--no-gate",
                "--bench-batches",
                "",
            ]
        )
        == 0
    )
    assert (
        trt_main(
            [
                "--artifacts",
                str(out),
                "--precision",
                "int8-percentile",
                "--timing-cache",
                str(tmp_path / "timing.cache"),
            ]
        )
        == 0
    )
    info = json.loads((out / "manifest.json").read_text())["source"]["tensorrt_engine"]
    assert info["profile_of_pool"] == {"short": 0, "long": 1} and len(info["profiles"]) == 2
    assert (out / "model.plan").stat().st_size > 0 and len(info["fingerprint"]) == 24
    assert (tmp_path / "timing.cache").stat().st_size > 0


def test_cli_says_why_it_cannot_build_here(tmp_path):
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here")
    with pytest.raises(SystemExit, match="TensorRT is not installed"):
        trt_main(["--artifacts", str(tmp_path)])

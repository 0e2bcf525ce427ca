"""A pool's runtime settings, checked and turned into the decoder they name, without loading a
model (tests/model/test_runtime.py and test_torch_runtime.py load real ones)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from switchboard.artifact.geometry import geometry, mismatches
from switchboard.engine import torch_runtime
from switchboard.engine.loader import load_decoder, pool_runtime
from switchboard.engine.sizing import MANY_THREADS_FROM_BYTES
from switchboard.runtime.choice import ONNXRUNTIME, TORCH, TRITON
from switchboard.runtime.onnx import usable_cores

MANIFEST = SimpleNamespace(name="tiny")


def parse(runtime, threads=0, cache="", checkpoint="", model_bytes=30 << 20):
    return pool_runtime(runtime, threads, cache, checkpoint, model_bytes)


def test_onnxruntime_with_automatic_threads_and_the_shared_weights_cache():
    small = parse("onnxruntime")
    assert (small.kind, small.threads, small.weights_cache.name) == (ONNXRUNTIME, 1, "weights")
    assert parse("onnxruntime", model_bytes=MANY_THREADS_FROM_BYTES).threads == usable_cores()
    assert parse("onnxruntime", threads=3, cache="off").threads == 3
    assert parse("onnxruntime", cache="off").weights_cache is None


@pytest.mark.parametrize(
    "runtime,checkpoint,message",
    [
        ("torch:cuda", "", "runtime 'torch:cuda' needs parameter 'checkpoint'"),
        ("tensorrt", "", "parameter 'runtime' = 'tensorrt': expected onnxruntime, torch[:cpu|cuda] or triton:<model>"),
        ("triton", "", "parameter 'runtime' = 'triton'"),
    ],
)
def test_a_wrong_setting_is_named(runtime, checkpoint, message):
    with pytest.raises(ValueError) as e:
        parse(runtime, checkpoint=checkpoint)
    assert message in str(e.value)


def test_triton_runtime_is_built_by_the_glue_it_is_handed():
    choice = parse("triton:decoder")
    assert (choice.kind, choice.target) == (TRITON, "decoder")
    built = load_decoder(
        choice, "/repo/engine_short/1", MANIFEST, "fp32", native=lambda model, m: ("bls", model, m.name)
    )
    assert built == ("bls", "decoder", "tiny")
    with pytest.raises(ValueError, match="only inside Triton"):
        load_decoder(choice, "/repo/engine_short/1", MANIFEST, "fp32")


@pytest.mark.parametrize(
    "runtime,gpu,device",
    [("torch", None, "cpu"), ("torch:cpu", None, "cpu"), ("torch:cuda", None, "cuda"), ("torch:cuda", "1", "cuda:1")],
)
def test_torch_runs_on_the_device_named_and_on_a_gpu_instance_its_own(monkeypatch, runtime, gpu, device):
    made = []
    monkeypatch.setattr(torch_runtime, "TorchDecoder", lambda *a, **kw: made.append((a, kw)) or "decoder")
    choice = parse(runtime, threads=2, checkpoint="/ckpt")
    assert choice.kind == TORCH
    assert load_decoder(choice, "/repo/engine_short/1", MANIFEST, "fp32", gpu=gpu) == "decoder"
    assert made == [(("/ckpt", MANIFEST, device), {"threads": 2})]


@pytest.mark.parametrize("runtime,reads", [("onnxruntime", True), ("triton:decoder", True), ("torch:cuda", False)])
def test_only_a_runtime_that_serves_the_graph_has_it_checked(runtime, reads):
    assert parse(runtime, checkpoint="/ckpt").reads_graph is reads


def test_a_checkpoint_is_compared_with_the_manifest_field_by_field():
    config = SimpleNamespace(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        num_attention_heads=14,
        num_key_value_heads=2,
        hidden_size=896,
        num_hidden_layers=24,
        vocab_size=151936,
        max_position_embeddings=32768,
        sliding_window=None,
    )
    geo = geometry(config)
    assert (geo.num_layers, geo.num_kv_heads, geo.head_dim, geo.vocab_size) == (24, 2, 64, 151936)
    same = SimpleNamespace(num_layers=24, num_kv_heads=2, head_dim=64, vocab_size=151936)
    assert mismatches(geo, same) == []
    other = SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=64, vocab_size=512)
    assert mismatches(geo, other) == ["num_layers 24 != 2", "vocab_size 151936 != 512"]

"""One runtime vocabulary for the chat pools and the recognizer (switchboard/runtime/choice.py):
the recognizer's own parameters (``runtime onnx|torch``, ``device``, ``torch_dtype``,
``torch_steps``) map onto the same choice a pool's ``runtime`` makes."""

from __future__ import annotations

import pytest

from switchboard.runtime.choice import ONNXRUNTIME, TORCH, TRITON, RuntimeChoice


@pytest.mark.parametrize(
    "runtime,kind,target",
    [
        ("onnxruntime", ONNXRUNTIME, ""),
        ("torch", TORCH, "cpu"),
        ("torch:cpu", TORCH, "cpu"),
        ("torch:cuda", TORCH, "cuda"),
        ("torch:cuda:1", TORCH, "cuda:1"),
        ("triton:decoder", TRITON, "decoder"),
    ],
)
def test_one_runtime_setting_names_the_kind_and_its_target(runtime, kind, target):
    choice = RuntimeChoice.parse(runtime, threads=2)
    assert (choice.kind, choice.target, choice.threads) == (kind, target, 2)


@pytest.mark.parametrize("runtime", ["tensorrt", "triton", "triton:", "torch:gpu0", "torch:cuda:x", "onnx"])
def test_a_setting_outside_the_vocabulary_is_named(runtime):
    with pytest.raises(ValueError, match=f"parameter 'runtime' = '{runtime}': expected onnxruntime"):
        RuntimeChoice.parse(runtime)


@pytest.mark.parametrize(
    "runtime,device,kind,target",
    [
        ("onnx", "cuda", ONNXRUNTIME, ""),
        ("onnxruntime", "cuda", ONNXRUNTIME, ""),
        ("torch", "cuda", TORCH, "cuda"),
        ("torch", "cuda:1", TORCH, "cuda:1"),
        ("torch", "cpu", TORCH, "cpu"),
        ("torch:cpu", "cuda", TORCH, "cpu"),  # the runtime's own device wins over ``device``
    ],
)
def test_the_recognizer_parameters_map_onto_the_same_choice(runtime, device, kind, target):
    choice = RuntimeChoice.recognizer(runtime, device, threads=3)
    assert (choice.kind, choice.target, choice.threads) == (kind, target, 3)


def test_torch_resolves_dtype_and_steps_for_its_device():
    gpu, cpu = RuntimeChoice.recognizer("torch", "cuda", 0), RuntimeChoice.recognizer("torch", "cpu", 0)
    assert (gpu.torch_dtype(), gpu.torch_steps(), gpu.on_gpu) == ("float16", "graphs", True)
    assert (cpu.torch_dtype(), cpu.torch_steps(), cpu.on_gpu) == ("float32", "growing", False)
    chosen = RuntimeChoice.recognizer("torch", "cuda", 0, dtype="bfloat16", steps="static")
    assert (chosen.torch_dtype(), chosen.torch_steps()) == ("bfloat16", "static")
    assert RuntimeChoice.parse("torch:cuda").device("1") == "cuda:1"
    assert RuntimeChoice.parse("torch:cuda:0").device("1") == "cuda:0"


@pytest.mark.parametrize(
    "changes,named",
    [
        ({"runtime": "triton:asr"}, "'runtime' = 'triton:asr': expected onnx or torch"),
        ({"device": "gpu0"}, "'device' = 'gpu0'"),
        ({"dtype": "int8"}, "'torch_dtype' = 'int8'"),
        ({"steps": "sometimes"}, "'torch_steps' = 'sometimes'"),
        ({"device": "cpu", "steps": "graphs"}, "graphs needs a CUDA device, not 'cpu'"),
    ],
)
def test_a_wrong_recognizer_parameter_is_named(changes, named):
    settings = {"runtime": "torch", "device": "cuda", "threads": 0} | changes
    with pytest.raises(ValueError, match=named):
        RuntimeChoice.recognizer(**settings)

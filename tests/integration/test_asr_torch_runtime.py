"""``runtime: torch`` (asr/config.pbtxt) behind a real tritonserver: the recognizer's checkpoint
in PyTorch (switchboard/asr/torch_runtime.py, the GPU path) transcribes what the exported graphs
transcribe. Run here on the CPU in float32, in a repository holding ``asr`` alone, on tiny.en as
``make test`` exports it; the stub is checked to hold PyTorch (the ONNX path never loads it)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from switchboard.asr import segment
from switchboard.asr.audio import decode
from switchboard.asr.model import AsrModel
from switchboard.client import ChatClient
from switchboard.ops.launch import Ports, Stack, children
from switchboard.perf import asr_bench, asr_load
from tests.integration.speechtools import NEEDS_TINY_EN, TINY

pytestmark = NEEDS_TINY_EN


def onnx_transcripts(clips: list) -> list[str]:
    """What the exported graphs hear in each clip, cut into chunks as the pool cuts it."""
    model = AsrModel.load(TINY.artifacts, threads=1)
    out = []
    for clip in clips:
        samples = decode(clip.wav, 600).samples
        ranges = segment.split(samples, max_s=15.0, rate=16_000)
        feats = [model.features(samples[a:b]) for a, b in ranges]
        out.append("".join(t.text for t in model.transcribe(feats, ["en"] * len(feats))).strip())
    return out


@pytest.mark.parametrize("steps", ["auto", "static"])
def test_the_torch_runtime_transcribes_what_the_exported_graphs_do(steps: str, tmp_path: Path):
    """auto: the growing cache on the CPU; static: the fixed-size buffers that CUDA graphs replay
    on a GPU (torch_steps graphs), here without the graphs."""
    clips = asr_load.question_clips(("en",), 3, seed=0)
    repository = asr_bench.asr_repository(TINY.artifacts, tmp_path / "repository")
    env = {
        "SWITCHBOARD_RUNTIME": "torch",
        "SWITCHBOARD_DEVICE": "cpu",
        "SWITCHBOARD_TORCH_DTYPE": "float32",
        "SWITCHBOARD_TORCH_STEPS": steps,
    }
    stack = Stack(Ports.free(), repository=repository, run_dir=tmp_path / "run", env=env)
    stack.start_triton()
    try:
        client = ChatClient(stack.grpc_url, timeout_s=120)
        deadline = time.monotonic() + 120
        while not client.ready("asr"):
            assert time.monotonic() < deadline, f"asr did not become ready (log: {stack.triton_log})"
            time.sleep(0.5)
        stub = children(stack.triton.pid)["asr"]
        assert "libtorch" in Path(f"/proc/{stub}/maps").read_text()
        got = [client.transcribe(c.wav, language="en") for c in clips]
    finally:
        stack.stop_triton()
    assert [r.text for r in got] == onnx_transcripts(clips)
    assert all(r.text for r in got)


def test_a_setting_from_the_environment_reaches_the_torch_runtime(tmp_path: Path):
    """What makes the test above run the static buffers: SWITCHBOARD_TORCH_STEPS is read (graphs
    on the CPU fails the load, naming why, and the server does not start)."""
    repository = asr_bench.asr_repository(TINY.artifacts, tmp_path / "repository")
    env = {"SWITCHBOARD_RUNTIME": "torch", "SWITCHBOARD_DEVICE": "cpu", "SWITCHBOARD_TORCH_STEPS": "graphs"}
    stack = Stack(Ports.free(), repository=repository, run_dir=tmp_path / "run", env=env)
    try:
        with pytest.raises(RuntimeError, match="tritonserver"):
            stack.start_triton()
    finally:
        stack.stop_triton()
    assert "torch_steps graphs needs a CUDA device, not 'cpu'" in stack.triton_log.read_text()

"""``runtime: torch`` (asr/config.pbtxt) behind a real tritonserver: the recognizer's checkpoint
in PyTorch (switchboard/asr/torch_runtime.py, the GPU path) transcribes what the exported graphs
transcribe. Run here on the CPU in float32, in a repository holding ``asr`` alone, on tiny.en as
``make test`` exports it; the stub is checked to hold PyTorch (the ONNX path never loads it).
The pool's in-flight batching on that runtime is tested on the service with the real model."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from perf import asr_load, asr_served
from switchboard.asr import segment
from switchboard.asr.audio import decode
from switchboard.asr.model import AsrModel
from switchboard.client import ChatClient
from switchboard.ops.launch import Ports, Stack, children
from tests.integration.speechtools import NEEDS_TINY_EN, TINY
from tests.unit.test_asr_service import Sink

pytestmark = NEEDS_TINY_EN


def onnx_transcripts(clips: list) -> list[str]:
    """What the exported graphs hear in each clip, cut into chunks and padded to windows fitted
    to them as the pool does (asr windows: fitted)."""
    model = AsrModel.load(TINY.artifacts, threads=1, fitted_windows=True)
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
    repository = asr_served.asr_repository(TINY.artifacts, tmp_path / "repository")
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
    repository = asr_served.asr_repository(TINY.artifacts, tmp_path / "repository")
    env = {"SWITCHBOARD_RUNTIME": "torch", "SWITCHBOARD_DEVICE": "cpu", "SWITCHBOARD_TORCH_STEPS": "graphs"}
    stack = Stack(Ports.free(), repository=repository, run_dir=tmp_path / "run", env=env)
    try:
        with pytest.raises(RuntimeError, match="tritonserver"):
            stack.start_triton()
    finally:
        stack.stop_triton()
    assert "torch_steps graphs needs a CUDA device, not 'cpu'" in stack.triton_log.read_text()


def test_a_question_queued_while_a_batch_decodes_joins_that_batch():
    """In-flight batching with the real recognizer on the fixed-size buffers (``static`` steps,
    the graphs' code without the graphs, on the CPU): the first question's batch is held at its
    first words until the second question waits in the queue; the second then joins that batch
    (one batch ran both, the second's counted two rows) and is heard word for word as alone."""
    from switchboard.asr.batcher import make_batcher
    from switchboard.asr.service import AsrJob, AsrService

    model = AsrModel.from_checkpoint(TINY.checkpoint, device="cpu", dtype="float32", steps="static", max_batch=4)
    service = AsrService(model, make_batcher("length", max_batch=4, max_wait_s=0.0), join=True)
    first_clip, second_clip = asr_load.question_clips(("en",), 2, seed=1)

    class Held(Sink):
        """Holds the batch at the first words it streams until ``hold`` is set."""

        def __init__(self, hold: threading.Event | None = None):
            super().__init__()
            self.hold, self.speaking = hold, threading.Event()

        def emit(self, text):
            self.speaking.set()
            if self.hold is not None:
                assert self.hold.wait(30), "the second question never reached the queue"
                self.hold = None
            super().emit(text)

    try:
        alone = Sink()
        service.submit(AsrJob(second_clip.wav, alone, language="en"))
        assert alone.finished.wait(60) and alone.failure is None
        queued = threading.Event()
        first, second = Held(hold=queued), Sink()
        service.submit(AsrJob(first_clip.wav, first, language="en"))
        assert first.speaking.wait(60)  # its batch decodes, held at its first words
        service.submit(AsrJob(second_clip.wav, second, language="en"))
        deadline = time.monotonic() + 30
        while not len(service.batcher):
            assert time.monotonic() < deadline, "the second question never reached the queue"
            time.sleep(0.005)
        queued.set()
        assert first.finished.wait(60) and second.finished.wait(60)
    finally:
        service.close()
    assert first.failure is None and second.failure is None
    assert service.batches == 2  # the question alone, then one batch for both
    assert second.result.batch_size == 2
    assert second.result.text == alone.result.text and second.result.text
    assert first.result.text

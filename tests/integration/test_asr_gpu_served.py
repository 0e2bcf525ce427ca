"""``asr_gpu_served`` end to end on this machine: the server packed from this environment's
nvidia-pytriton, unpacked elsewhere, serving a recognizer from a ``tools.gpu_pack asr`` pack (tiny.en
as ``make test`` exports it) with ``runtime: torch`` on the CPU, measured over gRPC: what a GPU
machine without tritonserver runs, with the GPU's settings swapped for the CPU's."""

from __future__ import annotations

import json
import os
import sys

from perf import asr_gpu_served, asr_load, gpu_machine
from switchboard import paths
from tests.integration.speechtools import NEEDS_TINY_EN, TINY
from tools import gpu_pack

pytestmark = NEEDS_TINY_EN
CPU = {
    "SWITCHBOARD_RUNTIME": "torch",
    "SWITCHBOARD_DEVICE": "cpu",
    "SWITCHBOARD_TORCH_DTYPE": "float32",
    "SWITCHBOARD_TORCH_STEPS": "static",
}


def test_a_packed_server_serves_a_packed_recognizer_and_is_measured(tmp_path):
    pack = tmp_path / "pack"
    gpu_pack.pack_checkpoint(TINY.checkpoint, pack / "tiny-en")
    asr_load.save_clips(asr_load.question_clips(("en",), 2, 0), pack / "audio" / "en")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    gpu_pack.pack_server(tmp_path / "server", python, preset=0)
    before = dict(os.environ)

    results = asr_gpu_served.run(
        pack,
        tmp_path / "server",
        tmp_path / "out",
        tmp_path / "work",
        ["tiny-en"],
        {1: 1, 8: 8},
        1,
        paths.MODEL_REPOSITORY,
        CPU,
    )

    assert dict(os.environ) == before  # the unpacked server was this run's alone
    assert [(r["callers"], r["failed"]) for r in results["rows"]] == [(1, 0), (8, 0)]
    assert all(r["audio_s_per_s"] > 0 for r in results["rows"])
    assert results["rows"][1]["mean_batch"] > 1  # 8 callers were batched together
    assert results["rows"][1]["errors"]["en"] < 0.5  # tiny.en heard them (its INT8-packed weights)
    unpacked = tmp_path / "work" / "tritonserver" / "pytriton" / "tritonserver"
    assert results["server"] == str(unpacked / "bin" / "tritonserver")
    manifest = json.loads((tmp_path / "work" / "repos" / "tiny-en" / "asr" / "1" / "asr.json").read_text())
    assert manifest["source"] == str((tmp_path / "work" / "tiny-en").resolve())
    assert "| tiny-en | 1 |" in (tmp_path / "out" / "summary.md").read_text()


def test_a_random_weight_model_is_installed_with_its_transcripts_capped(tmp_path):
    """The whisper-small shape never ends a transcript: its asr.json allows the prompt and 12
    tokens, as asr_bench installs it (tiny.en's checkpoint stands in for its geometry here)."""
    repo = gpu_machine.asr_repository("small-shape", TINY.checkpoint, tmp_path, paths.MODEL_REPOSITORY)
    capped = json.loads((repo / "asr" / "1" / "asr.json").read_text())
    whole = json.loads(
        (gpu_machine.asr_repository("tiny-en", TINY.checkpoint, tmp_path, paths.MODEL_REPOSITORY) / "asr" / "1"
         / "asr.json").read_text()
    )  # fmt: skip
    assert capped["max_target_positions"] == 2 + gpu_machine.MODELS["small-shape"][1] < whole["max_target_positions"]
    assert (repo / "asr" / "config.pbtxt").read_text() == (paths.MODEL_REPOSITORY / "asr" / "config.pbtxt").read_text()

"""``voice_gpu_served`` end to end on this machine: the server and the voice parts packed from
here (the chat model, redis-server with its libraries, the question), unpacked elsewhere, and
voice_chat served with the engines and tiny.en on the torch runtime on the CPU, measured over
gRPC: what a GPU machine without tritonserver or redis-server runs, on the CPU's settings."""

from __future__ import annotations

import os
import subprocess
import sys

from perf import voice_gpu_served
from switchboard import paths
from switchboard.repository.versions import read_version_info
from tests.integration.speechtools import NEEDS_TINY_EN, TINY
from tests.integration.test_asr_gpu_served import CPU
from tools import gpu_pack

pytestmark = NEEDS_TINY_EN


def test_packed_redis_runs_with_the_libraries_beside_it(tmp_path):
    gpu_pack.pack_redis(tmp_path / "redis")
    libs = sorted(p.name for p in (tmp_path / "redis" / "lib").iterdir())
    assert "redis-server" in libs
    assert not [n for n in libs if n.startswith(gpu_pack.SYSTEM_LIBRARIES)]
    out = subprocess.run([tmp_path / "redis" / "redis-server", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("Redis server v=")


def test_voice_chat_is_served_from_the_packs_and_measured(tmp_path):
    pack, server, work = tmp_path / "pack", tmp_path / "server", tmp_path / "work"
    gpu_pack.pack_checkpoint(TINY.checkpoint, pack / "tiny-en")
    gpu_pack.pack_server(server, f"{sys.version_info.major}.{sys.version_info.minor}", preset=0)
    gpu_pack.pack_voice(server, preset=0)
    before = dict(os.environ)

    results = voice_gpu_served.run(
        pack, server, tmp_path / "out", work, "tiny-en", {1: 2, 8: 8}, 1, paths.MODEL_REPOSITORY, CPU
    )

    assert dict(os.environ) == before  # the unpacked servers were this run's alone
    rows = [(r["concurrency"], r["failed"], r["answered"]) for r in results["rows"]]
    assert rows == [(1, 0, 2), (8, 0, 8)], results["rows"]
    assert all("order" in t.lower() for r in results["rows"] for t in r["transcripts"])  # tiny.en heard it
    assert all(0 < r["heard_p50_s"] < r["first_token_p50_s"] for r in results["rows"])
    assert results["redis"] == str(work / "voice" / "redis" / "redis-server")
    repo = work / "repos" / "voice"
    engine = (repo / "engine_short" / "config.pbtxt").read_text()
    assert '{ key: "runtime" value: { string_value: "torch:cpu" } }' in engine
    assert f'{{ key: "checkpoint" value: {{ string_value: "{work / "voice" / "checkpoint"}" }} }}' in engine
    assert '{ key: "runtime" value: { string_value: "torch" } }' in (repo / "asr" / "config.pbtxt").read_text()
    assert read_version_info(repo / "engine_short" / "1")["precision"] == "fp32"
    assert not list((repo / "engine_short" / "1").glob("*.onnx*"))  # served without the graph it does not read
    assert "| 1 | 8 |" in (tmp_path / "out" / "summary.md").read_text()
    (log,) = (tmp_path / "out" / "run").glob("tritonserver-*.log")
    assert "successfully unloaded 'voice_chat'" in log.read_text()  # its streams were ended, not cancelled

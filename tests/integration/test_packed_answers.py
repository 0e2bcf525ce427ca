"""Packed passes on a real server: two stacks serve the default model on ``runtime: torch`` (which
packs) with drafting on, one with ``packed_passes`` off. Chats sent together, so prompts are
prefilled beside running rows and drafts of different lengths are verified in one pass, get the
same answers token for token from both; the packing stack counts its packed and mixed passes.
The same on ONNX Runtime: the export's packed graph (``make export`` writes it for the default
model) served against the padded one."""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from switchboard.client import ChatClient
from switchboard.ops.launch import Ports, Stack
from tests.conftest import ROOT
from tests.integration.test_drafted_answers import QUESTIONS

MORE = ["Can I pay with PayPal?", "My parcel arrived damaged and the box was open, what now?"]


@pytest.fixture(scope="module")
def pair(artifacts, tmp_path_factory):
    stacks = {}
    torch = {"SWITCHBOARD_RUNTIME": "torch:cpu", "SWITCHBOARD_CHECKPOINT": str(ROOT / "build" / "default-model")}
    try:
        for packed in ("true", "false"):
            env = torch | {"SWITCHBOARD_SPECULATION": "on", "SWITCHBOARD_PACKED_PASSES": packed}
            s = Stack(Ports.free(), run_dir=tmp_path_factory.mktemp(f"packed-{packed}"), env=env)
            stacks[packed] = s
            s.start()
        yield stacks
    finally:
        for s in stacks.values():
            s.stop()


@pytest.fixture(scope="module")
def onnx_packed(artifacts, tmp_path_factory):
    """A stack on a copy of the repository (hard links) whose pools serve the packed graph the
    export wrote beside the padded one, whichever the export chose for this machine."""
    repo = tmp_path_factory.mktemp("packed-onnx") / "repo"
    shutil.copytree("model_repository", repo, copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    for pool in ("engine_short", "engine_long"):
        path = repo / pool / "1" / "manifest.json"
        manifest = json.loads(path.read_text())
        assert "packed" in manifest["variants"]["fp32"], "make export writes the default model's packed graph"
        manifest["packing"]["fp32"]["chosen"] = "packed"
        path.unlink()  # a hard link to the export's own manifest: write a new file
        path.write_text(json.dumps(manifest))
    s = Stack(
        Ports.free(), repository=repo, run_dir=tmp_path_factory.mktemp("packed-onnx-run"),
        env={"SWITCHBOARD_SPECULATION": "on"},
    )  # fmt: skip
    try:
        s.start()
        yield s
    finally:
        s.stop()


def _together(stack, questions, **kw):
    client = ChatClient(stack.grpc_url, timeout_s=120)
    with ThreadPoolExecutor(len(questions)) as pool:
        return list(pool.map(lambda q: client.chat(q, stream=False, **kw), questions))


def _passes(stack, name: str, settle_s: float = 30.0) -> float:
    """The engine_short pool's counter ``name``, once the pool's periodic export has it (0 if
    nothing comes within ``settle_s``)."""
    from perf.servertools import scrape

    deadline = time.monotonic() + settle_s
    while True:
        value = scrape(stack.ports.metrics).get((name, (("model", "engine_short"),)), 0.0)
        if value > 0 or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, top_p=0.95, seed=7)])
def test_answers_are_the_same_packed_or_padded(pair, sampling):
    questions = QUESTIONS + MORE
    replies = {name: _together(s, questions, max_new_tokens=48, logprobs=0, **sampling) for name, s in pair.items()}
    for q, packed, padded in zip(questions, replies["true"], replies["false"]):
        assert not packed.stats.fallback and not padded.stats.fallback, q
        assert [e["token"] for e in packed.logprobs] == [e["token"] for e in padded.logprobs], q
    assert _passes(pair["true"], "switchboard_engine_packed_passes_total") > 0
    assert _passes(pair["false"], "switchboard_engine_packed_passes_total", settle_s=0) == 0


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, top_p=0.95, seed=7)])
def test_the_exported_packed_graph_answers_as_the_padded_one(onnx_packed, stack, sampling):
    questions = QUESTIONS + MORE
    packed, padded = (_together(s, questions, max_new_tokens=48, logprobs=0, **sampling) for s in (onnx_packed, stack))
    for q, a, b in zip(questions, packed, padded):
        assert not a.stats.fallback and not b.stats.fallback, q
        assert [e["token"] for e in a.logprobs] == [e["token"] for e in b.logprobs], q
    assert _passes(onnx_packed, "switchboard_engine_packed_passes_total") > 0

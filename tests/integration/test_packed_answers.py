"""Packed passes on a real server: two stacks serve the default model on ``runtime: torch`` (which
packs) with drafting on, one with ``packed_passes`` off. Chats sent together, so prompts are
prefilled beside running rows and drafts of different lengths are verified in one pass, get the
same answers token for token from both; the packing stack counts its packed and mixed passes."""

from __future__ import annotations

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

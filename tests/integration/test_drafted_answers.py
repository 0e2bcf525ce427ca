"""Speculative decoding on a real server: two stacks serve the exported default model, one with
drafting forced on (``SWITCHBOARD_SPECULATION=on``), one with it off, and every answer is the
same token for token: greedy, sampled with a seed, JSON under a schema, a tool call, a second
turn of a session. The drafting stack must have drafted and kept tokens, so the comparison is
between two different ways of decoding, whatever the export measured for this machine."""

from __future__ import annotations

import json

import pytest

from switchboard.client import ChatClient
from switchboard.ops.launch import Ports, Stack
from switchboard.serving.order_demo import TOOLS

QUESTIONS = [
    "How do I return a damaged item?",
    "Where is my order SB55501234?",
    "我的订单什么时候发货？",
    "How do I return a damaged item?",  # again: the answer served a moment ago drafts it whole
]
SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "urgent": {"type": "boolean"}},
    "required": ["order_id", "urgent"],
}


@pytest.fixture(scope="module")
def pair(artifacts, tmp_path_factory):
    stacks = {}
    try:
        for mode in ("on", "off"):
            s = Stack(
                Ports.free(), run_dir=tmp_path_factory.mktemp(f"spec-{mode}"), env={"SWITCHBOARD_SPECULATION": mode}
            )
            stacks[mode] = s
            s.start()
        yield {mode: ChatClient(s.grpc_url, timeout_s=120) for mode, s in stacks.items()}
    finally:
        for s in stacks.values():
            s.stop()


def _both(pair, text, **kw):
    replies = {mode: client.chat(text, stream=False, **kw) for mode, client in pair.items()}
    for reply in replies.values():
        assert not reply.stats.fallback, f"{text!r} was answered from the FAQ, not decoded"
    return replies["on"], replies["off"]


def _tokens(reply):
    return [entry["token"] for entry in reply.logprobs]


def test_greedy_answers_are_the_same_with_drafts(pair):
    drafted = accepted = 0
    for q in QUESTIONS:
        on, off = _both(pair, q, temperature=0.0, max_new_tokens=48, logprobs=0)
        assert _tokens(on) == _tokens(off), q
        assert on.text == off.text and on.stats.finish_reason == off.stats.finish_reason
        assert off.stats.drafted_tokens == 0
        drafted += on.stats.drafted_tokens
        accepted += on.stats.accepted_tokens
    assert accepted > 0 and drafted >= accepted, (drafted, accepted)


def test_seeded_samples_are_the_same_with_drafts(pair):
    accepted = 0
    for seed, q in enumerate(QUESTIONS[:3]):
        on, off = _both(pair, q, temperature=0.8, top_p=0.95, seed=seed, max_new_tokens=40, logprobs=1)
        assert _tokens(on) == _tokens(off), (seed, q)
        for a, b in zip(on.logprobs, off.logprobs):
            assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-3)
        accepted += on.stats.accepted_tokens
    assert accepted > 0


def test_constrained_answers_are_the_same_with_drafts(pair):
    fmt = {"type": "json_schema", "schema": SCHEMA}
    on, off = _both(pair, "Order SB55501234 is late, flag it.", temperature=0.0, max_new_tokens=48, response_format=fmt)
    assert on.text == off.text
    json.loads(on.text)
    ask = "Where is my order SB12345678?"
    on, off = _both(pair, ask, temperature=0.0, max_new_tokens=96, tools=TOOLS, tool_choice="required")
    assert on.tool_calls and [c["function"] for c in on.tool_calls] == [c["function"] for c in off.tool_calls]


def test_a_sessions_second_turn_is_the_same_with_drafts(pair):
    for turn in ("Where is my order SB55501234?", "Can I change the delivery address?"):
        on, off = _both(pair, turn, session_id="spec-identity", temperature=0.0, max_new_tokens=48)
        assert on.text == off.text, turn
    assert on.stats.session == off.stats.session and on.stats.reused_tokens > 0

"""The latency circuit breakers on a real server: with a bound every chat exceeds, priority 2 is
answered from the FAQ at once after the window fills, priority 1 still generates, and the
metrics count it; with one every transcription exceeds, asr refuses priority-2 audio
UNAVAILABLE and still transcribes priority 1's; the business metrics count FAQ answers beside
hand-overs, abandoned chats and voice turns."""

from __future__ import annotations

import time

import pytest

from perf.cold_start import spoken_question
from perf.servertools import scrape
from switchboard import paths
from switchboard.client import ChatClient, ChatError
from switchboard.ops.launch import Ports, Stack
from switchboard.serving.order_demo import TOOLS


@pytest.fixture(scope="module")
def breaker_stack(artifacts, tmp_path_factory):
    s = Stack(
        Ports.free(),
        run_dir=tmp_path_factory.mktemp("breaker"),
        env={
            "SWITCHBOARD_BREAKER_TTFT_P99_S": "0.001",  # 1 ms: every generated answer is "slow"
            "SWITCHBOARD_BREAKER_P99_S": "0.001",  # and every transcription (asr's breaker)
            "SWITCHBOARD_BREAKER_MIN_SAMPLES": "3",
            "SWITCHBOARD_BREAKER_WINDOW_S": "60",
        },
    )
    s.start()
    yield s
    s.stop()


def test_over_its_bound_the_breaker_sheds_priority_two_never_priority_one(breaker_stack):
    client = ChatClient(breaker_stack.grpc_url, timeout_s=60)
    first = [client.chat("Where is my order?", stream=False, max_new_tokens=8) for _ in range(3)]
    assert all(not r.stats.fallback and r.stats.ttft_ms > 1 for r in first)  # the window fills
    time.sleep(0.3)  # the P99 is recomputed at most every 0.25 s
    shed = client.chat("Where is my order?", stream=False, max_new_tokens=8)
    assert shed.stats.fallback and shed.stats.raw["fallback_reason"] == "latency_breaker" and shed.text
    vip = client.chat("Where is my order?", stream=False, max_new_tokens=8, priority=1)
    assert not vip.stats.fallback and vip.stats.generated_tokens > 0
    deadline = time.monotonic() + 5
    key = ("switchboard_chat_sheds_total", (("reason", "latency_breaker"),))
    while scrape(breaker_stack.ports.metrics).get(key, 0) < 1:
        assert time.monotonic() < deadline, "switchboard_chat_sheds_total{reason=latency_breaker} did not count it"
        time.sleep(0.2)


def test_over_its_bound_asrs_breaker_refuses_priority_two_audio_never_priority_one(breaker_stack):
    client = ChatClient(breaker_stack.grpc_url, timeout_s=60)
    deadline = time.monotonic() + 120
    while not client.ready("asr"):  # tiny.en, installed by make test, loads with the server
        assert time.monotonic() < deadline, "asr did not become ready"
        time.sleep(0.5)
    question, _ = spoken_question(paths.MODEL_REPOSITORY, 0)
    first = [client.transcribe(question, language="en") for _ in range(3)]
    assert all(r.text for r in first)  # the window fills with short requests' times
    time.sleep(0.3)
    with pytest.raises(ChatError) as refused:
        client.transcribe(question, language="en")
    assert refused.value.code == "UNAVAILABLE" and "latency bound" in str(refused.value)
    assert client.transcribe(question, language="en", priority=1).text
    deadline = time.monotonic() + 5
    key = ("switchboard_asr_requests_total", (("outcome", "shed_breaker"),))
    while scrape(breaker_stack.ports.metrics).get(key, 0) < 1:
        assert time.monotonic() < deadline, "switchboard_asr_requests_total{outcome=shed_breaker} did not count it"
        time.sleep(0.2)


def test_business_metrics_count_hand_overs_faq_answers_abandoned_chats_and_voice_turns(breaker_stack):
    """With the breaker open, priority 2 is answered from the FAQ: here beside a hand-over (a
    named call of transfer_to_human), a chat the client leaves mid-answer and two voice turns
    of one session, all priority 1, the business counters move by exactly those."""
    client = ChatClient(breaker_stack.grpc_url, timeout_s=60)

    def value(name, **labels):
        return scrape(breaker_stack.ports.metrics).get((name, tuple(sorted(labels.items()))), 0.0)

    counters = {
        "conversations": ("switchboard_chat_conversations_total", {}),
        "handovers": ("switchboard_chat_handovers_total", {}),
        "transfer_calls": ("switchboard_chat_tool_calls_total", {"tool": "transfer_to_human"}),
        "faq_answers": ("switchboard_chat_requests_total", {"outcome": "fallback"}),
        "abandoned": ("switchboard_chat_abandoned_total", {"stage": "answering"}),
        "voice_turns": ("switchboard_voice_turns_total", {}),
        "voice_conversations": ("switchboard_voice_conversations_total", {}),
    }
    time.sleep(1.2)  # earlier tests' chats published first
    before = {key: value(name, **labels) for key, (name, labels) in counters.items()}
    tag = time.monotonic_ns()

    handover = {"type": "function", "function": {"name": "transfer_to_human"}}
    called = client.chat(
        "I want to complain, get me someone",
        session_id=f"business-{tag}",
        stream=False,
        priority=1,
        max_new_tokens=64,
        tools=TOOLS,
        tool_choice=handover,
    )
    assert [c["function"]["name"] for c in called.tool_calls] == ["transfer_to_human"]
    for _ in range(3):  # the breaker's window fills with generated answers (one-off chats)
        assert not client.chat("Where is my order?", stream=False, max_new_tokens=8, priority=1).stats.fallback
    time.sleep(0.3)
    assert client.chat("Where is my order?", stream=False, max_new_tokens=8).stats.fallback  # priority 2: the FAQ
    # left mid-answer: a JSON answer held to 400 characters at least outlasts the cancel polls
    note = {"type": "object", "properties": {"note": {"type": "string", "minLength": 400}}, "required": ["note"]}
    events = client.chat(
        "I want to return order SB000123",
        priority=1,
        max_new_tokens=512,
        response_format={"type": "json_schema", "schema": note},
    )
    next(events)
    events.close()
    question, _ = spoken_question(paths.MODEL_REPOSITORY, 0)
    for _ in range(2):
        reply = client.voice_chat(
            question, session_id=f"business-voice-{tag}", stream=False, priority=1, max_new_tokens=8
        )
        assert reply.heard.transcript and reply.stats is not None and not reply.stats.fallback

    expected = {
        # the hand-over's new session, three one-off chats, the FAQ's one-off, the voice session's first turn
        "conversations": 6,
        "handovers": 1,
        "transfer_calls": 1,
        "faq_answers": 1,
        "abandoned": 1,
        "voice_turns": 2,
        "voice_conversations": 1,
    }
    deadline = time.monotonic() + 10  # published once a second
    while True:
        moved = {key: value(name, **labels) - before[key] for key, (name, labels) in counters.items()}
        if all(moved[k] >= n for k, n in expected.items()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    time.sleep(1.2)  # one more publication: nothing else arrives
    moved = {key: value(name, **labels) - before[key] for key, (name, labels) in counters.items()}
    assert moved == expected

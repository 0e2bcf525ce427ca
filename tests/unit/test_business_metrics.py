"""The business metrics' counting (docs/metrics.md, "Business"): which chat starts a
conversation, which answer is a hand-over, how tool names become label values, and voice turns
per conversation."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from switchboard.serving.metrics import STAGES, TOOLS, ChatMetrics, called_tools, starts_conversation, tool_label
from switchboard.serving.voice import VoiceMetrics, VoiceRequest
from switchboard.wire import Chat, ChatStats, SessionStatus
from tests.unit.pb_stub import forget, stub_glue
from tests.unit.test_engine_metrics import Family, value

ASKED = ({"role": "user", "content": "Where is my order?"},)
ANSWERED = (*ASKED, {"role": "assistant", "content": "Which order?"})


@pytest.mark.parametrize(
    "session_id,history,status,first",
    [
        (None, None, SessionStatus.NONE, True),  # a one-off chat: a conversation of one turn
        (None, None, SessionStatus.SKIPPED, True),  # the same, answered from the FAQ
        ("s1", None, SessionStatus.MISS, True),  # a new session, or one past its TTL
        ("s1", None, SessionStatus.HIT, False),
        ("s1", None, SessionStatus.UNAVAILABLE, False),  # unknown: not counted
        ("s1", None, SessionStatus.REJECTED, False),
        ("s1", None, SessionStatus.SKIPPED, False),  # FAQ answer before the session was read
        (None, (), SessionStatus.NONE, True),
        (None, ASKED, SessionStatus.NONE, True),  # no answer yet: still its first turn
        (None, ANSWERED, SessionStatus.NONE, False),
    ],
)
def test_which_chat_starts_a_conversation(session_id, history, status, first):
    assert starts_conversation(session_id, history, status) is first


def test_tool_names_are_bounded_label_values():
    assert [tool_label(n) for n in ("transfer_to_human", "start_return", "get_order_status")] == [
        "transfer_to_human",
        "start_return",
        "get_order_status",
    ]
    assert tool_label("anything_a_client_defines") == "other"


def test_only_a_calls_first_delta_names_it():
    deltas = [
        {"index": 0, "id": "call_0", "type": "function", "function": {"name": "start_return", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"order_id": "SB12345678"}'}},
        {"index": 1, "id": "call_1", "type": "function", "function": {"name": "transfer_to_human", "arguments": "{"}},
    ]
    assert called_tools(deltas) == ["start_return", "transfer_to_human"]
    assert called_tools([]) == []


def test_an_answer_with_two_hand_over_calls_is_one_hand_over():
    m = ChatMetrics()
    m.chat(ChatStats(route="short"), ["transfer_to_human", "transfer_to_human"], first_turn=True)
    m.chat(ChatStats(fallback=True), first_turn=False)  # an FAQ answer: no calls, a later turn
    counts, _ = m.drain()
    assert counts["handovers_total", ()] == 1
    assert counts["tool_calls_total", (("tool", "transfer_to_human"),)] == 2
    assert counts["conversations_total", ()] == 1
    assert counts["requests_total", (("outcome", "fallback"), ("version", "none"))] == 1


def test_abandoned_chats_are_cancelled_chats_by_stage():
    m = ChatMetrics()
    m.abandoned("waiting")
    m.abandoned("answering", 3)
    counts, _ = m.drain()
    assert counts["abandoned_total", (("stage", "waiting"),)] == 1
    assert counts["abandoned_total", (("stage", "answering"),)] == 1
    assert counts["requests_total", (("outcome", "cancelled"), ("version", "none"))] == 1
    assert counts["requests_total", (("outcome", "cancelled"), ("version", "3"))] == 1


def _voice(**inputs) -> VoiceRequest:
    chat_inputs = {k: np.asarray([[v.encode()]], np.object_) for k, v in inputs.items()}
    return VoiceRequest(audio=b"RIFF", language=None, chat_inputs=chat_inputs, priority=2, parameters={})


def test_voice_turns_and_the_conversations_they_start():
    m = VoiceMetrics()
    m.answered(_voice(**{Chat.SESSION_ID: "call-1"}), ChatStats(session="miss"))
    m.answered(_voice(**{Chat.SESSION_ID: "call-1"}), ChatStats(session="hit"))
    m.answered(_voice(**{Chat.SESSION_ID: "call-1"}), ChatStats(session="hit"))
    m.answered(_voice(), ChatStats())  # one-off
    m.answered(_voice(**{Chat.HISTORY: json.dumps(list(ANSWERED))}), ChatStats())  # stateless, a later turn
    counts, _ = m.drain()
    assert counts == {("turns_total", ()): 5, ("conversations_total", ()): 2}


@pytest.fixture
def publishing(monkeypatch):
    module = stub_glue(monkeypatch, "switchboard.triton.chat_metrics")
    monkeypatch.setattr(sys.modules["triton_python_backend_utils"], "MetricFamily", Family, raising=False)
    Family.made = {}
    yield module
    forget("switchboard.triton.chat_metrics")


class _Admission:
    def snapshot(self):
        return dict.fromkeys(("shed_timeout", "shed_full", "shed_forecast", "shed_breaker", "waiting", "running"), 0)


def test_the_business_series_exist_at_zero_and_publish_what_was_counted(publishing):
    from switchboard.triton.voice_metrics import VoiceMetricsPublisher

    chat, voice = ChatMetrics(), VoiceMetrics()
    health = types.SimpleNamespace(up=lambda pool: True)
    publishers = [
        publishing.ChatMetricsPublisher(chat, _Admission(), health, ("engine_short",), (1,), interval=3600),
        VoiceMetricsPublisher(voice, interval=3600),
    ]
    try:
        assert value("switchboard_chat_conversations_total") == 0
        assert value("switchboard_chat_handovers_total") == 0
        for tool in TOOLS:
            assert value("switchboard_chat_tool_calls_total", tool=tool) == 0
        for stage in STAGES:
            assert value("switchboard_chat_abandoned_total", stage=stage) == 0
        assert value("switchboard_voice_turns_total") == value("switchboard_voice_conversations_total") == 0
        assert value("switchboard_trace_spans_dropped_total", model="voice_chat") == 0  # beside chat's
        chat.chat(ChatStats(route="short"), ["transfer_to_human"], first_turn=True)
        chat.abandoned("answering", 1)
        voice.answered(_voice(), ChatStats())
        for p in publishers:
            p.publish()
        assert value("switchboard_chat_conversations_total") == value("switchboard_chat_handovers_total") == 1
        assert value("switchboard_chat_tool_calls_total", tool="transfer_to_human") == 1
        assert value("switchboard_chat_abandoned_total", stage="answering") == 1
        assert value("switchboard_voice_turns_total") == value("switchboard_voice_conversations_total") == 1
    finally:
        for p in publishers:
            p.close()

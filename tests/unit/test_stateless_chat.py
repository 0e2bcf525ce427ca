"""Stateless chats: the client sends the conversation (``history``) instead of a session id;
parsed and checked like ``text``, the prompt built from it (the client's system prompt when it
sends one), nothing read from or written to the session store."""

from __future__ import annotations

import json

import numpy as np
import pytest

from switchboard.serving.pool_health import PoolHealth
from switchboard.serving.prompt import PromptBuilder
from switchboard.serving.request import Limits, RequestError, parse_chat_request
from switchboard.serving.router import Router
from switchboard.serving.turn import ChatTurn
from switchboard.wire import EngineStats, FinishReason
from tests.unit.test_turn import EOT, Clock, Pools, Sessions, Sink, _answer, decode


def _inputs(text="and my refund?", history=None, session_id=None):
    def b(x):
        return np.asarray([[x if isinstance(x, bytes) else x.encode()]], dtype=np.object_)

    out = {"text": b(text)}
    if history is not None:
        out["history"] = b(history if isinstance(history, (bytes, str)) else json.dumps(history))
    if session_id is not None:
        out["session_id"] = b(session_id)
    return out


CONVERSATION = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "Where is my order?"},
    {"role": "assistant", "content": "It ships tomorrow."},
]


def test_history_is_parsed_into_messages_and_the_system_prompt():
    chat = parse_chat_request(_inputs(history=CONVERSATION), {}, Limits())
    assert chat.system == "You answer in one line."
    assert chat.history == tuple(CONVERSATION[1:]) and chat.session_id is None
    assert parse_chat_request(_inputs(history=[]), {}, Limits()).history == ()
    assert parse_chat_request(_inputs(), {}, Limits()).history is None


BAD = [
    ("not-json", "[{", "history: not valid JSON"),
    ("not-a-list", {"role": "user"}, "history: expected a JSON list"),
    ("item-not-object", ["hi"], 'history[0]: expected an object with "role" and "content"'),
    ("extra-key", [{"role": "user", "content": "x", "name": "a"}], "history[0]: field 'name' is not supported"),
    ("odd-role", [{"role": "robot", "content": "x"}], "history[0].role: 'robot' is not system, user, assistant"),
    ("orphan-tool", [{"role": "tool", "content": "x", "tool_call_id": "c1"}], "history[0].tool_call_id: 'c1' is not"),
    ("content-null", [{"role": "assistant", "content": None}], "history[0].content: expected a string"),
    ("late-system", [*CONVERSATION[1:], {"role": "system", "content": "x"}], "history[2]: a system message"),
    ("lone-surrogate", '[{"role": "user", "content": "\\ud800"}]', "history[0].content: not valid UTF-8"),
    ("too-deep", "[" * 100000 + "]" * 100000, "history: 200000 bytes is over the limit"),
    ("deep-but-small", "[" * 5000 + "]" * 5000, "history: "),
    ("bad-utf8", b"\xff[]", "history: not valid UTF-8"),
    ("too-many", [{"role": "user", "content": "x"}] * 300, "history: 300 messages is over the limit of 256"),
    ("content-too-long", [{"role": "user", "content": "a" * 20000}], "history[0].content: 20000 bytes"),
]


@pytest.mark.parametrize("case, history, needle", BAD, ids=[c[0] for c in BAD])
def test_bad_history_is_refused_naming_the_problem(case, history, needle):
    with pytest.raises(RequestError) as e:
        parse_chat_request(_inputs(history=history), {}, Limits())
    assert needle in str(e.value), str(e.value)


def test_control_characters_in_history_are_dropped():
    history = [{"role": "user", "content": "a\x1bb"}, {"role": "assistant", "content": "x\x10y\x1e\nz"}]
    got = parse_chat_request(_inputs(history=history), {}, Limits()).history
    assert [m["content"] for m in got] == ["ab", "xy\nz"]


def test_history_and_a_session_are_not_both_accepted():
    with pytest.raises(RequestError, match="either session_id .* or history, not both"):
        parse_chat_request(_inputs(history=[], session_id="s"), {}, Limits())


class Template:
    def render(self, messages, add_generation_prompt, tools=None):
        return "".join(f"<{m['role']}>{m['content']}|" for m in messages) + (
            "<assistant>" if add_generation_prompt else ""
        )


class Tokenizer:
    """One id per character: a prompt's ids spell its rendered text."""

    template = Template()

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def _text(prompt):
    return "".join(map(chr, prompt.ids))


def test_the_clients_system_prompt_replaces_the_servers_for_that_chat():
    builder = PromptBuilder(Tokenizer(), "SERVER", max_turns=6, context_window=4096)
    assert _text(builder.build(None, "hi", 8)) == "<system>SERVER|<user>hi|<assistant>"
    assert _text(builder.build(None, "hi", 8, system="CLIENT")) == "<system>CLIENT|<user>hi|<assistant>"


def test_a_stateless_turn_builds_its_prompt_from_the_history_and_never_touches_the_store():
    prompts = PromptBuilder(Tokenizer(), "SERVER", max_turns=6, context_window=4096)
    sessions = Sessions()
    pools = Pools(engine_short=[_answer([7, EOT], EngineStats(FinishReason.STOP, reused=32, kv_local_blocks=2))])
    turn = ChatTurn(
        prompts=prompts,
        sessions=sessions,
        router=Router(10_000),
        pools=pools,
        health=PoolHealth(),
        faq=None,
        decode=decode,
        stop_ids={EOT},
        end_of_turn_id=EOT,
        clock=Clock(),
    )
    chat = parse_chat_request(_inputs(history=CONVERSATION), {}, Limits())
    sink = Sink()
    turn.run(chat, sink, lambda: False, 0.0)
    sent = "".join(map(chr, pools.calls[0][1].prompt_ids))
    assert sent == (
        "<system>You answer in one line.|<user>Where is my order?|<assistant>It ships tomorrow.|"
        "<user>and my refund?|<assistant>"
    )
    assert sessions.loads == [] and sessions.saved == []
    assert sink.stats["session"] == "none" and sink.stats["reused_tokens"] == 32
    assert pools.calls[0][1].expected_reuse == 0  # nothing stored by a session: the pool finds blocks by content

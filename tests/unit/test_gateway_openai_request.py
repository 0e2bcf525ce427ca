"""OpenAI's request onto one chat call, and chat's refusals onto OpenAI's errors: pure
functions, no server."""

from __future__ import annotations

import base64

import pytest

from switchboard.client import ChatRequest, VoiceRequest
from switchboard.gateway.errors import APIError, from_chat_error
from switchboard.gateway.openai_request import parse_body, parse_messages, parse_request


def req(**kw):
    return parse_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}, "m")


def test_the_last_user_message_is_the_text_and_the_rest_the_history():
    text, history = parse_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi!"},
            {"role": "user", "content": [{"type": "text", "text": "Where is "}, {"type": "text", "text": "it?"}]},
            {"role": "user", "content": "Order 42.", "name": "ann"},
        ]
    )
    assert text == "Where is it?\n\nOrder 42."  # a user's messages in a row: one turn
    assert history == [
        {"role": "system", "content": "Be brief.\n\nAnswer in English."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi!"},
    ]


def test_defaults_and_parameters():
    call = req()
    assert (call.stream, call.include_usage, call.max_tokens, call.temperature, call.stop, call.seed) == (
        False,
        False,
        None,
        None,
        (),
        None,
    )
    call = req(
        stream=True,
        stream_options={"include_usage": True},
        max_completion_tokens=7,
        temperature=0,
        top_p=0.5,
        stop="\n",
        seed=3,
        user="u",
        n=1,
        presence_penalty=0,
        frequency_penalty=-1.5,
        logprobs=False,
        tools=[],
        response_format={"type": "text"},
        store=False,
        metadata={},
    )
    assert (
        call.stream and call.include_usage and call.max_tokens == 7 and call.max_tokens_param == "max_completion_tokens"
    )
    assert (call.temperature, call.top_p, call.stop, call.seed, call.user) == (0.0, 0.5, ("\n",), 3, "u")
    assert (call.presence_penalty, call.frequency_penalty) == (0.0, -1.5)
    assert req().presence_penalty is None and req().frequency_penalty is None, "not sent: the chat's 0"
    assert req(max_tokens=5, max_completion_tokens=5).max_tokens == 5


@pytest.mark.parametrize(
    "kw, param, needle",
    [
        ({"n": True}, "n", "n: true is not supported"),
        ({"presence_penalty": 2.5}, "presence_penalty", "presence_penalty: 2.5 is outside [-2, 2]"),
        ({"frequency_penalty": -3}, "frequency_penalty", "frequency_penalty: -3 is outside [-2, 2]"),
        ({"frequency_penalty": "0.5"}, "frequency_penalty", "frequency_penalty: expected a number"),
        ({"logit_bias": {"5": 1}}, "logit_bias", "is not supported"),
        ({"max_tokens": True}, "max_tokens", "expected an integer"),
        ({"temperature": float("inf")}, "temperature", "expected a number"),
        ({"seed": 1.0}, "seed", "expected an integer"),
        ({"stop": ["a", ""]}, "stop", "1 to 256 characters"),
        ({"stream_options": {"include_usage": True, "x": 1}, "stream": True}, "stream_options", "expected"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "messages", "the last message must be the user's"),
        ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}, "messages", "'tool_call_id'"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages", "text: expected"),
    ],
)
def test_refusals_name_the_field(kw, param, needle):
    with pytest.raises(APIError) as e:
        req(**kw)
    assert e.value.status == 400 and e.value.param == param and needle in e.value.message, e.value.body()


def test_response_formats_become_chats():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "thing-1", "strict": True, "schema": schema}}
    assert req(response_format=fmt).response_format == {"type": "json_schema", "schema": schema}
    assert req(response_format={"type": "json_object"}).response_format == {"type": "json_object"}
    assert req(response_format={"type": "text"}).response_format is None and req().response_format is None


@pytest.mark.parametrize(
    "fmt, needle",
    [
        ("json", 'expected an object with a "type"'),
        ({"type": "yaml"}, "'yaml' is not one of text, json_object, json_schema"),
        ({"type": "json_schema"}, "json_schema: required"),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "name: required"),
        ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "name: required"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": []}}, "expected a JSON Schema object"),
        ({"type": "json_schema", "json_schema": {"name": "a", "strict": "yes"}}, "strict: expected true or false"),
    ],
)
def test_a_bad_response_format_is_refused_naming_the_problem(fmt, needle):
    with pytest.raises(APIError) as e:
        req(response_format=fmt)
    assert e.value.status == 400 and e.value.param == "response_format" and needle in e.value.message


def test_logprobs_and_top_logprobs():
    assert req().logprobs is None and req(logprobs=False).logprobs is None
    assert req(logprobs=True).logprobs == 0 and req(logprobs=True, top_logprobs=5).logprobs == 5
    for kw, needle in (
        ({"logprobs": "yes"}, "logprobs: expected true or false"),
        ({"logprobs": True, "top_logprobs": 6}, "top_logprobs: expected an integer in [0, 5]"),
        ({"top_logprobs": 2}, "top_logprobs: only with logprobs true"),
    ):
        with pytest.raises(APIError) as e:
            req(**kw)
        assert e.value.status == 400 and needle in e.value.message


def test_another_model_is_404_and_bodies_must_be_json_objects():
    with pytest.raises(APIError) as e:
        parse_request({"model": "gpt-4o", "messages": []}, "m")
    assert e.value.status == 404 and e.value.code == "model_not_found"
    for raw in (b"", b"[]", b"\xff", b"[" * 100000):
        with pytest.raises(APIError) as e:
            parse_body(raw)
        assert e.value.status == 400 and e.value.message.startswith("request body:")


@pytest.mark.parametrize(
    "code, message, status, param, text",
    [
        ("INVALID_ARGUMENT", "text: empty message", 400, "messages", "the last user message: empty message"),
        (
            "INVALID_ARGUMENT",
            "max_new_tokens: 900 is outside [1, 512]",
            400,
            "max_completion_tokens",
            "max_completion_tokens: 900 is outside [1, 512]",
        ),
        ("INVALID_ARGUMENT", "parameter seed: -1 is outside [0, 9]", 400, "seed", "seed: -1 is outside"),
        (
            "INVALID_ARGUMENT",
            "json_schema: Invalid type: wat",
            400,
            "response_format",
            "response_format.json_schema.schema: Invalid type: wat",
        ),
        (
            "INVALID_ARGUMENT",
            "history[2].content: contains control character U+0000",
            400,
            "messages",
            "the messages before the last: contains control",
        ),
        (
            "INVALID_ARGUMENT",
            "text is too long: the prompt takes 2000 tokens",
            400,
            "messages",
            "messages are too long: the prompt takes 2000 tokens",
        ),
        (
            "INVALID_ARGUMENT",
            "max_new_tokens: 4 is below the 9 tokens the shortest answer in this response_format takes",
            400,
            "max_completion_tokens",
            "max_completion_tokens: 4 is below the 9 tokens",
        ),
        (
            "INVALID_ARGUMENT",
            "frequency_penalty: 3.0 is outside [-2.0, 2.0]",
            400,
            "frequency_penalty",
            "frequency_penalty: 3.0 is outside",
        ),
        ("UNAVAILABLE", "overloaded (queue_full); try again later", 503, None, "retry later"),
        ("DEADLINE_EXCEEDED", "no response within 120 s", 504, None, "did not answer in time"),
        ("INTERNAL", "internal error", 500, None, "the chat service failed: internal error"),
        (None, "unexpected inference input 'x'", 500, None, "the chat service failed"),
    ],
)
def test_chat_refusals_become_openai_errors(code, message, status, param, text):
    e = from_chat_error(code, message, 3, "max_completion_tokens")
    assert (e.status, e.param) == (status, param) and text in e.message, e.body()
    assert (e.headers.get("Retry-After") == "3") == (status == 503)
    assert set(e.body()["error"]) == {"message", "type", "param", "code"}


def test_context_overflow_has_openais_code():
    assert from_chat_error("INVALID_ARGUMENT", "text is too long: x", 1).code == "context_length_exceeded"


TOOL = {"type": "function", "function": {"name": "get_order_status", "parameters": {"type": "object"}}}
CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_order_status", "arguments": "{}"}}],
}


def test_a_conversation_ending_in_tool_results_is_a_turn_of_results():
    messages = [{"role": "user", "content": "where?"}, CALLED, {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    call = req(messages=messages, tools=[TOOL], tool_choice="auto")
    assert call.text == "" and call.tool_results == [{"tool_call_id": "c1", "content": "ok"}]
    assert call.history == [{"role": "user", "content": "where?"}, {**CALLED, "content": ""}]
    assert (call.tools, call.tool_choice) == ([TOOL], "auto")
    later = req(
        messages=[*messages, {"role": "assistant", "content": "Shipped."}, {"role": "user", "content": "thanks"}],
        tools=[TOOL],
    )
    assert later.text == "thanks" and later.tool_results is None and later.history[2]["role"] == "tool"


@pytest.mark.parametrize(
    "kw, param, needle",
    [
        ({"tools": {"type": "function"}}, "tools", "tools: expected a list"),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice", "tool_choice: expected"),
        (
            {"messages": [{"role": "user", "content": "x"}, CALLED, {"role": "user", "content": "y"}]},
            "messages",
            "'get_order_status' is not one of the request's tools (none sent)",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "y"}],
                "tools": [TOOL],
            },
            "messages",
            "'c1' is not a call of the answer before it",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {**CALLED, "tool_calls": [{"id": "c1", "function": {"name": "get_order_status", "arguments": {}}}]},
                    {"role": "user", "content": "y"},
                ],
                "tools": [TOOL],
            },
            "messages",
            "arguments: expected a string",
        ),
    ],
)
def test_bad_tool_requests_name_the_field(kw, param, needle):
    with pytest.raises(APIError) as e:
        req(**kw)
    assert e.value.status == 400 and e.value.param == param and needle in e.value.message, e.value.body()


def test_a_call_becomes_the_sdks_chat_or_voice_request():
    chat = req(max_tokens=9, temperature=0.5, seed=3, presence_penalty=1.0).chat_request(1)
    assert isinstance(chat, ChatRequest) and (chat.text, chat.priority, chat.max_new_tokens) == ("hi", 1, 9)
    assert (chat.temperature, chat.seed, chat.presence_penalty, chat.session_id) == (0.5, 3, 1.0, None)
    result = {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    results = req(messages=[{"role": "user", "content": "where?"}, CALLED, result], tools=[TOOL]).chat_request(2)
    assert results.text is None and results.tool_results and results.tools == [TOOL]
    audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF").decode(), "format": "wav"}}
    voice = req(messages=[{"role": "user", "content": [audio]}]).chat_request(2)
    assert isinstance(voice, VoiceRequest) and voice.audio == b"RIFF" and voice.language is None

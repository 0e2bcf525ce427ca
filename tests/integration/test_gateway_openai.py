"""The OpenAI-compatible gateway against the real stack, through the official ``openai``
client: answers streamed and not, a stateless two-turn chat whose second turn reuses the
first's KV (``cached_tokens``), the bad-input catalogue over HTTP (OpenAI's error shape, the
right status, never a traceback; 415 unless the body is declared JSON), keys and tiers, the
framing of streamed answers (chunked to HTTP/1.1, close-delimited to HTTP/1.0), overload answers
(429, 503 with Retry-After), and a client that leaves cancelling its chat in the server."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.request

import jsonschema
import openai
import pytest

from tests.integration.gatewaytools import LIVE_KEY, STANDARD_KEY, Gateway

MODEL = "switchboard"


def test_a_whole_answer_with_usage(oai):
    r = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Where is my order?"}], temperature=0, max_tokens=48
    )
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content.strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 48
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_a_streamed_answer_is_the_whole_answer_in_pieces_then_usage(oai):
    messages = [{"role": "user", "content": "我的订单什么时候发货？"}]
    whole = oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=40)
    chunks = list(
        oai.chat.completions.create(
            model=MODEL,
            messages=messages,
            temperature=0,
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and any("\u4e00" <= ch <= "\u9fff" for ch in text)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_a_stream_without_usage_has_none(oai):
    chunks = list(
        oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
        )
    )
    assert chunks and all(getattr(c, "usage", None) is None for c in chunks)


def test_a_second_turn_sent_whole_reuses_the_first_turns_kv(oai):
    """Stateless: no session id; the client sends the history, the pools find its prefix's blocks."""
    messages = [
        {"role": "system", "content": "You are the order desk of a shop. Order 7731-KX was placed today."},
        {"role": "user", "content": "Hello, I placed order 7731-KX this morning; where is it now?"},
    ]
    first = oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=40)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And when will it arrive?"},
    ]
    second = oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=40)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # At least every whole 16-token block of the first turn's prompt: the history was found by content.
    assert cached >= first.usage.prompt_tokens // 16 * 16 > 0, (first.usage, second.usage)
    assert cached < second.usage.prompt_tokens
    assert second.choices[0].message.content.strip()


def test_a_conversation_holding_control_characters_is_answered(oai):
    # An earlier answer (a random-weight model's) wrote U+0010 and the client sends it back:
    # never refused for Switchboard's own words; the characters are dropped, as the prompt shows.
    sent = [
        {"role": "user", "content": "Where is my order?"},
        {"role": "assistant", "content": "It ships\x10 tomorrow\x1e."},
        {"role": "user", "content": "And the \x1b[1mrefund\x00?"},
    ]
    clean = [{**m, "content": m["content"].translate({c: None for c in (0x10, 0x1E, 0x1B, 0x00)})} for m in sent]
    got, want = (
        oai.chat.completions.create(model=MODEL, messages=m, temperature=0, max_tokens=16) for m in (sent, clean)
    )
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage.prompt_tokens == want.usage.prompt_tokens


ORDER = {
    "type": "object",
    "properties": {
        "intent": {"enum": ["order_status", "return", "refund", "other"]},
        "order_id": {"type": "string", "pattern": "^SB[0-9]{6}$"},
        "urgent": {"type": "boolean"},
    },
    "required": ["intent", "order_id", "urgent"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_json_schema_answer_parses_and_validates(oai, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "order_lookup", "strict": True, "schema": ORDER}}
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Where is my order SB123456?"}], max_tokens=96)
    if stream:
        chunks = list(oai.chat.completions.create(**ask, response_format=fmt, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        r = oai.chat.completions.create(**ask, response_format=fmt)
        text, finish = r.choices[0].message.content, [r.choices[0].finish_reason]
    jsonschema.validate(json.loads(text), ORDER)
    assert finish == ["stop"]
    # the same question, free: the model's own words, not JSON
    free = oai.chat.completions.create(**ask).choices[0].message.content
    with pytest.raises(ValueError):
        json.loads(free)


# The issue-66 case: free-text strings, which the default model never closes; cut by the budget,
# the engine finishes the answer (the string cut and closed, the required field added).
FREE = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "topic": {"type": "string"}},
    "required": ["answer", "topic"],
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("max_tokens", [16, 64])
def test_a_json_schema_answer_the_budget_cuts_still_parses_with_finish_reason_length(oai, stream, max_tokens):
    fmt = {"type": "json_schema", "json_schema": {"name": "faq", "strict": True, "schema": FREE}}
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "How do I delete my account?"}], temperature=0)
    ask.update(max_tokens=max_tokens, response_format=fmt)
    if stream:
        chunks = list(oai.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        used = chunks[-1].usage.completion_tokens
    else:
        r = oai.chat.completions.create(**ask)
        text, finish, used = r.choices[0].message.content, [r.choices[0].finish_reason], r.usage.completion_tokens
    answer = json.loads(text)
    jsonschema.validate(answer, FREE)
    assert finish == ["length"] and used <= max_tokens
    assert answer["answer"], "the model's own words, cut, not an empty answer"


# An answer the default model writes in loops (all 512 tokens, greedy: LONG below).
LOOPS = [{"role": "user", "content": "订单" * 100}]


def _repeated(text: str, n: int = 6) -> float:
    """The share of ``text``'s n-character windows that repeat an earlier one."""
    windows = [text[i : i + n] for i in range(len(text) - n + 1)]
    return 1 - len(set(windows)) / len(windows)


def test_presence_and_frequency_penalties_are_taken_and_break_a_loop(oai):
    ask = dict(model=MODEL, messages=LOOPS, temperature=0, max_tokens=64)
    plain = oai.chat.completions.create(**ask).choices[0].message.content
    assert _repeated(plain) > 0.5, plain
    again = oai.chat.completions.create(**ask, presence_penalty=0, frequency_penalty=0).choices[0].message.content
    assert again == plain, "0: the answer as without"
    freq = oai.chat.completions.create(**ask, frequency_penalty=1.0).choices[0].message.content
    assert _repeated(freq) < _repeated(plain) / 2, freq
    presence = oai.chat.completions.create(**ask, presence_penalty=1.0).choices[0].message.content
    assert presence != plain


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_logprobs_score_every_token_of_the_answer(oai, stream):
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "我的订单什么时候发货？"}], max_tokens=24)
    ask.update(logprobs=True, top_logprobs=3, temperature=0)
    if stream:
        chunks = list(oai.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        usage, finish = chunks[-1].usage, [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        r = oai.chat.completions.create(**ask)
        choice, usage = r.choices[0], r.usage
        text, entries, finish = choice.message.content, choice.logprobs.content, choice.finish_reason
    # one entry per generated token (the stop token is no content); their bytes are the text
    assert len(entries) == usage.completion_tokens - (finish == "stop")
    assert bytes(b for e in entries for b in e.bytes).decode("utf-8") == text
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True) and e.logprob == pytest.approx(tops[0]), "greedy: the likeliest"
    plain = oai.chat.completions.create(**{k: v for k, v in ask.items() if "logprobs" not in k})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == text


def test_json_mode_gives_a_json_object(oai):
    r = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "我要退货"}],
        response_format={"type": "json_object"},
        max_tokens=200,
    )
    choice = r.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # cut at max_tokens, as OpenAI's may be: an object's beginning
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")


def test_the_model_list(oai):
    listed = [m.id for m in oai.models.list().data]
    assert listed[0] == MODEL
    assert set(listed[1:]) <= {"switchboard-asr", "whisper-1"}  # the recognizer, once it is installed
    assert oai.models.retrieve(MODEL).owned_by == "switchboard"
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("gpt-4o")


def test_sampling_parameters_and_stop_are_honoured(oai):
    messages = [{"role": "user", "content": "How do I return an item?"}]
    kw = dict(model=MODEL, messages=messages, temperature=0.9, top_p=0.8, seed=7, max_completion_tokens=24)
    a, b = oai.chat.completions.create(**kw, user="u-1"), oai.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content  # same seed, same sample
    greedy = oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24)
    text = greedy.choices[0].message.content
    stop = text.split()[2]  # a word inside the answer
    cut = oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24, stop=[stop])
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = oai.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=24, stop=stop, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text[: text.index(stop)]


# -- the bad-input catalogue over HTTP ---------------------------------------------------------
HI = [{"role": "user", "content": "Where is my order?"}]


def body(**kw):
    return {"model": MODEL, "messages": HI, **kw}


def user(content):
    return body(messages=[{"role": "user", "content": content}])


# (case id, request body (dict, or raw bytes), extra headers, HTTP status, param, what the message must contain)
BAD = [
    ("not-json", b"{oops", {}, 400, None, "request body: not valid JSON"),
    ("json-array", b"[1, 2]", {}, 400, None, "request body: expected a JSON object"),
    ("unknown-field", body(foo=1), {}, 400, "foo", "Unrecognized request argument supplied: foo"),
    ("model-missing", {"messages": HI}, {}, 400, "model", "model: required"),
    ("model-unknown", body(model="gpt-4o"), {}, 404, "model", "'gpt-4o' does not exist"),
    ("messages-missing", {"model": MODEL}, {}, 400, "messages", "messages: expected a non-empty list"),
    ("messages-empty", body(messages=[]), {}, 400, "messages", "messages: expected a non-empty list"),
    ("messages-string", body(messages="hi"), {}, 400, "messages", "messages: expected a non-empty list"),
    ("message-not-object", body(messages=["hi"]), {}, 400, "messages", "messages[0]: expected an object"),
    ("role-missing", body(messages=[{"content": "hi"}]), {}, 400, "messages", "messages[0].role: required"),
    ("role-robot", body(messages=[{"role": "robot", "content": "x"}]), {}, 400, "messages", "'robot' is not supported"),
    (
        "orphan-tool",
        body(messages=[{"role": "tool", "content": "x"}]),
        {},
        400,
        "messages",
        "is not a call of the answer",
    ),
    ("content-missing", body(messages=[{"role": "user"}]), {}, 400, "messages", "messages[0].content: required"),
    ("content-number", user(5), {}, 400, "messages", "messages[0].content: expected a string or a list"),
    ("content-image", user([{"type": "image_url", "image_url": {"url": "x"}}]), {}, 400, "messages", "text only"),
    (
        "tool-calls",
        body(messages=[{"role": "user", "content": "x", "tool_calls": []}]),
        {},
        400,
        "messages",
        "field 'tool_calls' is not supported",
    ),
    (
        "last-is-assistant",
        body(messages=[*HI, {"role": "assistant", "content": "ok"}]),
        {},
        400,
        "messages",
        "the last message must be the user's",
    ),
    (
        "late-system",
        body(messages=[*HI, {"role": "system", "content": "x"}]),
        {},
        400,
        "messages",
        "a system message after the conversation started",
    ),
    ("text-empty", user(""), {}, 400, "messages", "the last user message: empty message"),
    ("text-whitespace", user(" \t\n "), {}, 400, "messages", "the last user message: empty message"),
    (
        "text-lone-surrogate",
        b'{"model": "switchboard", "messages": [{"role": "user", "content": "a\\ud800"}]}',
        {},
        400,
        "messages",
        "messages[0].content: not valid UTF-8",
    ),
    (
        "text-bad-utf8-bytes",
        b'{"model": "switchboard", "messages": [{"role": "user", "content": "\xc3\x28"}]}',
        {},
        400,
        None,
        "request body: not valid JSON",
    ),
    ("text-over-byte-limit", user("a" * 20000), {}, 400, "messages", "20000 bytes is over the limit"),
    ("text-beyond-context", user("订单" * 2500), {}, 400, "messages", "messages are too long"),
    ("max-tokens-zero", body(max_tokens=0), {}, 400, "max_tokens", "max_tokens: expected an integer of at least 1"),
    ("max-tokens-negative", body(max_tokens=-5), {}, 400, "max_tokens", "max_tokens: expected an integer"),
    ("max-tokens-huge", body(max_tokens=10**9), {}, 400, "max_tokens", "max_tokens: 1000000000 is outside [1, 512]"),
    (
        "max-completion-huge",
        body(max_completion_tokens=600),
        {},
        400,
        "max_completion_tokens",
        "max_completion_tokens: 600 is outside",
    ),
    ("max-tokens-string", body(max_tokens="8"), {}, 400, "max_tokens", "max_tokens: expected an integer"),
    ("max-tokens-float", body(max_tokens=8.5), {}, 400, "max_tokens", "max_tokens: expected an integer"),
    ("max-tokens-both-differ", body(max_tokens=8, max_completion_tokens=9), {}, 400, "max_completion_tokens", "differ"),
    (
        "temperature-nan",
        b'{"model": "switchboard", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        {},
        400,
        "temperature",
        "temperature: expected a number",
    ),
    ("temperature-negative", body(temperature=-0.5), {}, 400, "temperature", "temperature: -0.5 is outside"),
    ("temperature-too-high", body(temperature=2.5), {}, 400, "temperature", "temperature: 2.5 is outside"),
    ("temperature-string", body(temperature="hot"), {}, 400, "temperature", "temperature: expected a number"),
    ("temperature-bool", body(temperature=True), {}, 400, "temperature", "temperature: expected a number"),
    ("top-p-zero", body(top_p=0), {}, 400, "top_p", "top_p: 0.0 is outside (0.0"),
    ("top-p-over-one", body(top_p=1.5), {}, 400, "top_p", "top_p: 1.5 is outside"),
    ("seed-negative", body(seed=-1), {}, 400, "seed", "seed: expected an integer in [0, 4294967295]"),
    ("seed-huge", body(seed=2**70), {}, 400, "seed", "seed: expected an integer"),
    ("stop-five", body(stop=["a", "b", "c", "d", "e"]), {}, 400, "stop", "stop: 5 sequences is over the limit"),
    ("stop-empty", body(stop=""), {}, 400, "stop", "stop: each sequence must have 1 to"),
    ("stop-number", body(stop=5), {}, 400, "stop", "stop: expected a string or a list"),
    ("n-two", body(n=2), {}, 400, "n", "n: 2 is not supported"),
    ("stream-string", body(stream="yes"), {}, 400, "stream", "stream: expected true or false"),
    (
        "stream-options-without-stream",
        body(stream_options={"include_usage": True}),
        {},
        400,
        "stream_options",
        "only allowed when stream is true",
    ),
    (
        "include-usage-string",
        body(stream=True, stream_options={"include_usage": "yes"}),
        {},
        400,
        "stream_options",
        "include_usage: expected true or false",
    ),
    (
        "tool-name",
        body(tools=[{"type": "function", "function": {"name": "a b"}}]),
        {},
        400,
        "tools",
        "tools[0].function.name",
    ),
    (
        "tool-choice",
        body(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="g"),
        {},
        400,
        "tool_choice",
        "expected",
    ),
    ("top-logprobs-9", body(logprobs=True, top_logprobs=9), {}, 400, "top_logprobs", "integer in [0, 5]"),
    ("presence-penalty-3", body(presence_penalty=3), {}, 400, "presence_penalty", "3 is outside [-2, 2]"),
    ("frequency-penalty-word", body(frequency_penalty="x"), {}, 400, "frequency_penalty", "expected a number"),
    (
        "json-schema-no-room",  # 11 tokens at least on the default model: refused, not cut
        body(max_tokens=5, response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": FREE}}),
        {},
        400,
        "max_tokens",
        "max_tokens: 5 is below the",
    ),
    (
        "json-schema-unusable",
        body(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}),
        {},
        400,
        "response_format",
        "response_format.json_schema.schema: Invalid type: wat",
    ),
    (
        "json-schema-unnamed",
        body(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
        {},
        400,
        "response_format",
        "json_schema.name: required",
    ),
    ("response-format-xml", body(response_format={"type": "xml"}), {}, 400, "response_format", "'xml' is not one of"),
    ("user-number", body(user=5), {}, 400, "user", "user: expected a str"),
    (
        "priority-three",
        body(),
        {"X-Switchboard-Priority": "3"},
        400,
        "X-Switchboard-Priority",
        "expected 1 (live) or 2",
    ),
    ("priority-word", body(), {"X-Switchboard-Priority": "high"}, 400, "X-Switchboard-Priority", "expected 1"),
    (
        "priority-above-tier",
        body(),
        {"X-Switchboard-Priority": "1"},
        403,
        "X-Switchboard-Priority",
        "tier (standard) allows priority 2 only",
    ),
    ("key-missing", body(), {"Authorization": None}, 401, None, "missing API key"),
    ("key-wrong", body(), {"Authorization": "Bearer sk-not-a-key-0123456789"}, 401, None, "invalid API key"),
    ("key-not-bearer", body(), {"Authorization": f"Basic {STANDARD_KEY}"}, 401, None, "invalid API key"),
    ("body-too-large", user("a" * (2 << 20)), {}, 413, None, "over the limit of 1048576"),
    # what a web page may post to any origin without a CORS preflight: refused
    ("content-type-text", body(), {"Content-Type": "text/plain"}, 415, None, "expected application/json"),
    (
        "content-type-form",
        body(),
        {"Content-Type": "application/x-www-form-urlencoded"},
        415,
        None,
        "got 'application/x-www-form-urlencoded'",
    ),
    ("content-type-missing", body(), {"Content-Type": None}, 415, None, "Content-Type: missing"),
]


def post(url: str, payload, headers: dict, path="/v1/chat/completions", method="POST"):
    """(status, headers, body bytes) of a raw HTTP request (the official client checks types
    before sending, so malformed bodies go out by hand)."""
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    h = {"Content-Type": "application/json", "Authorization": f"Bearer {STANDARD_KEY}"}
    h.update(headers)
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
    try:
        conn.request(method, path, body=raw if method == "POST" else None, headers={k: v for k, v in h.items() if v})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


@pytest.mark.parametrize("case, payload, headers, status, param, needle", BAD, ids=[c[0] for c in BAD])
def test_bad_input_gets_openais_error_shape_naming_the_problem(gateway, case, payload, headers, status, param, needle):
    code, h, raw = post(gateway.url, payload, headers)
    assert code == status, (case, code, raw[:500])
    error = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert needle in error["message"], (case, error)
    assert error["param"] == param, (case, error)
    assert error["type"] == {401: "invalid_request_error", 403: "permission_error"}.get(code, "invalid_request_error")
    assert "Traceback" not in error["message"] and 'File "' not in error["message"]
    if code == 401:
        assert h.get("www-authenticate") == "Bearer"
    assert gateway.healthy()


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8"])
def test_a_chat_declared_json_is_answered(gateway, content_type):
    code, _, raw = post(gateway.url, body(max_tokens=4), {"Content-Type": content_type})
    assert code == 200, raw
    assert json.loads(raw)["choices"][0]["message"]["content"]


def test_the_catalogue_covers_what_the_grpc_catalogue_does():
    assert len(BAD) >= 50


def test_the_official_client_raises_its_own_exceptions(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ""}])
    assert e.value.status_code == 400 and e.value.param == "messages" and "empty message" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=100000)
    assert e.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "订单" * 2500}])
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):  # refused before any text: a real status, streaming too
        list(oai.chat.completions.create(model=MODEL, messages=HI, temperature=3.0, stream=True))
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=oai.base_url, api_key="sk-wrong-wrong-wrong-wrong", max_retries=0).models.list()


def test_routes_and_methods_answer_in_the_same_shape(gateway):
    code, _, raw = post(gateway.url, b"", {}, path="/v1/completions")
    assert code == 404 and json.loads(raw)["error"]["message"] == "no route '/v1/completions'"
    code, _, raw = post(gateway.url, b"", {}, method="GET")
    assert code == 405 and "error" in json.loads(raw)


def test_a_live_key_gets_priority_1_by_default_and_may_ask_for_2(gateway):
    def priority(headers):
        code, _, raw = post(
            gateway.url,
            body(max_tokens=4),
            {"Authorization": f"Bearer {LIVE_KEY}", "X-Switchboard-Stats": "1", **headers},
        )
        assert code == 200, raw
        return json.loads(raw)["switchboard"]["priority"]

    assert priority({}) == 1
    assert priority({"X-Switchboard-Priority": "2"}) == 2
    code, _, raw = post(gateway.url, body(max_tokens=4), {"X-Switchboard-Stats": "1"})
    assert json.loads(raw)["switchboard"]["priority"] == 2  # a standard key: 2


def test_cors_preflight_is_answered_only_for_configured_origins(stack, tmp_path):
    g = Gateway(stack.grpc_url, tmp_path, "--cors-origins", "https://shop.example")
    try:

        def preflight(origin):
            req = urllib.request.Request(
                f"{g.url}/v1/chat/completions",
                method="OPTIONS",
                headers={
                    "Origin": origin,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization,content-type,x-switchboard-priority",
                },
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return r.status, r.headers.get("access-control-allow-origin")
            except urllib.error.HTTPError as e:
                return e.code, e.headers.get("access-control-allow-origin")

        assert preflight("https://shop.example") == (200, "https://shop.example")
        assert preflight("https://evil.example")[1] is None
    finally:
        g.stop()


# -- framing of a streamed answer -------------------------------------------------------------------
def _raw_stream(gateway, version: str) -> socket.socket:
    payload = json.dumps(body(max_tokens=16, stream=True)).encode()
    s = socket.create_connection(("127.0.0.1", gateway.port), timeout=60)
    s.sendall(
        f"POST /v1/chat/completions HTTP/{version}\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {STANDARD_KEY}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return s


def _head(data: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, rest = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    return status, {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}, rest


def _answer(events: bytes) -> str:
    """The text of a stream's events; fails on anything that is not an event (a chunk size)."""
    assert events.endswith(b"data: [DONE]\n\n"), events[-200:]
    data = events.decode().split("\n\n")[:-2]
    assert data and all(e.startswith("data: {") for e in data), events[:300]
    chunks = [json.loads(e.removeprefix("data: ")) for e in data]
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)


def test_a_streamed_answer_to_http_1_0_is_close_delimited(gateway):
    with _raw_stream(gateway, "1.0") as s:
        data = b""
        while part := s.recv(65536):  # to the end: the gateway closes the connection
            data += part
    status, headers, events = _head(data)
    assert status.endswith(" 200 OK"), data[:300]
    assert "transfer-encoding" not in headers and "content-length" not in headers and headers["connection"] == "close"
    assert events.startswith(b"data: {") and _answer(events).strip()


def test_a_streamed_answer_to_http_1_1_is_still_chunked(gateway):
    with _raw_stream(gateway, "1.1") as s:
        data = b""
        while not data.endswith(b"\r\n0\r\n\r\n"):
            part = s.recv(65536)
            assert part, data[-300:]
            data += part
    status, headers, chunked = _head(data)
    assert status.endswith(" 200 OK") and headers["transfer-encoding"] == "chunked" and "connection" not in headers
    events = b""
    while True:
        size, _, chunked = chunked.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        events, chunked = events + chunked[:n], chunked[n + 2 :]
    assert _answer(events).strip()


# -- overload ----------------------------------------------------------------------------------
# The default model answers this at length (all 512 tokens, greedy): about a second of generation
# to hold a slot or to leave in the middle of.
LONG = [{"role": "user", "content": "订单" * 100}]
# An answer that cannot end early, whatever the model would say: a string of 400 characters at least.
GOES_ON = {
    "type": "json_schema",
    "json_schema": {
        "name": "long",
        "schema": {"type": "object", "properties": {"a": {"type": "string", "minLength": 400}}, "required": ["a"]},
    },
}


def _long_stream(url: str, key: str = STANDARD_KEY):
    """A streaming chat that goes on, its first chunk read: (connection, response)."""
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
    payload = body(messages=LONG, max_tokens=512, temperature=0, stream=True, response_format=GOES_ON)
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(payload),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    r = conn.getresponse()
    assert r.status == 200
    assert r.readline().startswith(b"data: ")
    return conn, r


def test_beyond_its_limit_the_gateway_answers_429_with_retry_after(stack, tmp_path):
    g = Gateway(stack.grpc_url, tmp_path, "--max-inflight", "1", "--retry-after-s", "2")
    client = openai.OpenAI(base_url=f"{g.url}/v1", api_key=STANDARD_KEY, max_retries=0, timeout=60)
    try:
        conn, _ = _long_stream(g.url)
        with pytest.raises(openai.RateLimitError) as e:
            client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)
        assert e.value.status_code == 429 and e.value.response.headers["retry-after"] == "2"
        assert e.value.code == "rate_limit_exceeded" and "too many chats in flight" in e.value.message
        conn.close()  # the slot comes back when the client leaves
        deadline = time.monotonic() + 10
        while True:
            try:
                assert client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4).choices
                break
            except openai.RateLimitError:
                assert time.monotonic() < deadline, "the slot of a client that left was not given back"
                time.sleep(0.2)
    finally:
        g.stop()


def test_a_server_that_cannot_answer_gives_503_with_retry_after(tmp_path):
    from switchboard.ops.launch import free_port

    g = Gateway(f"127.0.0.1:{free_port()}", tmp_path)  # nothing listens there
    try:
        client = openai.OpenAI(base_url=f"{g.url}/v1", api_key=STANDARD_KEY, max_retries=0, timeout=60)
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model=MODEL, messages=HI)
        assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "1"
        assert e.value.body["type"] == "server_error" and "retry later" in e.value.message
        with pytest.raises(openai.InternalServerError):
            list(client.chat.completions.create(model=MODEL, messages=HI, stream=True))
        code, h, _ = post(g.url, b"", {}, path="/readyz", method="GET")
        assert code == 503 and h["retry-after"] == "1"
        assert "Traceback" not in g.logs()
    finally:
        g.stop()


# -- a client that leaves ----------------------------------------------------------------------
def _chat_requests(stack) -> int:
    """Requests chat's execute has taken (Triton's statistics: counted at once, not once a second)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.ports.http}/v2/models/chat/stats", timeout=10) as r:
        return sum(m["execution_count"] for m in json.loads(r.read())["model_stats"])


def _cancelled(stack) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.ports.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    pattern = r'^switchboard_chat_requests_total\{[^}]*outcome="cancelled"[^}]*\} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "whole"])
def test_a_client_that_leaves_cancels_its_chat(stack, gateway, stream):
    before, requests = _cancelled(stack), _chat_requests(stack)
    if stream:
        conn, _ = _long_stream(gateway.url)
    else:
        conn = http.client.HTTPConnection(gateway.url.removeprefix("http://"), timeout=60)
        payload = body(messages=LONG, max_tokens=512, temperature=0, response_format=GOES_ON)
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(payload),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {STANDARD_KEY}"},
        )
        # Leave once chat has the request (Triton counts it as chat's execute runs; the answer
        # takes ~0.5 s more): a client gone before the gateway sent it cancels nothing in chat.
        deadline = time.monotonic() + 20
        while _chat_requests(stack) <= requests:
            assert time.monotonic() < deadline, "the chat did not start"
            time.sleep(0.01)
    conn.close()
    deadline = time.monotonic() + 20
    while _cancelled(stack) <= before:  # chat publishes its counters once a second
        assert time.monotonic() < deadline, "the chat was not cancelled"
        time.sleep(0.25)


# -- chat's stateless input under the gateway, over gRPC -----------------------------------------
def test_chat_takes_the_history_over_grpc_and_refuses_a_bad_one(client, raw):
    import numpy as np

    history = [{"role": "user", "content": "Where is my order?"}, {"role": "assistant", "content": "In My Orders."}]
    reply = client.chat("Thanks!", history=history, stream=False, max_new_tokens=8)
    assert reply.stats.session == "none" and reply.stats.prompt_tokens > 20

    def b(x):
        return np.asarray([[x]], dtype=np.object_), "BYTES"

    for blob, needle in [
        (b"[{", "[INVALID_ARG] history: not valid JSON"),
        (b'[{"role": "robot", "content": "x"}]', "[INVALID_ARG] history[0].role: 'robot' is not"),
        (b'[{"role": "tool", "content": "x"}]', "[INVALID_ARG] history[0].tool_call_id: 'None' is not a call"),
    ]:
        _, error = raw({"text": b(b"hi"), "history": b(blob)})
        assert error is not None and error.message().startswith(needle), error
    _, error = raw({"text": b(b"hi"), "history": b(b"[]"), "session_id": b(b"s")})
    assert "not both" in error.message()
    assert client.ready()

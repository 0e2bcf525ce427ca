"""Tool calls on the real stack: the official ``openai`` client (``tool_choice`` required, a named
function, auto, none; whole and streamed; the next turn with the tools' results), LangChain's
``ChatOpenAI`` (``bind_tools``, ``with_structured_output`` in function_calling mode), the gRPC SDK
with a session, and the bad-input catalogue (unknown tools in history, results for no call)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from switchboard.client import ChatError
from switchboard.serving.order_demo import TOOLS
from tests.integration.gatewaytools import STANDARD_KEY

MODEL = "switchboard"
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "Where is my order SB12345678?"}]


def _valid(calls) -> list[tuple[str, dict]]:
    """(name, arguments) of each call, every one checked against its tool's schema."""
    out = []
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, args))
    return out


def test_required_answers_with_calls_that_validate(oai):
    r = oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=96
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert _valid(choice.message.tool_calls)
    assert len({c.id for c in choice.message.tool_calls}) == len(choice.message.tool_calls)


def test_a_call_the_budget_cuts_is_finished_and_validates(oai):
    # 23 tokens: the demo tools' shortest call on the default model (transfer_to_human); the call
    # the question wants (get_order_status with the order number) is longer: the engine finishes it
    r = oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=23
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length" and r.usage.completion_tokens <= 23
    assert _valid(choice.message.tool_calls)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=22)
    assert e.value.body["param"] == "max_tokens" and "below the 23 tokens the shortest call" in e.value.message


def test_a_named_function_is_the_one_called_once(oai):
    r = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "这个订单我要退 SB87654321"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "start_return"}},
        temperature=0,
        max_tokens=96,
    )
    assert [name for name, _ in _valid(r.choices[0].message.tool_calls)] == ["start_return"]


def test_a_streamed_call_is_the_whole_call_in_pieces(oai):
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=96)
    whole = oai.chat.completions.create(**kwargs).choices[0].message.tool_calls
    chunks = list(oai.chat.completions.create(**kwargs, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert chunks[0].choices[0].delta.role == "assistant"
    firsts = [d for d in deltas if d.id]
    assert [(d.index, d.function.name) for d in firsts] == [(i, c.function.name) for i, c in enumerate(whole)]
    for i, call in enumerate(whole):
        assert "".join(d.function.arguments or "" for d in deltas if d.index == i) == call.function.arguments
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


def test_none_answers_in_text_and_auto_in_text_or_valid_calls(oai):
    none = oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=32
    )
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")
    auto = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=96)
    message = auto.choices[0].message
    if message.tool_calls:
        assert auto.choices[0].finish_reason == "tool_calls" and _valid(message.tool_calls)
    else:
        assert message.content


def test_the_tools_results_go_into_the_next_turn(oai):
    first = oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=96
    )
    message = first.choices[0].message
    results = [
        {"role": "tool", "tool_call_id": c.id, "content": json.dumps({"order_id": "SB12345678", "status": "shipped"})}
        for c in message.tool_calls
    ]
    messages = [*ASK, message.model_dump(exclude_none=True), *results]
    second = oai.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=48
    )
    assert second.choices[0].message.content and second.choices[0].message.tool_calls is None
    # turn 2's prompt is turn 1's and its answer, then the results: the KV of turn 1 is reused
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= 16


def _called(name: str, arguments: str, result: str) -> list[dict]:
    """The question, an answer calling ``name`` with ``arguments`` (id c1), and its result."""
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return [
        *ASK,
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]


BAD = [
    (
        "unknown-tool-in-history",
        _called("drop_tables", "{}", "ok"),
        "messages",
        "'drop_tables' is not one of the request's tools",
    ),
    (
        "result-for-no-call",
        [*ASK, {"role": "assistant", "content": "Let me see."}, {"role": "tool", "tool_call_id": "c9", "content": "x"}],
        "messages",
        "'c9' is not a call of the answer before it",
    ),
    (
        "arguments-not-json",
        _called("get_order_status", "{oops", "x"),
        "messages",
        "arguments: not valid JSON",
    ),
]


@pytest.mark.parametrize("case, messages, param, needle", BAD, ids=[b[0] for b in BAD])
def test_bad_tool_conversations_are_400s_naming_the_problem(oai, case, messages, param, needle):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=8)
    assert e.value.body["param"] == param and needle in e.value.body["message"], e.value.body


def test_bad_tools_are_400s_naming_the_problem(oai):
    cases = [
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "$ref": "#/nope"}}}],
            "tools",
        ),
        (
            [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "wat"}}}},
                }
            ],
            "tools",
        ),
        ([{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)], "over the limit of 128"),
        (  # a schema past chat's 64 KiB
            [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "description": "x" * 70_000}},
                }
            ],
            "bytes is over the limit",
        ),
    ]
    for tools, needle in cases:
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice="required", max_tokens=8)
        assert e.value.body["param"] == "tools" and needle in e.value.body["message"], e.value.body


# -- LangChain -----------------------------------------------------------------------------------
class GetOrderStatus(BaseModel):
    """Look up an order."""

    order_id: str = Field(pattern=r"^SB[0-9]{8}$", description="the order number, SB and 8 digits")


@pytest.fixture(scope="module")
def llm(gateway):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(
        model=MODEL, base_url=f"{gateway.url}/v1", api_key=STANDARD_KEY, temperature=0, max_tokens=96, max_retries=0
    )


def test_langchain_bind_tools_gives_parsed_tool_calls(llm):
    message = llm.bind_tools(TOOLS, tool_choice="any").invoke("Where is my order SB12345678?")
    assert message.tool_calls and all(c["name"] in SCHEMAS for c in message.tool_calls)
    for call in message.tool_calls:
        jsonschema.validate(call["args"], SCHEMAS[call["name"]])


def test_langchain_structured_output_by_function_calling_parses_into_the_model(llm):
    answer = llm.with_structured_output(GetOrderStatus, method="function_calling").invoke("订单 SB12345678 到哪了")
    assert isinstance(answer, GetOrderStatus) and answer.order_id.startswith("SB") and len(answer.order_id) == 10


# -- gRPC ----------------------------------------------------------------------------------------
def test_the_sdk_calls_tools_in_a_session_and_sends_their_results(client):
    first = client.chat(
        "Where is my order SB12345678?", session_id="tools-1", stream=False, tools=TOOLS, tool_choice="required"
    )
    assert first.stats.finish_reason == "tool_calls" and first.tool_calls
    for call in first.tool_calls:
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    results = [{"tool_call_id": c["id"], "content": '{"status":"delivered"}'} for c in first.tool_calls]
    second = client.chat(
        None, session_id="tools-1", stream=False, tools=TOOLS, tool_choice="none", tool_results=results
    )
    assert second.text and not second.tool_calls and second.stats.session == "hit"
    assert second.stats.reused_tokens >= 16  # the session's KV: turn 1 and its calls
    with pytest.raises(ChatError) as e:
        client.chat(None, session_id="tools-1", stream=False, tools=TOOLS, tool_results=results)
    assert e.value.code == "INVALID_ARGUMENT" and "is not a call of the last answer" in str(e.value)
    assert client.ready()

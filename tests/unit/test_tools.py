"""Tool calls: the format read off a chat template, the grammar that holds an answer to it, the
parser that turns the streamed text into OpenAI's tool_calls, and the request rules."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from switchboard.artifact.grammar import GrammarError, Grammars
from switchboard.artifact.tokenizer import ChatTemplate
from switchboard.artifact.tools import ToolCallParser, ToolFormat, ToolFormatError
from switchboard.serving.prompt import Conversation, PromptBuilder, check_tool_results
from switchboard.serving.request import Limits, RequestError, parse_chat_request
from switchboard.training.chat.tokenizer import CHAT_TEMPLATE
from switchboard.wire import EngineStats
from tests.unit.bpe import byte_level_bpe
from tests.unit.test_grammar import decode_with_random_logits

END = "<|end|>"
# Qwen2.5's template, the parts that write tools and calls (its layout, abridged).
QWEN = """{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}
{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen.' }}{%- endif %}
{{- "\\n\\n# Tools\\n\\n<tools>" }}{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools><|im_end|>\\n" }}{%- else %}{%- if messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endif %}
{%- for message in messages %}
{%- if (message.role == "user") or (message.role == "assistant" and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
{%- elif message.role == "assistant" %}{{- '<|im_start|>' + message.role }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}
{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}
{%- elif message.role == "tool" %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content }}
{{- '\\n</tool_response><|im_end|>\\n' }}{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""
PLAIN = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}<|assistant|>"

ORDER = {
    "type": "object",
    "properties": {"order_id": {"type": "string", "pattern": "^SB[0-9]{6}$"}},
    "required": ["order_id"],
    "additionalProperties": False,
}
REASON = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "reason": {"enum": ["damaged", "wrong size"]}},
    "required": ["order_id", "reason"],
}
TOOLS = [{"name": "get_order_status", "parameters": ORDER}, {"name": "start_return", "parameters": REASON}]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}


def default_format() -> ToolFormat:
    return ToolFormat.of(ChatTemplate(CHAT_TEMPLATE, "<|bos|>", END))


def test_the_default_template_writes_compact_tagged_calls():
    fmt = default_format()
    assert (fmt.begin, fmt.middle, fmt.end, fmt.sep) == ('<tool_call>{"name":"', '","arguments":', "}</tool_call>", "")
    assert (fmt.key_separator, fmt.item_separator, fmt.trigger) == (":", ",", "<tool_call>")


def test_qwen2s_format_is_read_off_its_template():
    fmt = ToolFormat.of(ChatTemplate(QWEN, None, None))
    assert (fmt.begin, fmt.middle, fmt.end, fmt.sep) == (
        '<tool_call>\n{"name": "',
        '", "arguments": ',
        "}\n</tool_call>",
        "\n",
    )
    assert (fmt.key_separator, fmt.item_separator) == (": ", ", ")


def test_a_template_without_tool_calls_has_no_format():
    with pytest.raises(ToolFormatError):
        ToolFormat.of(ChatTemplate(PLAIN, None, None))


def test_the_default_template_renders_calls_and_results_as_a_prefix_of_what_follows():
    t = ChatTemplate(CHAT_TEMPLATE, "<|bos|>", END)
    tools = [{"type": "function", "function": {"name": n}} for n in ("get_order_status", "start_return")]
    call = {"id": "c1", "type": "function", "function": {"name": "get_order_status", "arguments": {"order_id": "SB1"}}}
    turn1 = [{"role": "user", "content": "where?"}]
    turn2 = [*turn1, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "shipped"}]
    first = t.render(turn1, tools=tools)
    second = t.render(turn2, tools=tools)
    assert first.startswith("<|bos|><|system|><tools>get_order_status,start_return</tools><|end|>")
    assert second.startswith(first)
    assert second[len(first) :] == (
        '<tool_call>{"name":"get_order_status","arguments":{"order_id":"SB1"}}</tool_call><|end|>'
        "<|user|><tool_response>shipped</tool_response><|end|><|assistant|>"
    )


# -- the grammar ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def grammars(tmp_path_factory):
    texts = ['<tool_call>{"name":"get_order_status","arguments":{"order_id":"SB123456"}}</tool_call>', "订单 shipped"]
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok = byte_level_bpe(texts, path, vocab_size=400, special=END)
    return Grammars(path, tok.get_vocab_size() + 8, tok.token_to_id(END)), tok


def _spec(mode, tools=TOOLS, fmt=None, parallel=True):
    fmt = fmt or default_format()
    return {"type": "tool_calls", "mode": mode, "tools": tools, "format": fmt.to_dict(), "parallel": parallel}


def _decode(grammars, spec, seed, bias=None):
    return decode_with_random_logits(grammars, spec, seed, max_tokens=400, bias=bias)[1]


def _calls(text: str, fmt: ToolFormat | None = None, piece: int = 1):
    p = ToolCallParser(fmt or default_format(), set(SCHEMAS), id_factory=iter(f"call_{i}" for i in range(99)).__next__)
    content, deltas = "", []
    for i in range(0, len(text), piece):
        c, d = p.feed(text[i : i + piece])
        content, deltas = content + c, deltas + d
    c, d = p.flush()
    return content + c, deltas, p.calls


@pytest.mark.parametrize("seed", range(6))
def test_required_gives_calls_only_and_each_validates(grammars, seed):
    _, tok = grammars
    ids = _decode(grammars, _spec("required"), seed)
    text = tok.decode(ids)
    content, _, calls = _calls(text)
    assert content == "" and calls, text
    for call in calls:
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


def test_a_named_function_without_parallel_calls_is_called_once(grammars):
    _, tok = grammars
    spec = _spec("required", tools=TOOLS[1:], parallel=False)
    for seed in range(4):
        _, _, calls = _calls(tok.decode(_decode(grammars, spec, seed)))
        assert [c["function"]["name"] for c in calls] == ["start_return"]


def test_auto_is_free_text_until_the_trigger_then_a_call(grammars):
    g, tok = grammars
    trigger = tok.encode("<tool_call>").ids

    def bias(logits, ids):  # write a few words, then the trigger, one token at a time
        if 3 <= len(ids) < 3 + len(trigger):
            logits[trigger[len(ids) - 3]] = 1e9

    ids = _decode(grammars, _spec("auto"), 0, bias)
    content, _, calls = _calls(tok.decode(ids))
    assert len(content) > 0 and len(calls) >= 1
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), SCHEMAS[calls[0]["function"]["name"]])


def test_a_recursive_parameters_schema_gives_calls_that_validate(grammars):
    _, tok = grammars
    tree = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 5},
            "children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
        },
        "required": ["name", "children"],
        "additionalProperties": False,
    }
    spec = _spec("required", tools=[{"name": "plant", "parameters": tree}], parallel=False)
    complete = 0
    for seed in range(4):
        ids = _decode(grammars, spec, seed)
        p = ToolCallParser(default_format(), {"plant"})
        p.feed(tok.decode(ids))
        if len(ids) < 400:  # not cut at the walk's length
            jsonschema.validate(json.loads(p.calls[0]["function"]["arguments"]), tree)
            complete += 1
    assert complete >= 2


def test_a_bad_parameters_schema_is_a_grammar_error(grammars):
    g, _ = grammars
    with pytest.raises(GrammarError, match="tools"):
        g.grammar(_spec("required", tools=[{"name": "f", "parameters": {"type": "object", "$ref": "#/nowhere"}}]))


# -- the parser ----------------------------------------------------------------------------------
CALL = '<tool_call>{"name":"get_order_status","arguments":{"order_id":"SB123456"}}</tool_call>'


@pytest.mark.parametrize("piece", [1, 2, 5, 1000])
def test_calls_parse_the_same_whatever_the_deltas(piece):
    text = "Let me look. " + CALL + CALL.replace("SB123456", "SB654321")
    content, deltas, calls = _calls(text, piece=piece)
    assert content == "Let me look. "
    assert [c["function"]["arguments"] for c in calls] == ['{"order_id":"SB123456"}', '{"order_id":"SB654321"}']
    assert [c["id"] for c in calls] == ["call_0", "call_1"]
    firsts = [d for d in deltas if "id" in d]
    assert [(d["index"], d["function"]["name"], d["type"]) for d in firsts] == [
        (0, "get_order_status", "function"),
        (1, "get_order_status", "function"),
    ]
    for i, call in enumerate(calls):  # the deltas add up to each call's arguments
        assert "".join(d["function"]["arguments"] for d in deltas if d["index"] == i) == call["function"]["arguments"]


def test_text_that_only_looks_like_a_call_is_content():
    content, deltas, calls = _calls("a <tool> b <tool_call>{oops} <tool_cal")
    assert content == "a <tool> b <tool_call>{oops} <tool_cal" and calls == [] and deltas == []


def test_a_call_cut_by_the_length_keeps_its_arguments_so_far():
    content, _, calls = _calls(CALL[:60])
    assert content == "" and calls[0]["function"]["arguments"] == CALL[50:60]


def test_qwen2s_calls_are_parsed_with_their_separator():
    fmt = ToolFormat.of(ChatTemplate(QWEN, None, None))
    one = '<tool_call>\n{"name": "start_return", "arguments": {"order_id": "SB1", "reason": "damaged"}}\n</tool_call>'
    content, _, calls = _calls(one + "\n" + one, fmt, piece=3)
    assert content == "" and len(calls) == 2
    assert json.loads(calls[1]["function"]["arguments"]) == {"order_id": "SB1", "reason": "damaged"}


# -- the request ---------------------------------------------------------------------------------
def _b(x):
    return np.asarray([[x.encode() if isinstance(x, str) else x]], dtype=np.object_)


def _request(**inputs):
    return parse_chat_request(
        {k: _b(v if isinstance(v, str) else json.dumps(v)) for k, v in inputs.items()}, {}, Limits()
    )


OPENAI_TOOLS = [{"type": "function", "function": t} for t in TOOLS]
ASKED = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_order_status", "arguments": '{"order_id":"SB1"}'},
}


def test_tools_default_to_auto_and_history_may_hold_calls_and_results():
    history = [
        {"role": "user", "content": "where is SB1?"},
        {"role": "assistant", "content": None, "tool_calls": [ASKED]},
        {"role": "tool", "tool_call_id": "call_1", "content": "shipped"},
        {"role": "assistant", "content": "It shipped."},
    ]
    chat = _request(text="thanks", tools=OPENAI_TOOLS, history=history)
    assert chat.tool_choice == "auto" and chat.calls_tools and not chat.must_generate
    assert chat.history[1]["tool_calls"][0]["function"]["arguments"] == {"order_id": "SB1"}  # parsed for the template


BAD = [
    ({"tools": {"type": "function"}}, "tools: expected a JSON list"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]: expected"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name: required"),
    ({"tools": OPENAI_TOOLS + OPENAI_TOOLS[:1]}, "tools[2].function.name: 'get_order_status' is defined twice"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
        "must be an object",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(200)]},
        "200 tools is over the limit",
    ),
    ({"tool_choice": "required"}, "tool_choice: 'required' needs tools"),
    ({"tools": OPENAI_TOOLS, "tool_choice": "transfer"}, "tool_choice: 'transfer' is not one of the tools"),
    ({"tools": OPENAI_TOOLS, "tool_choice": '{"type": "function"}'}, "tool_choice: expected"),
    (
        {"tools": OPENAI_TOOLS, "response_format": '{"type": "json_object"}'},
        "response_format: not with tools",
    ),
    (
        {
            "tools": OPENAI_TOOLS,
            "history": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{**ASKED, "function": {"name": "delete_all", "arguments": "{}"}}],
                },
            ],
        },
        "history[1].tool_calls[0].function.name: 'delete_all' is not one of this request's tools",
    ),
    (
        {"history": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [ASKED]}]},
        "'get_order_status' is not one of this request's tools (none sent)",
    ),
    (
        {
            "tools": OPENAI_TOOLS,
            "history": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{**ASKED, "function": {"name": "get_order_status", "arguments": "{oops"}}],
                },
            ],
        },
        "history[1].tool_calls[0].function.arguments: not valid JSON",
    ),
    ({"tool_results": []}, "tool_results: expected a non-empty JSON list"),
    ({"tool_results": [{"tool_call_id": "c", "content": 5}]}, "tool_results[0].content: expected a string"),
    ({"tool_results": [{"tool_call_id": "c", "content": "x", "extra": 1}]}, "tool_results[0]: expected an object"),
]


@pytest.mark.parametrize("inputs, needle", BAD, ids=[b[1][:40] for b in BAD])
def test_bad_tools_are_refused_naming_the_problem(inputs, needle):
    with pytest.raises(RequestError) as e:
        _request(text="hi", **inputs)
    assert needle in str(e.value), str(e.value)


def test_tool_results_alone_are_a_turn_and_a_named_choice_must_generate():
    chat = _request(
        tools=OPENAI_TOOLS,
        tool_choice={"type": "function", "function": {"name": "start_return"}},
        tool_results=[{"tool_call_id": "call_1", "content": "ok"}],
    )
    assert chat.text == "" and (chat.tool_choice, chat.tool_name) == ("function", "start_return") and chat.must_generate
    assert chat.tool_results == ({"role": "tool", "tool_call_id": "call_1", "content": "ok"},)


def test_results_must_answer_the_last_answers_calls():
    asked = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [ASKED]}]
    check_tool_results(asked, ({"tool_call_id": "call_1"},))
    with pytest.raises(ValueError, match="'call_9' is not a call of the last answer"):
        check_tool_results(asked, ({"tool_call_id": "call_9"},))
    with pytest.raises(ValueError, match="it made none"):
        check_tool_results(asked[:1], ({"tool_call_id": "call_1"},))


# -- the prompt ----------------------------------------------------------------------------------
class Tok:
    def __init__(self):
        self.template = ChatTemplate(CHAT_TEMPLATE, "<|bos|>", END)

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_a_turn_of_results_extends_the_stored_conversation_and_the_window_drops_whole_turns():
    builder = PromptBuilder(Tok(), "S", max_turns=2, context_window=10_000)
    tools = tuple(OPENAI_TOOLS)
    first = builder.build(None, "where is SB1?", 8, tools=tools)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_order_status", "arguments": '{"order_id":"SB1"}'},
    }
    answer = "".join(
        chr(i)
        for i in Tok().encode('<tool_call>{"name":"get_order_status","arguments":{"order_id":"SB1"}}</tool_call>')
    )
    conv = PromptBuilder.after_answer(first, [ord(c) for c in answer] + [0], "", 0, [call])
    results = ({"role": "tool", "tool_call_id": "call_1", "content": "shipped"},)
    second = builder.build(conv, "", 8, tools=tools, tool_results=results)
    assert second.ids[: len(first.ids)] == first.ids and second.dropped_turns == 0
    assert "".join(map(chr, second.ids)).endswith("<tool_response>shipped</tool_response><|end|><|assistant|>")
    later = Conversation([*second.messages, {"role": "assistant", "content": "Shipped."}], [], 0)
    third = builder.build(later, "and SB2?", 8, tools=tools)
    fourth = builder.build(Conversation([*third.messages, {"role": "assistant", "content": "x"}]), "ok", 8, tools=tools)
    assert fourth.dropped_turns == 1 and fourth.messages[0] == {"role": "user", "content": "and SB2?"}


# -- the turn ------------------------------------------------------------------------------------
class Grammarless:
    """The grammar compiler a turn checks tools with (the pools hold the answer to it)."""

    def __init__(self):
        self.specs = []

    def grammar(self, spec):
        self.specs.append(spec)
        return "grammar"

    def shortest(self, spec):
        return 0 if spec["mode"] == "auto" else 12


def test_a_turn_streams_calls_apart_from_its_text_and_stores_them():
    from tests.unit.test_turn import EOT, Pools, Sessions, Sink, _answer, _turn

    pieces = ["Checking. ", CALL[:20], CALL[20:61], CALL[61:]]

    class ToolSink(Sink):
        def __init__(self):
            super().__init__()
            self.calls = []

        def tool_calls(self, deltas, priority):
            self.calls += deltas

    sessions, grammars, sink = Sessions(), Grammarless(), ToolSink()
    script = [_answer([0, 1]), _answer([2, 3, EOT], stats=EngineStats("stop", 5))]
    pools = Pools(engine_short=script, engine_long=script)
    turn = _turn(
        sessions, pools, decode=lambda ids: "".join(pieces[i] for i in ids if i < len(pieces)), grammars=grammars
    )
    turn.tool_format = default_format()
    chat = dataclass_replace(_request(text="where is SB123456?", tools=OPENAI_TOOLS), session_id="s1")
    turn.run(chat, sink, lambda: False, 0.0)
    assert sink.reply == "Checking. "
    assert [d.get("function", {}).get("name") for d in sink.calls if "id" in d] == ["get_order_status"]
    assert "".join(d["function"]["arguments"] for d in sink.calls) == '{"order_id":"SB123456"}'
    assert sink.stats["finish_reason"] == "tool_calls"
    spec = json.loads(pools.calls[0][1].response_format)  # what the pool holds the answer to
    assert spec["type"] == "tool_calls" and spec["mode"] == "auto" and len(spec["tools"]) == 2
    saved = sessions.saved[0][1]
    assert saved.messages[-1]["content"] == "Checking. "


def test_a_model_without_a_tool_format_refuses_tools_by_name():
    from tests.unit.test_turn import Pools, _turn

    turn = _turn(None, Pools(engine_short=[]), grammars=Grammarless())
    with pytest.raises(RequestError, match="tools: this model's chat template has no tool-call format"):
        turn.run(_request(text="hi", tools=OPENAI_TOOLS), None, lambda: False, 0.0)


def dataclass_replace(chat, **changes):
    import dataclasses

    return dataclasses.replace(chat, **changes)


def test_training_encodes_a_tool_conversation_as_the_template_renders_it(tmp_path):
    from switchboard.training.chat import tokenizer as tokmod
    from switchboard.training.chat.train import IGNORE, encode_conversation

    conv = [
        {"role": "tools", "content": "get_order_status,start_return"},
        {"role": "user", "content": "where is SB12345678?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "get_order_status", "arguments": {"order_id": "SB12345678"}}],
        },
        {"role": "tool", "content": '{"order_id":"SB12345678","status":"delivered"}'},
        {"role": "assistant", "content": "Order SB12345678 was delivered."},
    ]
    texts = [tokmod.message_text(m) for m in conv[1:]] * 5
    tok = tokmod.train_tokenizer(texts, 300, tmp_path, 512)
    ids = {"bos": tok.token_to_id(tokmod.BOS), "end": tok.token_to_id(tokmod.END)}
    ids.update({r.strip("<|>"): tok.token_to_id(r) for r in tokmod.ROLE_TOKENS})
    got, labels = encode_conversation(tok, conv, "S", ids, 10_000)

    as_served = [
        {**m, "tool_calls": [{"type": "function", "function": c} for c in m["tool_calls"]]} if "tool_calls" in m else m
        for m in conv[1:]
    ]
    tools = [{"type": "function", "function": {"name": n}} for n in conv[0]["content"].split(",")]
    rendered = ChatTemplate(tokmod.CHAT_TEMPLATE, tokmod.BOS, tokmod.END).render(
        [{"role": "system", "content": "S"}, *as_served], add_generation_prompt=False, tools=tools
    )
    assert got == tok.encode(rendered, add_special_tokens=False).ids
    trained = tok.decode([t for t, y in zip(got, labels) if y != IGNORE], skip_special_tokens=False)
    assert trained == (
        '<tool_call>{"name":"get_order_status","arguments":{"order_id":"SB12345678"}}</tool_call><|end|>'
        "Order SB12345678 was delivered.<|end|>"
    ), "the model learns the calls and the answers, not the results"

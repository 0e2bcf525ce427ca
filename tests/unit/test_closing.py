"""The texts that finish a cut JSON answer or tool call (switchboard/artifact/closing.py), from
many partial states: each case is the answer so far and the shortest closing it must get. Pure:
no grammar engine (tests/unit/test_grammar.py checks the closings against llguidance)."""

from __future__ import annotations

import json

import pytest

from switchboard.artifact.closing import JsonCursor, JsonFinish, ToolFinish, finisher, regex_example
from switchboard.artifact.tools import ToolFormat

ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}, "topic": {"type": "string"}}}
ANSWER["required"] = ["answer", "topic"]
ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^SB[0-9]{6}$"},
        "status": {"enum": ["processing", "shipped", "delivered"]},
        "eta_days": {"type": "integer", "minimum": 1, "maximum": 30},
        "urgent": {"type": "boolean"},
    },
    "required": ["order_id", "status", "eta_days"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku", "qty"],
            },
        },
        "note": {"type": "string", "minLength": 5},
    },
    "required": ["items"],
}
CHOICE = {
    "type": "object",
    "properties": {
        "b": {"anyOf": [{"type": "string", "minLength": 3}, {"type": "null"}]},
        "c": {"$ref": "#/$defs/point"},
        "d": {"type": ["string", "integer"]},
        "e": {"const": "fixed"},
        "f": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "string"}], "minItems": 2},
    },
    "required": ["b", "c", "d", "e", "f"],
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
}


def closings(schema, text: str | bytes, key_sep=":", item_sep=",") -> list[bytes]:
    fin = JsonFinish(schema, key_sep, item_sep)
    cur = fin.start()
    cur.feed(text if isinstance(text, bytes) else text.encode())
    return fin.closings(cur)


@pytest.mark.parametrize(
    "schema, text, want",
    [
        # a free-text string cut anywhere: closed, the required field after it added
        (ANSWER, '{"answer":"Go to Account Settings > Privacy > Pri', '","topic":""}'),
        (ANSWER, '{"answer":"', '","topic":""}'),
        (ANSWER, '{"answer":"line\\', 'n","topic":""}'),  # an escape cut after its backslash
        (ANSWER, '{"answer":"\\u00', '00","topic":""}'),  # \u cut after two hex digits
        (ANSWER, '{"answer":"say \\"hi\\"', '","topic":""}'),  # escaped quotes do not end it
        (ANSWER, '{"answer":"a","topic":"b', '"}'),
        # a key or a separator cut
        (ANSWER, "", '{"answer":"","topic":""}'),
        (ANSWER, "{", '"answer":"","topic":""}'),
        (ANSWER, '{"ans', 'wer":"","topic":""}'),
        (ANSWER, '{"answer"', ':"","topic":""}'),
        (ANSWER, '{"answer":', '"","topic":""}'),
        (ANSWER, '{"answer":"x",', '"topic":""}'),
        (ANSWER, '{"answer":"x","t', 'opic":""}'),
        (ANSWER, '{"answer":"x","topic":""', "}"),
        (ANSWER, '{"answer":"x","topic":""}', ""),
        # numbers, literals, enums, patterns (properties in the schema's order)
        (ORDER, "", '{"order_id":"SB000000","status":"shipped","eta_days":1}'),  # a pattern's example
        (ORDER, '{"order_id":"SB0', '","status":"shipped","eta_days":1}'),  # a pattern begun: the grammar walks it
        (ORDER, '{"order_id":"SB000000","status":"de', 'livered","eta_days":1}'),
        (ORDER, '{"order_id":"SB000000","status":"shipped","eta_days":-', "0}"),
        (ORDER, '{"order_id":"SB000000","status":"shipped","eta_days":1', "}"),
        (ORDER, '{"order_id":"SB000000","status":"shipped","eta_days":1.', "0}"),
        (ORDER, '{"order_id":"SB000000","status":"shipped","eta_days":1e', "0}"),
        (ORDER, '{"order_id":"SB000000","status":"shipped","eta_days":1,"urgent":tr', "ue}"),
        (ORDER, '{"order_id":"SB000000","status":"shipped","eta_days":1,"urgent":f', "alse}"),
        (ORDER, '{"order_id":"SB000000","status":"shipped","eta_days":1,', '"urgent":true}'),
        # nested: the item's required fields, the array's minItems, the outer object
        (NESTED, '{"items":[', '{"sku":"","qty":1}]}'),
        (NESTED, '{"items":[{"sku":"A', '","qty":1}]}'),
        (NESTED, '{"items":[{"sku":"A","qty":2', "}]}"),
        (NESTED, '{"items":[{"sku":"A","qty":2}', "]}"),
        (NESTED, '{"items":[{"sku":"A","qty":2},', '{"sku":"","qty":1}]}'),
        (NESTED, '{"items":[{"sku":"A","qty":2}],"note":"ab', 'aaa"}'),  # minLength 5 (or spaces)
        # anyOf (the shorter branch), $ref, a list of types, const, prefixItems with minItems
        (CHOICE, '{"b":', 'null,"c":{"x":0},"d":0,"e":"fixed","f":[true,""]}'),
        (CHOICE, '{"b":"x', 'aa","c":{"x":0},"d":0,"e":"fixed","f":[true,""]}'),
        (CHOICE, '{"b":null,"c":{"x":-', '0},"d":0,"e":"fixed","f":[true,""]}'),
        (CHOICE, '{"b":null,"c":{"x":1},"d":12', ',"e":"fixed","f":[true,""]}'),
        (CHOICE, '{"b":null,"c":{"x":1},"d":"","e":"fi', 'xed","f":[true,""]}'),
        (CHOICE, '{"b":null,"c":{"x":1},"d":"","e":"fixed","f":[false', ',""]}'),
        # any JSON object (json_object): its brackets, whatever is in it
        ({"type": "object"}, '{"a":[1,{"b":"c', '"}]}'),
        ({"type": "object"}, '{"a":[1,{"b":"c"}],', '"":0}'),
        ({"type": "object"}, '{"a":[tru', "e]}"),
    ],
)
def test_the_shortest_closing_of_a_cut_answer(schema, text, want):
    got = closings(schema, text)
    assert want.encode() in got and len(got[0]) == len(want), got  # a fill of spaces is as short
    whole = json.loads(text + got[0].decode())
    assert isinstance(whole, dict)


def test_a_character_cut_in_two_is_completed_before_the_string_closes():
    cut = '{"answer":"订单'.encode()[:-1]  # the last character's first two bytes of three
    got = closings(ANSWER, cut)[0]
    text = (cut + got).decode("utf-8")
    assert json.loads(text)["topic"] == "" and got.endswith(b'","topic":""}')


def test_a_key_that_begins_several_names_gives_each_way_shortest_first():
    schema = {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "order_note": {"type": "string", "minLength": 3}},
        "required": ["order_note"],
    }
    got = closings(schema, '{"order_')
    assert got[0] == b'note":"aaa"}', "order_note is required: order_id may come first, longer"
    assert b'id":"","order_note":"aaa"}' in got


def test_an_additional_property_key_is_closed_as_written():
    got = closings({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"zz')
    assert got[0] == b'":0}'


def test_tool_separators_with_spaces_are_completed_where_they_stopped():
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
    schema["required"] = ["a", "b"]
    assert closings(schema, '{"a": "x",', ": ", ", ")[0] == b' "b": 0}'
    assert closings(schema, '{"a": "x", ', ": ", ", ")[0] == b'"b": 0}'
    assert closings(schema, '{"a":', ": ", ", ")[0] == b' "", "b": 0}'


def test_what_no_rule_finishes_gives_no_closing():
    assert closings({"type": "object", "properties": {"a": {"not": {}}}, "required": ["a"]}, "{") != []
    recursive = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    assert closings(recursive, '{"next":{') == [], "a required recursion has no finite value"
    assert closings({"$ref": "https://elsewhere/schema.json"}, "") == []


def test_the_cursor_reads_where_the_value_ends_and_tokens_split_anywhere():
    text = b'{"a":"b\\"}","c":[1,-2.5e3,true,null,{}]}'
    whole = JsonCursor()
    assert whole.feed(text + b"</tool_call>") == len(text) and whole.done
    bytewise = JsonCursor()
    for i in range(len(text)):
        bytewise.feed(text[i : i + 1])
    assert bytewise.done and bytewise.stack == whole.stack
    number = JsonCursor()
    assert number.feed(b"12 ") == 2 and number.done, "a number ends at the byte after it"
    broken = JsonCursor()
    broken.feed(b'{"a" 1')
    assert broken.error and JsonFinish({}).closings(broken) == []


@pytest.mark.parametrize(
    "pattern, example",
    [("^SB[0-9]{6}$", "SB000000"), (r"^\d{3}-\d{2}$", "000-00"), ("^(yes|no)$", "no"), ("[A-Z]+x?", "A")],
)
def test_a_pattern_gets_its_shortest_example(pattern, example):
    assert regex_example(pattern) == example


def test_a_pattern_no_example_follows_gives_none():
    assert regex_example("^(?=a)b$") is None and regex_example("([") is None


# -- tool calls --------------------------------------------------------------------------------
COMPACT = ToolFormat('<tool_call>{"name":"', '","arguments":', "}</tool_call>", "")
HERMES = ToolFormat('<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>", "\n", ": ", ", ")
TOOLS = [
    {"name": "get_order_status", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}},
    {"name": "handover", "parameters": {"type": "object", "properties": {}}},
]  # fmt: skip


def tool_closings(fmt, mode, text, parallel=True) -> list[bytes]:
    fin = finisher({"type": "tool_calls", "mode": mode, "tools": TOOLS, "format": fmt.to_dict(), "parallel": parallel})
    assert isinstance(fin, ToolFinish)
    cur = fin.start()
    fin.feed(cur, text.encode())
    return fin.closings(cur)


@pytest.mark.parametrize(
    "fmt, mode, text, want",
    [
        (COMPACT, "auto", "", ""),  # free text may end anywhere
        (COMPACT, "auto", "Let me check. <tool_ca", ""),  # not a call until the whole trigger
        (COMPACT, "auto", "<tool_call>", '{"name":"handover","arguments":{}}</tool_call>'),
        (COMPACT, "auto", '<tool_call>{"name":"get', '_order_status","arguments":{"order_id":""}}</tool_call>'),
        (COMPACT, "auto", '<tool_call>{"name":"get_order_status","arguments":{"order_id":"SB1',
         '"}}</tool_call>'),
        (COMPACT, "auto", '<tool_call>{"name":"handover","arguments":{}}</tool', "_call>"),
        (COMPACT, "auto", '<tool_call>{"name":"handover","arguments":{}}</tool_call> Done', ""),
        (COMPACT, "required", "", '<tool_call>{"name":"handover","arguments":{}}</tool_call>'),
        (COMPACT, "required", '<tool_call>{"name":"handover","arguments":{}}</tool_call>', ""),
        (HERMES, "required", "<tool_call>\n{", '"name": "handover", "arguments": {}}\n</tool_call>'),
        (HERMES, "required", '<tool_call>\n{"name": "get_order_status", "arguments": {"order_id": "S',
         '"}}\n</tool_call>'),
        (HERMES, "required", '<tool_call>\n{"name": "handover", "arguments": {}}\n</tool_call>', ""),
        (HERMES, "required", '<tool_call>\n{"name": "handover", "arguments": {}}\n</tool_call>\n',
         '<tool_call>\n{"name": "handover", "arguments": {}}\n</tool_call>'),
        (HERMES, "auto", '<tool_call>\n{"name": "get_order_status", "arguments": {"order_id"',
         ': ""}}\n</tool_call>'),
    ],
)  # fmt: skip
def test_the_shortest_closing_of_a_cut_tool_call(fmt, mode, text, want):
    got = tool_closings(fmt, mode, text)
    assert got and got[0] == want.encode(), got


def test_one_call_per_answer_ends_after_its_call():
    text = '<tool_call>{"name":"handover","arguments":{}}</tool_call>'
    assert tool_closings(COMPACT, "required", text, parallel=False) == [b""]
    assert tool_closings(COMPACT, "required", text + "<", parallel=False) == [], "nothing may follow one call"


def test_a_string_held_to_a_pattern_or_format_is_known_as_such():
    fin = JsonFinish(NESTED | {"properties": {**NESTED["properties"], "when": {"type": "string", "format": "date"}}})
    for text, held in (('{"items":[{"sku":"A', False), ('{"items":[],"when":"20', True), ('{"items":[', False)):
        cur = fin.start()
        cur.feed(text.encode())
        assert fin.patterned(cur) == held, text
    tools = finisher({"type": "tool_calls", "mode": "required", "tools": [{"name": "f", "parameters": ORDER}],
                      "format": COMPACT.to_dict()})  # fmt: skip
    cur = tools.start()
    tools.feed(cur, b'<tool_call>{"name":"f","arguments":{"order_id":"SB1')
    assert tools.patterned(cur)

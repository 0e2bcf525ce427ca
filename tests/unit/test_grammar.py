"""Grammar-constrained decoding with llguidance: whatever the logits, the answer is valid JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from switchboard.artifact.grammar import MAX_SCHEMA_BYTES, GrammarError, Grammars, parse_spec
from tests.unit.bpe import byte_level_bpe

END = "<|end|>"
ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^SB[0-9]{6}$"},
        "status": {"enum": ["processing", "shipped", "delivered"]},
        "eta_days": {"type": "integer", "minimum": 0, "maximum": 30},
    },
    "required": ["order_id", "status", "eta_days"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def grammars(tmp_path_factory):
    texts = ['{"order_id": "SB123456", "status": "shipped", "eta_days": 3}', "Your order has shipped. 订单已发货"]
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok = byte_level_bpe(texts, path, vocab_size=400, special=END)
    width = tok.get_vocab_size() + 40  # a model's logits may be wider than its tokenizer
    return Grammars(path, width, tok.token_to_id(END)), tok


def decode_with_random_logits(grammars, spec, seed, max_tokens=200, bias=None):
    """The answer random logits give under ``spec``: (text, ids). ``bias(logits, ids)`` may
    change each step's logits before the grammar masks them."""
    g, tok = grammars
    c = g.matcher(spec)
    rng = np.random.default_rng(seed)
    ids = []
    while not c.finished and len(ids) < max_tokens:
        logits = rng.normal(size=g.width).astype(np.float32)
        if bias is not None:
            bias(logits, ids)
        assert c.mask(logits)
        assert np.isneginf(logits[g.vocab :]).all(), "no row past the tokenizer's ids"
        token = int(np.argmax(logits))
        assert c.accept(token)
        ids.append(token)
    return tok.decode(ids), ids


@pytest.mark.parametrize("seed", range(8))
def test_random_logits_under_a_schema_give_an_answer_that_validates(grammars, seed):
    text, _ = decode_with_random_logits(grammars, {"type": "json_schema", "schema": ORDER}, seed)
    answer = json.loads(text)
    assert set(answer) == {"order_id", "status", "eta_days"}
    assert answer["status"] in ORDER["properties"]["status"]["enum"] and 0 <= answer["eta_days"] <= 30
    assert len(answer["order_id"]) == 8 and answer["order_id"].startswith("SB") and answer["order_id"][2:].isdigit()


def test_json_object_gives_an_object(grammars):
    text, ids = decode_with_random_logits(grammars, {"type": "json_object"}, 0, max_tokens=2000)
    g, _ = grammars
    assert isinstance(json.loads(text), dict) and g.end_id not in ids


@pytest.mark.parametrize(
    "blob, problem",
    [
        ("nope", "not JSON"),
        ('{"type": "text"}', '"type" must be'),
        ('{"type": "json_schema"}', 'needs a "schema" object'),
        ('{"type": "json_schema", "schema": {"type": "wat"}}', "wat"),
        ('{"type": "json_schema", "schema": {"$ref": "#/missing"}}', "missing"),
        ('{"type": "json_schema", "schema": {"type": "object"}}' + " " * MAX_SCHEMA_BYTES, "bytes, more than"),
    ],
)
def test_a_schema_the_engine_cannot_use_is_refused_naming_the_problem(grammars, blob, problem):
    g, _ = grammars
    with pytest.raises(GrammarError, match=problem):
        g.matcher(parse_spec(blob))


def test_a_recursive_schema_works(grammars):
    node = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["id", "kids"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    g, tok = grammars
    c = g.matcher({"type": "json_schema", "schema": node})
    for token in tok.encode('{"id":1,"kids":[{"id":2,"kids":[]}]}').ids:
        logits = np.zeros(g.width, np.float32)
        assert c.mask(logits) and np.isfinite(logits[token]) and c.accept(token)
    assert c.finished
    c = g.matcher({"type": "json_schema", "schema": node})
    for token in tok.encode('{"id":1,"kids":[{"id":2}').ids:  # a nested node without its kids
        c.mask(np.zeros(g.width, np.float32))
        c.accept(token)
    assert c.finished and not c.mask(np.zeros(g.width, np.float32)), "broken: nothing allowed, the row ends"


def test_a_tokenizer_the_engine_cannot_read_is_a_clear_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(GrammarError, match="cannot constrain answers"):
        Grammars(tmp_path / "tokenizer.json", 100, 0)
    with pytest.raises(GrammarError, match="cannot constrain answers"):
        Grammars(tmp_path / "missing.json", 100, 0)


# -- finishing an answer the budget cuts -----------------------------------------------------------
FREE_TEXT = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "topic": {"type": "string", "minLength": 2}},
    "required": ["answer", "topic"],
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
        "when": {"type": "string", "format": "date"},
        "kind": {"anyOf": [{"enum": ["return", "refund"]}, {"type": "null"}]},
    },
    "required": ["items", "when", "kind"],
}
SCHEMAS = {"order": ORDER, "free_text": FREE_TEXT, "nested": NESTED, "object": None}


def spec_of(name):
    return {"type": "json_object"} if SCHEMAS[name] is None else {"type": "json_schema", "schema": SCHEMAS[name]}


def never_closes(logits, ids, g, tok):
    """The small models' failure: a string that is never closed (the quote always least likely)."""
    for token in range(g.vocab):
        if '"' in tok.decode([token]):
            logits[token] -= 50.0


@pytest.fixture(scope="module")
def quote_tokens(grammars):
    g, tok = grammars
    return [t for t in range(g.vocab) if b'"' in g.token_bytes(t)]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("seed", range(2))
def test_every_prefix_of_an_answer_has_a_finishing_that_validates(grammars, name, seed):
    import jsonschema

    g, tok = grammars
    _, ids = decode_with_random_logits(grammars, spec_of(name), seed, max_tokens=120)
    c = g.matcher(spec_of(name))
    for i, token in enumerate(ids):
        plan = c.finishing([])
        assert plan is not None, f"no finishing after {tok.decode(ids[:i])!r}"
        answer = json.loads(tok.decode(ids[:i] + plan))
        jsonschema.validate(answer, SCHEMAS[name] or {"type": "object"})
        assert c.accept(token)


def decode_with_budget(grammars, spec, seed, budget, quotes=(), start=""):
    """Random logits (``quotes`` less likely: strings go on) under ``spec`` with at most
    ``budget`` tokens, as the engine drives a row; the model's first choices spell ``start``:
    (text, ids, row)."""
    g, tok = grammars
    c = g.matcher(spec)
    rng = np.random.default_rng(seed)
    wanted = tok.encode(start).ids if start else []
    ids = []
    while not c.finished and len(ids) < budget:
        logits = rng.normal(size=g.width).astype(np.float32)
        logits[list(quotes)] -= 3.0
        if len(ids) < len(wanted) and ids == wanted[: len(ids)]:
            logits[wanted[len(ids)]] = 100.0
        assert c.mask(logits)
        token = c.choose(int(np.argmax(logits)), budget - len(ids))
        assert np.isfinite(logits[token]), "what is forced is what the grammar allows"
        assert c.accept(token)
        ids.append(token)
        if token == g.end_id:
            break
    return tok.decode([t for t in ids if t != g.end_id]), ids, c


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("extra", [0, 10, 40])
def test_an_answer_the_budget_ends_is_finished_and_validates(grammars, quote_tokens, name, extra):
    import jsonschema

    g, _ = grammars
    shortest = g.shortest(spec_of(name))
    assert shortest is not None
    budget = shortest + extra  # from exactly the shortest answer's tokens on
    for seed in range(3):
        text, ids, c = decode_with_budget(grammars, spec_of(name), seed, budget, quote_tokens)
        assert len(ids) <= budget
        jsonschema.validate(json.loads(text), SCHEMAS[name] or {"type": "object"})
        assert c.finished
        # cut: the engine wrote the end, from where the answer stood when the next token would
        # have left too little room (at most a member's worth of tokens before the budget's end)
        assert not c.cut or len(ids) > budget - 12, len(ids)


def test_without_a_budget_pressing_the_answer_is_the_models_own(grammars):
    free, _, _ = decode_with_budget(grammars, spec_of("order"), 0, 10**6)
    text, ids, c = decode_with_budget(grammars, spec_of("order"), 0, 200)
    assert text == free and not c.cut


def test_a_string_never_closed_is_cut_and_closed_at_the_budget(grammars, quote_tokens):
    g, tok = grammars
    text, ids, c = decode_with_budget(grammars, spec_of("free_text"), 1, 30, [t for t in quote_tokens] * 5)
    answer = json.loads(text)
    assert len(ids) == 30 and c.cut and len(answer["answer"]) > 5 and len(answer["topic"]) >= 2


def test_the_shortest_answer_counts_the_schemas_required_fields(grammars):
    g, tok = grammars
    assert g.shortest({"type": "json_object"}) == len(tok.encode("{}").ids)
    assert g.shortest(spec_of("free_text")) >= len(tok.encode('{"answer":"","topic":"aa"}').ids) // 2
    assert g.shortest(spec_of("free_text")) > g.shortest({"type": "json_object"})


TOOLS = [
    {"name": "get_order_status", "parameters": ORDER},
    {"name": "handover", "parameters": {"type": "object", "properties": {"why": {"type": "string"}}}},
]
COMPACT = {"begin": '<tool_call>{"name":"', "middle": '","arguments":', "end": "}</tool_call>", "sep": ""}


def parsed_calls(text):
    from switchboard.artifact.tools import ToolCallParser, ToolFormat

    fmt = ToolFormat.from_dict({**COMPACT, "key_separator": ":", "item_separator": ","})
    parser = ToolCallParser(fmt, {t["name"] for t in TOOLS})
    parser.feed(text)
    parser.flush()
    assert not parser.in_call, f"a call left open: {text!r}"
    return parser.calls


@pytest.mark.parametrize("extra", [0, 15, 50])
def test_a_required_tool_call_the_budget_ends_is_finished_and_parses(grammars, quote_tokens, extra):
    g, _ = grammars
    spec = {"type": "tool_calls", "mode": "required", "tools": TOOLS, "format": COMPACT, "parallel": True}
    budget = g.shortest(spec) + extra
    for seed in range(3):
        text, ids, c = decode_with_budget(grammars, spec, seed, budget, quote_tokens)
        calls = parsed_calls(text)
        assert len(ids) <= budget and calls
        for call in calls:
            json.loads(call["function"]["arguments"])


@pytest.mark.parametrize("budget", [20, 40, 60, 75, 120])
def test_a_call_begun_in_auto_mode_is_finished_or_never_begun(grammars, quote_tokens, budget):
    g, tok = grammars
    spec = {"type": "tool_calls", "mode": "auto", "tools": TOOLS, "format": COMPACT, "parallel": True}
    assert g.shortest(spec) == 0, "free text may end anywhere"
    start = "Let me look.<tool_call>"  # the model wants to call, whatever the room
    for seed in range(3):
        text, ids, c = decode_with_budget(grammars, spec, seed, budget, quote_tokens, start=start)
        calls = parsed_calls(text)  # none left open
        assert len(ids) <= budget
        if calls:
            assert text.startswith(start)
            for made in calls:
                json.loads(made["function"]["arguments"])
        else:
            assert "<tool_call>" not in text, "no room for a call: the text ends before it"
        if budget == 120:
            assert calls, "room for a call: it is written"
        if budget == 40 and len(tok.encode(start).ids) < 40:
            assert not calls and c.cut and ids[-1] == g.end_id, "the trigger refused: the answer ends"


def test_without_finishing_or_a_known_closing_the_budget_cuts_the_answer_as_before(grammars, quote_tokens):
    g, _ = grammars
    off = g.matcher(spec_of("free_text"), finish=False)
    assert off.finishing([]) is None and off.choose(5, 1) == 5 and not off.cut
    sevens = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 7, "minimum": 1}}}
    spec = {"type": "json_schema", "schema": {**sevens, "required": ["n"]}}
    assert g.shortest(spec) is None, "no rule here writes a multiple of 7: no budget to check against"
    text, ids, c = decode_with_budget(grammars, spec, 0, 3, quote_tokens)
    assert len(ids) == 3 and not c.cut and not c.finished


def test_properties_come_in_the_schemas_order_as_openai_writes_them(grammars):
    """The grammar follows the schema's order of properties, not an alphabetical one: a model
    trained to write order_id before status (as clients list them) is not forced to reorder.
    Through request parsing too: chat's response_format keeps the client's order."""
    from switchboard.serving.request import ChatRequest  # noqa: F401 - the module that re-serializes it

    g, tok = grammars
    spec = {"type": "json_schema", "schema": ORDER}  # order_id, status, eta_days: not sorted
    text, _, _ = decode_with_budget(grammars, spec, 0, 200)
    assert list(json.loads(text)) == ["order_id", "status", "eta_days"]
    reordered = {**ORDER, "properties": dict(reversed(list(ORDER["properties"].items())))}
    text, _, _ = decode_with_budget(grammars, {"type": "json_schema", "schema": reordered}, 0, 200)
    assert list(json.loads(text)) == ["eta_days", "status", "order_id"]

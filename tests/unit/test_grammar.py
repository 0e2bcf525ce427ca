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

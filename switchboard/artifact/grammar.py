"""Constrained decoding: each constrained row's next token limited to what its grammar allows.

A request may carry a constraint (a JSON schema, any JSON object, later a tool call's format);
the engine masks that row's logits before sampling and feeds the grammar the token it chose.
Rows without one pay nothing. The grammar engine is llguidance (Microsoft's, the one behind
vLLM's and SGLang's ``guidance`` backends): measured here on the default tokenizer it costs
12-14 us per token and compiles a schema lazily in 0.4-11 ms (a 300-field schema), with no
dependencies; xgrammar was faster per token (8.5-9.5 us) but needs torch, OpenAI's triton and
tvm-ffi, and outlines-core cannot express recursive schemas (docs/benchmarks.md, "Constrained
decoding").

``Grammars`` is one model version's compiler (its tokenizer, built once); ``Grammars.matcher``
gives a fresh ``RowConstraint`` per request. A schema the engine cannot use raises
``GrammarError`` naming the problem; the pool answers INVALID_ARG with it.

An answer the budget would cut is finished instead (``RowConstraint.choose``): the closings of
switchboard/artifact/closing.py, tokenized and accepted by the grammar before they are forced,
so a json_schema answer or a tool call parses whatever ``max_tokens`` is, and
``Grammars.shortest`` is the least budget that allows (docs/chat-contract.md, "Answers the
budget cuts").
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from switchboard.artifact.closing import finisher
from switchboard.artifact.tools import ToolFormat, ToolFormatError

MAX_SCHEMA_BYTES = 64 * 1024  # a bigger schema is refused, not compiled


class GrammarError(ValueError):
    """The schema or grammar cannot constrain decoding; the message says why."""


def parse_spec(blob: bytes | str) -> dict:
    """A request's constraint as JSON: ``{"type": "json_object"}``, ``{"type": "json_schema",
    "schema": {...}}`` or ``{"type": "tool_calls", "mode": "auto"|"required", "tools": [{"name",
    "parameters"}], "format": ToolFormat, "parallel": bool}``; GrammarError when it is none."""
    if len(blob) > MAX_SCHEMA_BYTES:
        raise GrammarError(f"response format: {len(blob)} bytes, more than the {MAX_SCHEMA_BYTES} allowed")
    try:
        spec = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as e:
        raise GrammarError(f"response format: not JSON ({e})") from None
    if not isinstance(spec, dict) or spec.get("type") not in ("json_object", "json_schema", "tool_calls"):
        raise GrammarError('response format: "type" must be "json_object", "json_schema" or "tool_calls"')
    if spec["type"] == "json_schema" and not isinstance(spec.get("schema"), dict):
        raise GrammarError('response format: json_schema needs a "schema" object')
    if spec["type"] == "tool_calls":
        tools = spec.get("tools")
        if (
            spec.get("mode") not in ("auto", "required")
            or not isinstance(spec.get("format"), dict)
            or not isinstance(tools, list)
            or not tools
            or not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools)
            or not all(isinstance(t.get("parameters", {}), dict) for t in tools)
        ):
            raise GrammarError(
                'response format: tool_calls needs "mode", "format" and "tools" [{"name", "parameters"}]'
            )
        try:
            ToolFormat.from_dict(spec["format"])
        except ToolFormatError as e:
            raise GrammarError(f"response format: {e}") from None
    return spec


# Within this many tokens of a budget's end, a closing's tokens are counted (tokenized and checked
# against the grammar); farther away its bytes bound them (a token is at least one byte).
NEAR = 16
WALK_BYTES = 48  # a string a closing cannot name (a pattern, a format) is finished byte by byte, at most this far
# the bytes a string is finished with, most wanted first: the closing quote, then what patterns ask for
WALK_ORDER = b'"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_.: @/+'


class Grammars:
    """Grammar compilation for one model: its tokenizer (``tokenizer.json``), the width of its
    logits (rows past the tokenizer's ids are never allowed) and the token that ends an answer."""

    def __init__(self, tokenizer_json: Path, logits_width: int, end_id: int):
        import llguidance  # only where constraints are used: the pools

        self._ll = llguidance
        try:
            text = Path(tokenizer_json).read_text(encoding="utf-8")
            self.tokenizer = llguidance.LLTokenizer(text, eos_token=end_id)
        except (OSError, ValueError, RuntimeError) as e:
            raise GrammarError(f"response_format: this model's tokenizer cannot constrain answers ({e})") from None
        self.vocab = self.tokenizer.vocab_size
        self.width = logits_width
        self.end_id = end_id
        self._cache: dict[str, tuple[str, object]] = {}  # key -> (grammar, its finisher)
        self._shortest: dict[str, int | None] = {}
        self._bytes: dict[int, bytes] = {}
        self._special = {
            t["content"] for t in json.loads(text).get("added_tokens", []) if t.get("special") and "content" in t
        }
        self.walk_tokens = [
            (b, ids[0]) for b in WALK_ORDER if len(ids := self.tokenizer.tokenize_bytes(bytes((b,)))) == 1
        ]

    def special(self, text: str) -> bool:
        """``text`` is one of the tokenizer's special tokens (a tool-call tag may be one)."""
        return text in self._special

    def token_bytes(self, token: int) -> bytes:
        """What ``token`` writes (a special token: its text)."""
        out = self._bytes.get(token)
        if out is None:
            out = self.tokenizer.decode_bytes([token])
            if out[:1] == b"\xff" and self.tokenizer.is_special_token(token):
                out = out[1:]  # llguidance may mark a special token's text with a 0xFF byte
            self._bytes[token] = out
        return out

    @staticmethod
    def _key(spec: dict) -> tuple[str, str]:
        if spec["type"] == "tool_calls":
            return json.dumps(spec), "tools"
        schema = {"type": "object"} if spec["type"] == "json_object" else spec["schema"]
        return json.dumps(schema), "json_schema"

    def grammar(self, spec: dict) -> str:
        """The grammar for a parsed spec (``parse_spec``), checked; GrammarError otherwise."""
        return self._compiled(spec)[0]

    def _compiled(self, spec: dict) -> tuple[str, object]:
        """(grammar, finisher) of a parsed spec; the finisher reads the schema as the grammar
        was compiled from it (the same order of properties)."""
        key, where = self._key(spec)
        if key in self._cache:
            return self._cache[key]
        try:
            if spec["type"] == "tool_calls":
                fmt = ToolFormat.from_dict(spec["format"])
                lark = fmt.grammar(spec["tools"], spec["mode"], spec.get("parallel", True), self.special(fmt.trigger))
                grammar = self._ll.LLMatcher.grammar_from_lark(lark)
                finish = finisher(spec)
            else:
                grammar = self._ll.LLMatcher.grammar_from_json_schema(key, defaults={"whitespace_flexible": False})
                finish = finisher({"type": "json_schema", "schema": json.loads(key)})
        except ValueError as e:
            raise GrammarError(f"{where}: {e}") from None
        error = self._ll.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error and not error.startswith("WARNING"):
            raise GrammarError(f"{where}: {error}")
        if len(self._cache) >= 256:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = (grammar, finish)
        return grammar, finish

    def matcher(self, spec: dict, finish: bool = True) -> RowConstraint:
        """A row's constraint; ``finish`` False: one the budget cuts where it ends (as before
        finishing existed: ``perf.json_finish --no-finish`` measures the difference)."""
        grammar, finisher_ = self._compiled(spec)
        m = self._ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise GrammarError(f"{'tools' if spec['type'] == 'tool_calls' else 'json_schema'}: {m.get_error()}")
        return RowConstraint(m, self, finisher_ if finish else None)

    def shortest(self, spec: dict) -> int | None:
        """Tokens in the shortest whole answer ``spec`` allows on this model (None: no closing
        rule finishes it, so a budget cannot be checked against it)."""
        key = self._key(spec)[0]
        if key not in self._shortest:
            row = self.matcher(spec)
            plan = row.finishing([])
            if len(self._shortest) >= 256:
                self._shortest.pop(next(iter(self._shortest)))
            self._shortest[key] = None if plan is None else len(plan)
        return self._shortest[key]


class RowConstraint:
    """One row's grammar state: ``mask`` before sampling, ``choose`` (what the budget leaves
    room for) and ``accept`` after.

    The budget: each ``choose`` gets the tokens the row may still write, this one included.
    The sampled token is kept while the answer can still be finished after it in the tokens
    left; otherwise the row writes the shortest finishing of where it stands instead, a token
    a step (``cut``: the answer ends with finish_reason ``length``). A finishing is a closing
    text (``switchboard.artifact.closing``: the string cut and closed, the required fields
    and the brackets closed) that the grammar accepted token by token, so what is forced is
    valid by construction; a string no closing can name (a pattern, a format) is finished
    byte by byte, each byte one the grammar allows (``WALK_ORDER``). Far from the end (more
    than ``NEAR`` tokens to spare) a closing's bytes bound its tokens and nothing is checked:
    the cost there is following the text (``JsonCursor``), a few microseconds a token."""

    def __init__(self, matcher, grammars: Grammars, finish=None):
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        self._m = matcher
        self._g = grammars
        self._fill = fill_next_token_bitmask
        self._bits = allocate_token_bitmask(1, grammars.vocab)
        self.vocab, self.width = grammars.vocab, grammars.width
        self._finish = finish
        self._cursor = finish.start() if finish is not None else None
        self._plan: list[int] = []  # the finishing being written, token by token
        self._after: tuple[int, object] | None = None  # (token, the cursor after it) from choose
        self.cut = False  # the budget ended the answer: the engine wrote its finishing

    def mask(self, logits: np.ndarray) -> bool:
        """Set the logits of the tokens the grammar forbids to -inf, in place; False when it
        allows none (an error state)."""
        if self._m.is_error():
            return False
        self._fill(self._m, self._bits, 0)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.vocab].astype(bool)
        logits[: self.vocab][~allowed] = -np.inf
        logits[self.vocab :] = -np.inf
        return bool(allowed.any())

    def choose(self, token: int, budget: int) -> int:
        """The token to write instead of the sampled ``token`` (itself, or the next of the
        finishing) when the row may write ``budget`` more tokens, this one included."""
        if self._cursor is None:
            return token
        if self._plan:
            return self._plan[0]
        if token == self._g.end_id or self._m.is_error():
            return token
        room = budget - 1  # after this token
        after = self._cursor.copy()
        self._finish.feed(after, self._g.token_bytes(token))
        self._after = (token, after)
        texts = self._finish.closings(after)
        if texts and len(texts[0]) + NEAR <= room:
            # a string held to a pattern is finished byte by byte: more room than its closing's bytes
            if len(texts[0]) + NEAR + WALK_BYTES <= room or not self._finish.patterned(after):
                return token
        elif not texts and room > NEAR + WALK_BYTES:
            return token  # no closing rule here: the grammar is asked only near the end
        fits = self._finishing([token], after)
        if fits is not None and len(fits) <= room:
            return token
        now = self.finishing([])
        if now is None:
            return token  # no known way to finish it: the budget cuts it, as without this
        if fits is None and room > len(now) + NEAR:
            return token  # past this token no closing is known; there is room for one to be again
        self._plan, self._after, self.cut = now or [self._g.end_id], None, True
        return self._plan[0]

    def accept(self, token: int) -> bool:
        """Feed the chosen token; False if the grammar refused it."""
        ok = bool(self._m.consume_token(token)) and not self._m.is_error()
        if self._cursor is not None:
            if self._plan:
                self._plan.pop(0)
            if self._after is not None and self._after[0] == token:
                self._cursor = self._after[1]
            elif token != self._g.end_id:
                self._finish.feed(self._cursor, self._g.token_bytes(token))
            self._after = None
        return ok

    def finishing(self, prefix: list[int], cursor=None) -> list[int] | None:
        """The shortest known tokens that finish the answer after ``prefix`` (tokens not yet
        accepted; ``cursor``: where the text stands after them), each accepted by the grammar;
        None when none is known."""
        return self._finishing(prefix, self._cursor if cursor is None else cursor)

    def _finishing(self, prefix: list[int], cursor) -> list[int] | None:
        if self._finish is None:
            return None
        m = self._m.deep_copy()
        if prefix and m.try_consume_tokens(prefix) != len(prefix):
            return None
        best = self._checked(m, self._finish.closings(cursor))
        if best is None and self._finish.in_string(cursor):
            best = self._walk(m, cursor)
        return best

    def _checked(self, m, texts: list[bytes]) -> list[int] | None:
        """The fewest tokens among ``texts`` the grammar (``m``) accepts to an end."""
        best = None
        for text in texts:
            tokens = self._g.tokenizer.tokenize_bytes(text) if text else []
            if best is not None and len(tokens) >= len(best):
                continue
            c = m.deep_copy()
            if c.try_consume_tokens(tokens) == len(tokens) and c.is_accepting():
                best = tokens
        return best

    def _walk(self, m, cursor) -> list[int] | None:
        """Finish the string under way a byte at a time, each the first of ``WALK_ORDER`` the
        grammar allows (a pattern's digits, a format's separators), then close the rest."""
        m, cur, walked = m.deep_copy(), cursor.copy(), []
        for _ in range(WALK_BYTES):
            tokens = m.compute_ff_tokens()  # bytes the grammar forces come as its own tokens for them
            if not tokens:
                bits = m.compute_bitmask()
                pick = next((t for _, t in self._g.walk_tokens if bits[t >> 3] >> (t & 7) & 1), None)
                tokens = [] if pick is None else [pick]
            if not tokens or not m.consume_tokens(tokens):
                return None
            walked += tokens
            for t in tokens:
                self._finish.feed(cur, self._g.token_bytes(t))
            if not self._finish.in_string(cur):
                rest = self._checked(m, self._finish.closings(cur))
                return None if rest is None else walked + rest
        return None

    @property
    def finished(self) -> bool:
        """Complete (only the end of the answer may follow), or broken."""
        return self._m.is_stopped() or self._m.is_error()

    @property
    def error(self) -> str:
        return self._m.get_error() if self._m.is_error() else ""

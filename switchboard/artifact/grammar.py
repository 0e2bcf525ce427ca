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
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

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
        self._cache: dict[str, str] = {}
        self._special = {
            t["content"] for t in json.loads(text).get("added_tokens", []) if t.get("special") and "content" in t
        }

    def special(self, text: str) -> bool:
        """``text`` is one of the tokenizer's special tokens (a tool-call tag may be one)."""
        return text in self._special

    def grammar(self, spec: dict) -> str:
        """The grammar for a parsed spec (``parse_spec``), checked; GrammarError otherwise."""
        if spec["type"] == "tool_calls":
            key = json.dumps(spec, sort_keys=True)
            where = "tools"
        else:
            key = json.dumps({"type": "object"} if spec["type"] == "json_object" else spec["schema"], sort_keys=True)
            where = "json_schema"
        if key in self._cache:
            return self._cache[key]
        try:
            if spec["type"] == "tool_calls":
                fmt = ToolFormat.from_dict(spec["format"])
                lark = fmt.grammar(spec["tools"], spec["mode"], spec.get("parallel", True), self.special(fmt.trigger))
                grammar = self._ll.LLMatcher.grammar_from_lark(lark)
            else:
                grammar = self._ll.LLMatcher.grammar_from_json_schema(key, defaults={"whitespace_flexible": False})
        except ValueError as e:
            raise GrammarError(f"{where}: {e}") from None
        error = self._ll.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error and not error.startswith("WARNING"):
            raise GrammarError(f"{where}: {error}")
        if len(self._cache) >= 256:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = grammar
        return grammar

    def matcher(self, spec: dict) -> RowConstraint:
        m = self._ll.LLMatcher(self.tokenizer, self.grammar(spec), log_level=0)
        if m.is_error():
            raise GrammarError(f"{'tools' if spec['type'] == 'tool_calls' else 'json_schema'}: {m.get_error()}")
        return RowConstraint(m, self.vocab, self.width)


class RowConstraint:
    """One row's grammar state: ``mask`` before sampling, ``accept`` after."""

    def __init__(self, matcher, vocab: int, width: int):
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        self._m = matcher
        self._fill = fill_next_token_bitmask
        self._bits = allocate_token_bitmask(1, vocab)
        self.vocab, self.width = vocab, width

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

    def accept(self, token: int) -> bool:
        """Feed the chosen token; False if the grammar refused it."""
        return bool(self._m.consume_token(token)) and not self._m.is_error()

    @property
    def finished(self) -> bool:
        """Complete (only the end of the answer may follow), or broken."""
        return self._m.is_stopped() or self._m.is_error()

    @property
    def error(self) -> str:
        return self._m.get_error() if self._m.is_error() else ""

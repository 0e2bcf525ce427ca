"""The public ``chat`` request as a typed, validated object.

Everything a client can send is checked here, before any work: the Triton glue turns a
``RequestError`` into ``INVALID_ARG`` with this message. Nothing here knows Triton.
"""

from __future__ import annotations

import json
import math
import unicodedata
from dataclasses import dataclass

import numpy as np

from switchboard.artifact.grammar import MAX_SCHEMA_BYTES, GrammarError, parse_spec
from switchboard.wire import MAX_TOP_LOGPROBS, PRIORITY_DEFAULT, PRIORITY_PARAMETER, Chat


class RequestError(ValueError):
    """The client sent something invalid; the message names what."""


@dataclass(frozen=True)
class Limits:
    max_text_bytes: int = 16384
    max_session_id_bytes: int = 256
    default_max_new_tokens: int = 96
    max_new_tokens: int = 512
    priority_levels: int = 2
    max_history_bytes: int = 131072  # the JSON of ``history``
    max_history_messages: int = 256


@dataclass(frozen=True)
class ChatRequest:
    text: str
    session_id: str | None
    max_new_tokens: int
    temperature: float
    top_p: float
    priority: int
    seed: int | None = None
    # Stateless chats (``history`` instead of ``session_id``): the conversation before ``text``
    # (user and assistant messages) and the client's system prompt (None: the server's).
    history: tuple[dict, ...] | None = None
    system: str | None = None
    # What the answer must be (``parse_spec``'s form, as JSON); None: free text. The schema
    # itself is checked against the model's tokenizer when the chat is served.
    response_format: str | None = None
    logprobs: int = -1  # -1: none; 0-5: each token's log-probability and that many alternatives


def _one(name: str, array: np.ndarray | None):
    if array is None:
        return None
    if array.size != 1:
        raise RequestError(
            f"{name}: expected exactly one value, got shape {list(array.shape)} (send one message per request)"
        )
    return array.reshape(-1)[0]


_KEPT_CONTROLS = "\t\n\r"


def _is_dropped_control(c: str) -> bool:
    return unicodedata.category(c) == "Cc" and c not in _KEPT_CONTROLS


def without_controls(text: str) -> str:
    """``text`` without control characters other than tab, CR and LF. What a message says is
    normalized, never refused for them: OpenAI's API accepts them, and a conversation sent back
    may hold one an earlier answer wrote."""
    if not any(_is_dropped_control(c) for c in text):
        return text
    return "".join(c for c in text if not _is_dropped_control(c))


def _utf8(name: str, value, max_bytes: int, controls: str = "refuse") -> str:
    """``controls``: "refuse" (identifiers) or "drop" (what a message says)."""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
    if not isinstance(value, (bytes, bytearray, np.bytes_)):
        raise RequestError(f"{name}: expected BYTES (UTF-8 text)")
    value = bytes(value)
    if len(value) > max_bytes:
        raise RequestError(f"{name}: {len(value)} bytes is over the limit of {max_bytes}")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"{name}: not valid UTF-8 (byte {e.start})") from None
    if controls == "drop":
        text = without_controls(text)
    bad = next((c for c in text if _is_dropped_control(c)), None)
    if bad is not None:
        raise RequestError(f"{name}: contains control character U+{ord(bad):04X}")
    if unicodedata.category(text[:1] or "a") == "Cs":
        raise RequestError(f"{name}: not valid UTF-8")
    return text


def check_text(name: str, value: str | bytes, max_bytes: int) -> str:
    """``value`` held to the rules of ``text`` (UTF-8, at most ``max_bytes``), control
    characters other than tab/CR/LF dropped; ``RequestError`` naming ``name`` otherwise. For
    front ends (the HTTP gateway) that check what they will send before sending it."""
    return _utf8(name, value, max_bytes, controls="drop")


def _number(name: str, value, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    if value is None:
        return default
    out = float(value)
    if not math.isfinite(out) or out > hi or out < lo or (lo_open and out == lo):
        bracket = "(" if lo_open else "["
        raise RequestError(f"{name}: {out} is outside {bracket}{lo}, {hi}]")
    return out


def _int_param(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise RequestError(f"parameter {name}: expected an integer in [{lo}, {hi}]")
    try:
        out = int(value)
    except ValueError:
        raise RequestError(f"parameter {name}: expected an integer in [{lo}, {hi}]") from None
    if not lo <= out <= hi:
        raise RequestError(f"parameter {name}: {out} is outside [{lo}, {hi}]")
    return out


def parse_chat_request(inputs: dict[str, np.ndarray | None], parameters: dict, limits: Limits) -> ChatRequest:
    raw_text = _one(Chat.TEXT, inputs.get(Chat.TEXT))
    if raw_text is None:
        raise RequestError("text: required input is missing")
    text = _utf8("text", raw_text, limits.max_text_bytes, controls="drop")
    if not text.strip():
        raise RequestError("text: empty message")

    session_id = None
    raw_session = _one(Chat.SESSION_ID, inputs.get(Chat.SESSION_ID))
    if raw_session is not None:
        session_id = _utf8("session_id", raw_session, limits.max_session_id_bytes)
        if not session_id:
            raise RequestError("session_id: empty (omit it for a one-off chat)")

    raw_max = _one(Chat.MAX_NEW_TOKENS, inputs.get(Chat.MAX_NEW_TOKENS))
    max_new = limits.default_max_new_tokens if raw_max is None else int(raw_max)
    if not 1 <= max_new <= limits.max_new_tokens:
        raise RequestError(f"max_new_tokens: {max_new} is outside [1, {limits.max_new_tokens}]")

    temperature = _number("temperature", _one(Chat.TEMPERATURE, inputs.get(Chat.TEMPERATURE)), 0.0, 0.0, 2.0)
    top_p = _number("top_p", _one(Chat.TOP_P, inputs.get(Chat.TOP_P)), 1.0, 0.0, 1.0, lo_open=True)

    # Triton's own request priority is not visible to a Python model in 2.51, so clients
    # send the same value as the request parameter `chat_priority` (the SDK does both).
    priority = PRIORITY_DEFAULT
    if PRIORITY_PARAMETER in parameters:
        priority = _int_param(PRIORITY_PARAMETER, parameters[PRIORITY_PARAMETER], 1, limits.priority_levels)
    seed = _int_param("seed", parameters["seed"], 0, 2**32 - 1) if "seed" in parameters else None
    history, system = None, None
    raw_history = _one(Chat.HISTORY, inputs.get(Chat.HISTORY))
    if raw_history is not None:
        if session_id is not None:
            raise RequestError(
                "history: send either session_id (the server keeps the conversation) or history, not both"
            )
        history, system = parse_history(_utf8("history", raw_history, limits.max_history_bytes), limits)
    response_format = None
    raw_format = _one(Chat.RESPONSE_FORMAT, inputs.get(Chat.RESPONSE_FORMAT))
    if raw_format is not None:
        try:
            spec = parse_spec(_utf8("response_format", raw_format, MAX_SCHEMA_BYTES))
        except GrammarError as e:
            raise RequestError(str(e)) from None
        response_format = json.dumps(spec, ensure_ascii=False, sort_keys=True)
    logprobs = -1
    raw_logprobs = _one(Chat.LOGPROBS, inputs.get(Chat.LOGPROBS))
    if raw_logprobs is not None:
        logprobs = int(raw_logprobs)
        if not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(f"logprobs: {logprobs} is outside [0, {MAX_TOP_LOGPROBS}] (alternatives per token)")
    return ChatRequest(
        text, session_id, max_new, temperature, top_p, priority, seed, history, system, response_format, logprobs
    )


def parse_history(blob: str, limits: Limits) -> tuple[tuple[dict, ...], str | None]:
    """``history`` (JSON: ``[{"role": ..., "content": ...}, ...]``) as (user and assistant
    messages, the system prompt or None). A system message may only come first; every content
    is text held to the rules of ``text``. Parsed as JSON data only, never evaluated."""
    try:
        messages = json.loads(blob)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"history: not valid JSON ({str(e).split(':')[0]})") from None
    if not isinstance(messages, list):
        raise RequestError('history: expected a JSON list of {"role": ..., "content": ...}')
    if len(messages) > limits.max_history_messages:
        raise RequestError(f"history: {len(messages)} messages is over the limit of {limits.max_history_messages}")
    system, out = None, []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise RequestError(f'history[{i}]: expected an object with exactly "role" and "content"')
        role, content = m["role"], m["content"]
        if role not in ("system", "user", "assistant"):
            raise RequestError(f"history[{i}].role: {str(role)[:32]!r} is not system, user or assistant")
        if not isinstance(content, str):
            raise RequestError(f"history[{i}].content: expected a string")
        content = _utf8(f"history[{i}].content", content, limits.max_text_bytes, controls="drop")
        if role == "system":
            if i != 0:
                raise RequestError(f"history[{i}]: a system message may only come first")
            system = content
        else:
            out.append({"role": role, "content": content})
    return tuple(out), system

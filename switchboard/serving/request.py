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
from switchboard.artifact.tools import MAX_TOOLS, NAME
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
    # The functions the answer may call (OpenAI's definitions, checked), how (``auto``, ``none``,
    # ``required``, or ``function`` with ``tool_name``), and the last answer's calls' results
    # ({"tool_call_id", "content"}) that come before ``text``.
    tools: tuple[dict, ...] = ()
    tool_choice: str = "none"
    tool_name: str | None = None
    tool_results: tuple[dict, ...] = ()
    # OpenAI's repetition control (-2 to 2), over the answer's own tokens, in the pool's engine
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def must_generate(self) -> bool:
        """The answer is held to a form (a schema, a tool to call): the FAQ cannot give it."""
        return self.response_format is not None or self.tool_choice in ("required", "function")

    @property
    def calls_tools(self) -> bool:
        """The answer may call a tool (and is parsed for calls)."""
        return bool(self.tools) and self.tool_choice != "none"


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
    raw_results = _one(Chat.TOOL_RESULTS, inputs.get(Chat.TOOL_RESULTS))
    tool_results = () if raw_results is None else parse_tool_results(raw_results, limits)
    raw_text = _one(Chat.TEXT, inputs.get(Chat.TEXT))
    if raw_text is None and not tool_results:
        raise RequestError("text: required input is missing (or send tool_results)")
    text = "" if raw_text is None else _utf8("text", raw_text, limits.max_text_bytes, controls="drop")
    if not text.strip() and not tool_results:
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
    presence = _number(
        "presence_penalty", _one(Chat.PRESENCE_PENALTY, inputs.get(Chat.PRESENCE_PENALTY)), 0.0, -2.0, 2.0
    )
    frequency = _number(
        "frequency_penalty", _one(Chat.FREQUENCY_PENALTY, inputs.get(Chat.FREQUENCY_PENALTY)), 0.0, -2.0, 2.0
    )

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
    tools = parse_tools(_one(Chat.TOOLS, inputs.get(Chat.TOOLS)))
    tool_choice, tool_name = parse_tool_choice(_one(Chat.TOOL_CHOICE, inputs.get(Chat.TOOL_CHOICE)), tools)
    names = {t["function"]["name"] for t in tools}
    for i, m in enumerate(history or ()):
        for j, call in enumerate(m.get("tool_calls", ())):
            if call["function"]["name"] not in names:
                raise RequestError(
                    f"history[{i}].tool_calls[{j}].function.name: {call['function']['name']!r} is not one of "
                    f"this request's tools ({', '.join(sorted(names)) or 'none sent'})"
                )
    response_format = None
    raw_format = _one(Chat.RESPONSE_FORMAT, inputs.get(Chat.RESPONSE_FORMAT))
    if raw_format is not None:
        try:
            spec = parse_spec(_utf8("response_format", raw_format, MAX_SCHEMA_BYTES))
        except GrammarError as e:
            raise RequestError(str(e)) from None
        response_format = json.dumps(spec, ensure_ascii=False)
        if tools and tool_choice != "none":
            raise RequestError('response_format: not with tools (send tool_choice "none", or one of them)')
    logprobs = -1
    raw_logprobs = _one(Chat.LOGPROBS, inputs.get(Chat.LOGPROBS))
    if raw_logprobs is not None:
        logprobs = int(raw_logprobs)
        if not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(f"logprobs: {logprobs} is outside [0, {MAX_TOP_LOGPROBS}] (alternatives per token)")
    return ChatRequest(
        text,
        session_id,
        max_new,
        temperature,
        top_p,
        priority,
        seed,
        history,
        system,
        response_format,
        logprobs,
        tools,
        tool_choice,
        tool_name,
        tool_results,
        presence,
        frequency,
    )


def _loads(name: str, text: str):
    """``text`` as JSON data (never evaluated); RequestError naming ``name`` otherwise."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"{name}: not valid JSON ({str(e).split(':')[0]})") from None


def _json(name: str, raw, max_bytes: int):
    return _loads(name, _utf8(name, raw, max_bytes))


def parse_tools(raw) -> tuple[dict, ...]:
    """``tools`` (OpenAI's function definitions, JSON) checked: unique names of letters, digits,
    _ and -, parameters a JSON Schema object; what the template and the grammar get."""
    if raw is None:
        return ()
    tools = _json("tools", raw, MAX_SCHEMA_BYTES)
    if not isinstance(tools, list):
        raise RequestError('tools: expected a JSON list of {"type": "function", "function": {...}}')
    if len(tools) > MAX_TOOLS:
        raise RequestError(f"tools: {len(tools)} tools is over the limit of {MAX_TOOLS}")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise RequestError(f'tools[{i}]: expected {{"type": "function", "function": {{"name", ...}}}}')
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise RequestError(f"tools[{i}].function.name: required, letters, digits, _ and - (at most 64)")
        if name in seen:
            raise RequestError(f"tools[{i}].function.name: {name!r} is defined twice")
        seen.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise RequestError(f"tools[{i}].function.parameters: expected a JSON Schema object")
        if params.get("type", "object") != "object":
            raise RequestError(f'tools[{i}].function.parameters: the arguments must be an object ("type": "object")')
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise RequestError(f"tools[{i}].function.description: expected a string")
        clean = {"name": name, "parameters": params}
        if description:
            clean["description"] = description
        out.append({"type": "function", "function": clean})
    return tuple(out)


def parse_tool_choice(raw, tools: tuple[dict, ...]) -> tuple[str, str | None]:
    """(``auto`` | ``none`` | ``required`` | ``function``, the function's name). Without tools
    only ``none`` (or nothing) is allowed."""
    names = [t["function"]["name"] for t in tools]
    if raw is None:
        return ("auto" if tools else "none"), None
    choice = _utf8("tool_choice", raw, 4096).strip()
    name = None
    if choice.startswith("{"):
        spec = _json("tool_choice", choice, 4096)
        fn = spec.get("function") if isinstance(spec, dict) else None
        if not isinstance(fn, dict) or spec.get("type") != "function" or not isinstance(fn.get("name"), str):
            raise RequestError('tool_choice: expected "auto", "none", "required" or {"type": "function", ...}')
        name = fn["name"]
    elif choice not in ("auto", "none", "required"):
        name = choice
    if name is not None:
        if name not in names:
            raise RequestError(
                f"tool_choice: {name[:64]!r} is not one of the tools ({', '.join(names) or 'none sent'})"
            )
        return "function", name
    if choice != "none" and not tools:
        raise RequestError(f"tool_choice: {choice!r} needs tools")
    return choice, None


def parse_tool_results(raw, limits: Limits) -> tuple[dict, ...]:
    results = _json("tool_results", raw, limits.max_history_bytes)
    if not isinstance(results, list) or not results:
        raise RequestError('tool_results: expected a non-empty JSON list of {"tool_call_id", "content"}')
    if len(results) > MAX_TOOLS:
        raise RequestError(f"tool_results: {len(results)} results is over the limit of {MAX_TOOLS}")
    out = []
    for i, r in enumerate(results):
        if not isinstance(r, dict) or set(r) != {"tool_call_id", "content"}:
            raise RequestError(f'tool_results[{i}]: expected an object with exactly "tool_call_id" and "content"')
        if not isinstance(r["tool_call_id"], str) or not r["tool_call_id"]:
            raise RequestError(f"tool_results[{i}].tool_call_id: expected the call's id")
        content = _utf8(
            f"tool_results[{i}].content",
            _text(r["content"], f"tool_results[{i}].content"),
            limits.max_text_bytes,
            controls="drop",
        )
        out.append({"role": "tool", "tool_call_id": r["tool_call_id"], "content": content})
    return tuple(out)


def _text(value, name: str) -> str:
    if not isinstance(value, str):
        raise RequestError(f"{name}: expected a string")
    return value


def _tool_calls(where: str, calls) -> list[dict]:
    """An assistant message's ``tool_calls`` (OpenAI's) with the arguments parsed (a template
    renders them as JSON)."""
    if not isinstance(calls, list) or not calls or len(calls) > MAX_TOOLS:
        raise RequestError(f"{where}: expected a list of 1 to {MAX_TOOLS} calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(call.get("id"), str) or not isinstance(fn.get("name"), str):
            raise RequestError(
                f'{where}[{j}]: expected {{"id", "type": "function", "function": {{"name", "arguments"}}}}'
            )
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise RequestError(f"{where}[{j}].function.arguments: not valid JSON") from None
        if not isinstance(args, dict):
            raise RequestError(f"{where}[{j}].function.arguments: expected a JSON object")
        out.append({"id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def parse_history(blob: str, limits: Limits) -> tuple[tuple[dict, ...], str | None]:
    """``history`` (JSON: ``[{"role": ..., "content": ...}, ...]``) as (user and assistant
    messages, the system prompt or None). A system message may only come first; every content
    is text held to the rules of ``text``. Parsed as JSON data only, never evaluated."""
    messages = _loads("history", blob)
    if not isinstance(messages, list):
        raise RequestError('history: expected a JSON list of {"role": ..., "content": ...}')
    if len(messages) > limits.max_history_messages:
        raise RequestError(f"history: {len(messages)} messages is over the limit of {limits.max_history_messages}")
    system, out = None, []
    calls: set[str] = set()  # the ids of the last answer's calls, which tool messages answer
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not {"role", "content"} <= set(m):
            raise RequestError(f'history[{i}]: expected an object with "role" and "content"')
        role, content = m["role"], m["content"]
        extra = set(m) - {"role", "content"}
        allowed = {"assistant": {"tool_calls"}, "tool": {"tool_call_id"}}.get(role, set())
        if role not in ("system", "user", "assistant", "tool"):
            raise RequestError(f"history[{i}].role: {str(role)[:32]!r} is not system, user, assistant or tool")
        if extra - allowed:
            raise RequestError(f"history[{i}]: field {sorted(extra - allowed)[0][:32]!r} is not supported")
        if content is None and role == "assistant" and m.get("tool_calls"):
            content = ""
        if not isinstance(content, str):
            raise RequestError(f"history[{i}].content: expected a string")
        content = _utf8(f"history[{i}].content", content, limits.max_text_bytes, controls="drop")
        if role == "system":
            if i != 0:
                raise RequestError(f"history[{i}]: a system message may only come first")
            system = content
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if call_id not in calls:
                raise RequestError(
                    f"history[{i}].tool_call_id: {str(call_id)[:64]!r} is not a call of the answer before it"
                )
            out.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif m.get("tool_calls"):
            made = _tool_calls(f"history[{i}].tool_calls", m["tool_calls"])
            calls = {c["id"] for c in made}
            out.append({"role": role, "content": content, "tool_calls": made})
        else:
            calls = set()
            out.append({"role": role, "content": content})
    return tuple(out), system

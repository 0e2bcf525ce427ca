"""OpenAI Chat Completions requests, checked and turned into one chat call
(``CompletionCall``: the last user message as ``text``, everything before it as ``history``).
Refusals are OpenAI's errors (``APIError``, 400 with the parameter's name). Pure functions and
dataclasses: no HTTP, no gRPC; the answer's side is ``openai_response``.

A last user message of audio (OpenAI's ``input_audio`` content part: base64 and a format) makes
the call a voice chat (``voice_chat``: the audio transcribed, the transcript answered).

Stateless like OpenAI's API: the client sends the whole conversation every time. ``chat``
builds the prompt from it with the model's chat template; the pools find the KV of its longest
stored prefix by content (16-token blocks keyed by the token ids), so turn 2 reuses turn 1's
prompt and answer without any session, and ``usage.prompt_tokens_details.cached_tokens`` says
how many prompt tokens that was.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass

from switchboard.client import ChatRequest, VoiceRequest
from switchboard.gateway.errors import APIError, bad_request
from switchboard.serving.request import Limits, RequestError, check_text
from switchboard.wire import MAX_TOP_LOGPROBS

LIMITS = Limits()  # chat's own limits on each message (its defaults; chat checks again)
MAX_MESSAGES = 257  # chat keeps a history of at most 256 messages, plus the new one
MAX_STOP = 4  # as OpenAI
MAX_STOP_CHARS = 256
SEED_MAX = 2**32 - 1

# Accepted with these values only (what clients send by default); anything else is refused by name.
NEUTRAL = {
    "n": (1,),
    "logit_bias": ({},),
    "functions": ([],),
    "function_call": ("none",),
    "modalities": (["text"],),
}
# Accepted and ignored (hints for OpenAI's own service).
IGNORED = {
    "user": str,
    "safety_identifier": str,
    "metadata": dict,
    "store": bool,
    "service_tier": str,
    "parallel_tool_calls": bool,
    "prompt_cache_key": str,
}
KNOWN = {
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "seed",
    "response_format",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    *NEUTRAL,
    *IGNORED,
}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
TOOL_CHOICES = ("auto", "none", "required")
# input_audio's formats: OpenAI's ("wav", "mp3") and the containers the recognizer reads; the
# server reads the format from the bytes, so this only refuses what cannot be audio it decodes.
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "opus", "webm", "m4a", "mp4", "mpeg", "mpga")
LANGUAGE = re.compile(r"^[a-z]{2,3}$")


@dataclass(frozen=True)
class AudioPart:
    """A message's ``input_audio``: the file's bytes, its declared format, an optional language
    (a Switchboard extension: ``input_audio.language``, e.g. "zh"; none: the recognizer detects it)."""

    data: bytes
    format: str
    language: str | None = None


@dataclass(frozen=True)
class CompletionCall:
    """One chat completion request, checked, as ``chat`` takes it."""

    model: str
    text: str
    history: list[dict]  # {"role", "content"}; a system message first when the client sent one
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"  # the field that set it (error messages name it)
    temperature: float | None = None
    top_p: float | None = None
    # OpenAI's repetition control (-2 to 2; None: 0), applied per row in the pool's engine
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    user: str | None = None
    audio: AudioPart | None = None  # the last user message as audio: a voice chat (``text`` is "")
    # chat's response_format (``{"type": "json_object"}`` or ``{"type": "json_schema", "schema":
    # ...}``); None: text
    response_format: dict | None = None
    logprobs: int | None = None  # with ``logprobs: true``: ``top_logprobs`` (0-5); None: not asked
    tools: list[dict] | None = None  # OpenAI's, as sent (chat checks them)
    tool_choice: str | dict | None = None
    # the tool messages that end the conversation ({"tool_call_id", "content"}): this turn's input
    tool_results: list[dict] | None = None

    def chat_request(self, priority: int) -> ChatRequest | VoiceRequest:
        """The SDK's request for this call: a voice turn when the last message is audio."""
        turn = dict(
            priority=priority,
            max_new_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            history=self.history,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
        )
        if self.audio is not None:
            return VoiceRequest(self.audio.data, language=self.audio.language, **turn)
        return ChatRequest(
            None if self.tool_results else self.text,  # a turn of tool results has no new text
            response_format=self.response_format,
            logprobs=self.logprobs,
            tools=self.tools,
            tool_choice=self.tool_choice,
            tool_results=self.tool_results,
            **turn,
        )


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad_request("request body: not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("request body: expected a JSON object")
    return body


def check_language(value, where: str, param: str) -> str | None:
    """An ISO-639-1 code ("en", "zh"; ISO-639-3 too), lowercased; None for none."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not LANGUAGE.match(value.strip().lower()):
        raise bad_request(f"{where}: expected a language code such as 'en' or 'zh' (ISO-639-1)", param)
    return value.strip().lower()


def _audio_part(where: str, part: dict, max_audio_bytes: int) -> AudioPart:
    audio = part.get("input_audio")
    where = f"{where}.input_audio"
    if not isinstance(audio, dict):
        raise bad_request(f'{where}: expected an object {{"data": base64, "format": "wav"}}', "messages")
    for key in audio:
        if key not in ("data", "format", "language"):
            raise bad_request(f"{where}: field {key[:32]!r} is not supported", "messages")
    data, fmt = audio.get("data"), audio.get("format")
    if not isinstance(data, str) or not data:
        raise bad_request(f"{where}.data: required (the audio file, base64)", "messages")
    if fmt is not None and (not isinstance(fmt, str) or fmt.lower() not in AUDIO_FORMATS):
        shown = json.dumps(fmt)[:32]
        raise bad_request(f"{where}.format: {shown} is not supported (one of {', '.join(AUDIO_FORMATS)})", "messages")
    if len(data) > 4 * -(-max_audio_bytes // 3):
        raise APIError(
            413, f"{where}.data: the audio is over the limit of {max_audio_bytes} bytes", "messages", "audio_too_large"
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(
            f"{where}.data: not valid base64 (the file's bytes, without a data: URL prefix)", "messages"
        ) from None
    if not raw:
        raise bad_request(f"{where}.data: empty audio", "messages", "empty")
    return AudioPart(
        raw, (fmt or "wav").lower(), check_language(audio.get("language"), f"{where}.language", "messages")
    )


def _content(i: int, content, max_audio_bytes: int) -> tuple[str, AudioPart | None]:
    """A message's text (a string, or a list of text parts, joined), or its audio (one
    ``input_audio`` part, alone)."""
    where = f"messages[{i}].content"
    audio = None
    if isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise bad_request(f'{where}[{j}]: expected an object with a "type"', "messages")
            if part["type"] == "input_audio":
                if audio is not None or parts:
                    raise bad_request(f"{where}[{j}]: an input_audio part must be the message's only part", "messages")
                audio = _audio_part(f"{where}[{j}]", part, max_audio_bytes)
                continue
            if part["type"] != "text":
                raise bad_request(
                    f"{where}[{j}]: type {part['type'][:32]!r} is not supported "
                    "(text only; input_audio in the last user message)",
                    "messages",
                )
            if audio is not None:
                raise bad_request(f"{where}[{j}]: an input_audio part must be the message's only part", "messages")
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{where}[{j}].text: expected a string", "messages")
            parts.append(part["text"])
    else:
        raise bad_request(f"{where}: expected a string or a list of text parts", "messages")
    if audio is not None:
        return "", audio
    text = "".join(parts)
    try:
        return check_text(where, text, LIMITS.max_text_bytes), None
    except RequestError as e:
        raise bad_request(str(e), "messages") from None


def parse_messages(messages) -> tuple[str, list[dict]]:
    """(the last user message, the conversation before it) of OpenAI's ``messages``. System
    and developer messages may open the conversation (joined into one system prompt); messages
    in a row from one role are joined, so ``chat`` gets alternating turns."""
    conv = parse_conversation(messages)
    return conv.text, conv.history


@dataclass(frozen=True)
class Conversation:
    """``messages`` as chat takes them: the new user message (``text``, "" when the turn is
    tool results), the messages before it, the tool results that end it, a last message's audio."""

    text: str
    history: list[dict]
    audio: AudioPart | None = None
    tool_results: list[dict] | None = None


def _calls(i: int, calls, tools: set[str] | None) -> list[dict]:
    """An assistant message's ``tool_calls``, checked against the request's tools."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list) or not calls:
        raise bad_request(f"{where}: expected a non-empty list of calls", "messages")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(call.get("id"), str) or not isinstance(fn.get("name"), str):
            raise bad_request(
                f'{where}[{j}]: expected {{"id", "type": "function", "function": {{"name", "arguments"}}}}', "messages"
            )
        if fn["name"] not in (tools or ()):
            known = ", ".join(sorted(tools)) if tools else "none sent"
            raise bad_request(
                f"{where}[{j}].function.name: {fn['name'][:64]!r} is not one of the request's tools ({known})",
                "messages",
            )
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            raise bad_request(f"{where}[{j}].function.arguments: expected a string (JSON)", "messages")
        try:
            parsed = json.loads(args)
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, dict):
            raise bad_request(f"{where}[{j}].function.arguments: not valid JSON (an object)", "messages")
        out.append({"id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def parse_conversation(messages, max_audio_bytes: int = 25 << 20, tools: set[str] | None = None) -> Conversation:
    """``messages`` checked: a voice chat asks with audio only in its last message (the turns
    before are text: a client keeps their transcripts); an answer's ``tool_calls`` name the
    request's ``tools``; ``tool`` messages answer the calls of the answer before them."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages: expected a non-empty list of messages", "messages")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"messages: {len(messages)} messages is over the limit of {MAX_MESSAGES}", "messages")
    system: list[str] = []
    turns: list[dict] = []
    audio = None
    calls: set[str] = set()  # the ids of the last answer's calls
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}]: expected an object", "messages")
        role = m.get("role")
        if not isinstance(role, str):
            raise bad_request(f"messages[{i}].role: required (one of {', '.join(ROLES)})", "messages")
        if role not in ROLES:
            raise bad_request(
                f"messages[{i}].role: {role[:32]!r} is not supported (one of {', '.join(ROLES)})", "messages"
            )
        allowed = {"assistant": ("tool_calls",), "tool": ("tool_call_id",)}.get(role, ())
        for key in m:
            if key in ("role", "content", "name", *allowed):
                continue
            if key in ("tool_calls", "function_call", "audio", "refusal") and m[key] is None:
                continue
            raise bad_request(f"messages[{i}]: field {key[:32]!r} is not supported", "messages")
        made = _calls(i, m["tool_calls"], tools) if role == "assistant" and m.get("tool_calls") else None
        if made and m.get("content") is None:
            content, part = "", None
        elif "content" not in m or m["content"] is None:
            raise bad_request(f"messages[{i}].content: required", "messages")
        else:
            content, part = _content(i, m["content"], max_audio_bytes)
        role = ROLES[role]
        if part is not None:
            if role != "user" or i != len(messages) - 1:
                raise bad_request(
                    f"messages[{i}]: audio (input_audio) is taken in the last message only, a user's", "messages"
                )
            if turns and turns[-1]["role"] == "user":
                raise bad_request(
                    f"messages[{i}]: an audio message must follow an assistant's (not another user message)",
                    "messages",
                )
            audio = part
        if role == "system":
            if turns:
                raise bad_request(
                    f"messages[{i}]: a {m['role']} message after the conversation started is not supported", "messages"
                )
            system.append(content)
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise bad_request(
                    f"messages[{i}].tool_call_id: {str(call_id)[:64]!r} is not a call of the answer before it",
                    "messages",
                )
            turns.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif made:
            calls = {c["id"] for c in made}
            turns.append({"role": role, "content": content, "tool_calls": made})
        elif turns and turns[-1]["role"] == role and "tool_calls" not in turns[-1]:
            turns[-1]["content"] += "\n\n" + content
        else:
            calls = set()
            turns.append({"role": role, "content": content})
    head = [{"role": "system", "content": "\n\n".join(system)}] if system else []
    if turns and turns[-1]["role"] == "tool":
        n = len(turns)
        while turns[n - 1]["role"] == "tool":
            n -= 1
        results = [{"tool_call_id": t["tool_call_id"], "content": t["content"]} for t in turns[n:]]
        return Conversation("", head + turns[:n], None, results)
    if not turns or turns[-1]["role"] != "user":
        raise bad_request("messages: the last message must be the user's (role 'user') or a tool's", "messages")
    return Conversation(turns[-1]["content"], head + turns[:-1], audio)


def _tools(body: dict) -> tuple[list[dict] | None, str | dict | None, set[str]]:
    """``tools`` and ``tool_choice`` in OpenAI's shapes (what is in them, chat checks), and the
    names the tools give (what an answer in the history may have called)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise bad_request('tools: expected a list of {"type": "function", "function": {...}}', "tools")
    if choice is not None:
        named = isinstance(choice, dict) and isinstance(choice.get("function"), dict)
        if not (choice in TOOL_CHOICES or (named and choice.get("type") == "function")):
            raise bad_request(
                'tool_choice: expected "auto", "none", "required" or {"type": "function", "function": {"name"}}',
                "tool_choice",
            )
    names = {t["function"].get("name") for t in tools or () if isinstance(t.get("function"), dict)}
    return tools or None, choice, names


def _optional_number(body: dict, name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_number(v) or not math.isfinite(v):
        raise bad_request(f"{name}: expected a number", name)
    return float(v)


def _penalty(body: dict, name: str) -> float | None:
    v = _optional_number(body, name)
    if v is not None and not -2.0 <= v <= 2.0:
        raise bad_request(f"{name}: {v:g} is outside [-2, 2]", name)
    return v


def _stop(v) -> tuple[str, ...]:
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("stop: expected a string or a list of strings", "stop")
    if len(stops) > MAX_STOP:
        raise bad_request(f"stop: {len(stops)} sequences is over the limit of {MAX_STOP}", "stop")
    if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_request(f"stop: each sequence must have 1 to {MAX_STOP_CHARS} characters", "stop")
    return tuple(stops)


def parse_request(body: dict, served_model: str, max_audio_bytes: int = 25 << 20) -> CompletionCall:
    """``body`` (a JSON object) checked against what this gateway serves; ``APIError`` (400, or
    404 for another model, 413 for audio over ``max_audio_bytes``) naming the field otherwise."""
    for key in body:
        if key not in KNOWN:
            raise bad_request(f"Unrecognized request argument supplied: {key[:64]}", key[:64])
    for key, allowed in NEUTRAL.items():
        v = body.get(key)
        if v is not None and not any(v == a and type(v) is type(a) for a in allowed):
            raise bad_request(f"{key}: {json.dumps(v)[:64]} is not supported", key)
    for key, kind in IGNORED.items():
        if body.get(key) is not None and not isinstance(body[key], kind):
            raise bad_request(f"{key}: expected a {kind.__name__}", key)

    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model: required (a string)", "model")
    if model != served_model:
        raise APIError(
            404,
            f"The model {model[:64]!r} does not exist (this gateway serves {served_model!r})",
            "model",
            "model_not_found",
        )
    tools, tool_choice, names = _tools(body)
    conv = parse_conversation(body.get("messages"), max_audio_bytes, names)
    text, history, audio = conv.text, conv.history, conv.audio
    if audio is not None and tools and tool_choice != "none":
        raise bad_request("tools: not with an audio message (voice answers are text)", "tools")

    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("stream: expected true or false", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad_request("stream_options: only allowed when stream is true", "stream_options")
        if not isinstance(options, dict) or any(k not in ("include_usage", "include_obfuscation") for k in options):
            raise bad_request('stream_options: expected {"include_usage": true|false}', "stream_options")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise bad_request("stream_options.include_usage: expected true or false", "stream_options")

    max_tokens, max_param = None, "max_tokens"
    for name in ("max_tokens", "max_completion_tokens"):
        v = body.get(name)
        if v is None:
            continue
        if not _is_int(v) or v < 1:
            raise bad_request(f"{name}: expected an integer of at least 1", name)
        if max_tokens is not None and v != max_tokens:
            raise bad_request("max_tokens and max_completion_tokens differ: send one", name)
        max_tokens, max_param = v, name

    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed <= SEED_MAX):
        raise bad_request(f"seed: expected an integer in [0, {SEED_MAX}]", "seed")
    logprobs = _logprobs(body.get("logprobs"), body.get("top_logprobs"))
    response_format = _response_format(body.get("response_format"))
    if response_format is not None and audio is not None:
        raise bad_request("response_format: not with an audio message (voice answers are text)", "response_format")
    return CompletionCall(
        model=model,
        text=text,
        history=history,
        stream=bool(stream),
        include_usage=include_usage,
        max_tokens=max_tokens,
        max_tokens_param=max_param,
        temperature=_optional_number(body, "temperature"),
        top_p=_optional_number(body, "top_p"),
        presence_penalty=_penalty(body, "presence_penalty"),
        frequency_penalty=_penalty(body, "frequency_penalty"),
        stop=_stop(body.get("stop")),
        seed=seed,
        user=body.get("user"),
        audio=audio,
        response_format=response_format,
        logprobs=logprobs,
        tools=tools,
        tool_choice=tool_choice,
        tool_results=conv.tool_results,
    )


def _logprobs(asked, top) -> int | None:
    if asked is not None and not isinstance(asked, bool):
        raise bad_request("logprobs: expected true or false", "logprobs")
    if top is None:
        return 0 if asked else None
    if not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise bad_request(f"top_logprobs: expected an integer in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs")
    if not asked:
        raise bad_request("top_logprobs: only with logprobs true", "top_logprobs")
    return top


SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _response_format(value) -> dict | None:
    """OpenAI's ``response_format`` as chat's: text (None), any JSON object, or JSON matching
    ``json_schema.schema`` (always enforced, ``strict`` or not); 400 naming the field otherwise.
    Whether the schema itself can be used, chat decides (its grammar engine; a 400 naming why)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad_request('response_format: expected an object with a "type"', "response_format")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise bad_request(
            f"response_format.type: {kind[:32]!r} is not one of text, json_object, json_schema", "response_format"
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("response_format.json_schema: required (an object)", "response_format")
    name = spec.get("name")
    if not isinstance(name, str) or not SCHEMA_NAME.match(name):
        raise bad_request(
            "response_format.json_schema.name: required, letters, digits, _ and - (at most 64)", "response_format"
        )
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise bad_request("response_format.json_schema.schema: expected a JSON Schema object", "response_format")
    if "strict" in spec and not isinstance(spec["strict"], bool):
        raise bad_request("response_format.json_schema.strict: expected true or false", "response_format")
    return {"type": "json_schema", "schema": schema}

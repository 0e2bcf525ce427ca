"""What the SDK sends, written once for both transports: a ``ChatRequest`` (or ``VoiceRequest``)
holds a turn's options, and becomes a ``Call``: the model, its input tensors, the outputs to
ask for, the request parameters, the routing header and the decoder of its responses. The
synchronous transport hands a call to tritonclient's stream, the asyncio one encodes it with
``switchboard.codec``.

Priority contract: ``priority=1`` (live/VIP) or ``2`` (default). The SDK sets Triton's
request priority, which orders the queue of the ``chat`` model, and sends the same value as
the request parameter ``chat_priority``, which the pipeline carries to the engine's
scheduler (Python models in Triton 2.51 cannot read Triton's priority).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np
from tritonclient.grpc import service_pb2

from switchboard.client.events import ChatError, asr_decoder, chat_decoder, voice_decoder
from switchboard.codec import build_request
from switchboard.wire import PRIORITY_PARAMETER, SESSION_HEADER, TRACE_PARAMETER, Asr, Chat, Pool

_ids = itertools.count()

CHAT_OUTPUTS = (Chat.TEXT_OUTPUT, Chat.STATS)
SCORED_OUTPUTS = (*CHAT_OUTPUTS, Chat.LOGPROBS_OUTPUT)  # asked only with logprobs: older servers lack it

# (name, value, numpy dtype, Triton datatype): one input, sent as a [1, 1] tensor
Input = tuple[str, object, type, str]

_FITS = {"INT32": struct.Struct("<i").pack, "FP32": struct.Struct("<f").pack}


def tensor(name: str, value, dtype, datatype: str) -> np.ndarray:
    """One input as its ``[1, 1]`` array; a number its datatype cannot hold is the caller's
    error (INVALID_ARGUMENT), not a value numpy wraps or rounds to infinity."""
    if datatype in _FITS:
        try:
            _FITS[datatype](value)
        except (struct.error, OverflowError):
            raise ChatError(f"{name}: {value!r} does not fit {datatype}", "INVALID_ARGUMENT") from None
    return np.asarray([[value]], dtype=dtype)


def _blob(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


def session_headers(session_id) -> dict | None:
    """The header the balancer hashes to keep a session on one replica (switchboard.ops.balancer):
    a digest of the session id, so any id (newlines, any script, any length) makes a valid HTTP/2
    header and the id itself stays out of the balancer's logs."""
    if session_id is None:
        return None
    raw = session_id if isinstance(session_id, bytes) else session_id.encode("utf-8", "surrogatepass")
    return {SESSION_HEADER: hashlib.sha256(raw).hexdigest()[:32]}


def audio_inputs(audio, language=None) -> list[Input]:
    """``asr``'s inputs: the audio file's bytes as they are (the server decodes WAV, FLAC, OGG...)
    and, when given, its language ("en", "zh"; none: detected, or the recognizer's only one)."""
    if not isinstance(audio, (bytes, bytearray, memoryview)):
        raise TypeError(f"audio: expected the file's bytes, got {type(audio).__name__}")
    inputs = [(Asr.AUDIO, bytes(audio), np.object_, "BYTES")]
    if language:
        inputs.append((Asr.LANGUAGE, language.encode("utf-8"), np.object_, "BYTES"))
    return inputs


@dataclass(frozen=True)
class Call:
    """One request as a transport sends it: ``inputs`` become ``[1, 1]`` tensors when the
    request is built (at the first event: a value that does not fit fails there, as the
    server's refusals do); ``decode`` turns each response's outputs into events; ``pooled``: it
    may go on a stream the asyncio transport keeps for the next request."""

    model: str
    inputs: list[Input]
    outputs: tuple[str, ...]
    priority: int
    parameters: dict
    headers: dict | None
    decode: Callable[[dict[str, bytes]], tuple[list, bool]]
    pooled: bool = True

    def tensors(self) -> dict[str, np.ndarray]:
        return {name: tensor(name, value, dtype, datatype) for name, value, dtype, datatype in self.inputs}

    def message(self) -> service_pb2.ModelInferRequest:
        """The request as the protobuf message of Triton's gRPC API (``switchboard.codec``)."""
        return build_request(
            self.model, self.tensors(), self.outputs, self.parameters, int(self.priority), request_id=request_id()
        )


def request_id() -> str:
    return f"{os.getpid()}-{next(_ids)}"


def transcribe_call(
    model: str, audio, language=None, priority: int = 2, deltas: bool = True, traceparent: str | None = None
) -> Call:
    """``asr`` on an audio file; ``deltas`` False: the ``AsrResult`` alone (``Asr.DELTAS``);
    ``traceparent``: a W3C trace context the server's spans join."""
    inputs = audio_inputs(audio, language)  # a wrong type fails here, not at the first event
    parameters = {PRIORITY_PARAMETER: int(priority)} | ({} if deltas else {Asr.DELTAS: False})
    if traceparent:
        parameters[TRACE_PARAMETER] = str(traceparent)
    return Call(model, inputs, Asr.OUTPUTS, priority, parameters, None, asr_decoder, pooled=False)


@dataclass(frozen=True, kw_only=True)
class Turn:
    """The options of a turn, typed or spoken. ``history`` (instead of ``session_id``): the
    conversation before it (``[{"role": "system" | "user" | "assistant", "content": str}, ...]``),
    kept by the caller. ``presence_penalty``, ``frequency_penalty`` (-2 to 2): OpenAI's
    repetition control, over the answer's own tokens."""

    session_id: str | bytes | None = None
    priority: int = 2
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    history: list[dict] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    traceparent: str | None = None  # a W3C trace context the server's spans join (docs/tracing.md)

    @classmethod
    def of(cls, first, **options):
        """``first`` as a request: itself with ``options`` replaced, or the request it is the
        first field of (the text of a chat, the audio of a voice turn)."""
        if isinstance(first, cls):
            return dataclasses.replace(first, **options) if options else first
        return cls(first, **options)

    def turn_inputs(self) -> list[Input]:
        inputs = []
        if self.session_id is not None:
            sid = self.session_id if isinstance(self.session_id, bytes) else self.session_id.encode("utf-8")
            inputs.append((Chat.SESSION_ID, sid, np.object_, "BYTES"))
        for name, value, dtype, datatype in (
            (Chat.MAX_NEW_TOKENS, self.max_new_tokens, np.int32, "INT32"),
            (Chat.TEMPERATURE, self.temperature, np.float32, "FP32"),
            (Chat.TOP_P, self.top_p, np.float32, "FP32"),
            (Chat.PRESENCE_PENALTY, self.presence_penalty, np.float32, "FP32"),
            (Chat.FREQUENCY_PENALTY, self.frequency_penalty, np.float32, "FP32"),
        ):
            if value is not None:
                inputs.append((name, value, dtype, datatype))
        if self.history is not None:
            inputs.append((Chat.HISTORY, _blob(list(self.history)), np.object_, "BYTES"))
        return inputs

    def parameters(self) -> dict[str, int | str]:
        parameters = {PRIORITY_PARAMETER: int(self.priority)}
        if self.seed is not None:
            parameters[Pool.SEED] = int(self.seed)
        if self.traceparent:
            parameters[TRACE_PARAMETER] = str(self.traceparent)
        return parameters


@dataclass(frozen=True)
class ChatRequest(Turn):
    """One chat turn. ``text`` may be None when ``tool_results`` are sent. ``response_format``:
    ``{"type": "json_object"}`` or ``{"type": "json_schema", "schema": {...}}``: the answer is
    JSON (matching the schema). ``logprobs`` (0-5): each token's log-probability and that many
    alternatives (``TokenLogprobs`` events). ``tools``: OpenAI's function definitions the answer
    may call, ``tool_choice``: "auto", "none", "required" or a function's name
    (``ToolCallDeltas`` events); ``tool_results``: the last answer's calls' results,
    ``[{"tool_call_id", "content"}]``, before ``text``."""

    text: str | bytes | None
    _: dataclasses.KW_ONLY
    response_format: dict | None = None
    logprobs: int | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    tool_results: list[dict] | None = None

    def inputs(self) -> list[Input]:
        inputs = self.turn_inputs()
        if self.text is not None:
            raw = self.text if isinstance(self.text, bytes) else self.text.encode("utf-8")
            inputs.insert(0, (Chat.TEXT, raw, np.object_, "BYTES"))
        for name, value in (
            (Chat.RESPONSE_FORMAT, self.response_format),
            (Chat.TOOLS, self.tools),
            (Chat.TOOL_RESULTS, self.tool_results),
        ):
            if value is not None:
                inputs.append((name, _blob(value), np.object_, "BYTES"))
        if self.tool_choice is not None:
            choice = self.tool_choice
            choice = choice if isinstance(choice, str) else json.dumps(choice, separators=(",", ":"))
            inputs.append((Chat.TOOL_CHOICE, choice.encode("utf-8"), np.object_, "BYTES"))
        if self.logprobs is not None:
            inputs.append((Chat.LOGPROBS, self.logprobs, np.int32, "INT32"))
        return inputs

    def outputs(self) -> tuple[str, ...]:
        """logprobs and tool_calls only when asked: older servers lack them."""
        outputs = CHAT_OUTPUTS if self.logprobs is None else SCORED_OUTPUTS
        return outputs + ((Chat.TOOL_CALLS,) if self.tools else ())

    def call(self, model: str) -> Call:
        headers = session_headers(self.session_id)
        return Call(model, self.inputs(), self.outputs(), self.priority, self.parameters(), headers, chat_decoder)


@dataclass(frozen=True)
class VoiceRequest(Turn):
    """A turn spoken instead of typed: ``audio`` (the file's bytes: WAV, FLAC, OGG...) is
    transcribed (``language``: its language, or detected), and the transcript answered as
    ``ChatRequest``'s text would be."""

    audio: bytes
    _: dataclasses.KW_ONLY
    language: str | None = None

    def call(self, model: str) -> Call:
        inputs = audio_inputs(self.audio, self.language) + self.turn_inputs()
        headers = session_headers(self.session_id)
        return Call(model, inputs, CHAT_OUTPUTS, self.priority, self.parameters(), headers, voice_decoder, False)

"""gRPC client for the ``chat`` model (streaming), built on tritonclient; and for the voice
channel: ``asr`` (an audio file in, its transcript out: ``transcribe``) and ``voice_chat`` (a
caller's audio in: what the recognizer heard, then chat's answer: ``voice_chat``).

Priority contract: ``priority=1`` (live/VIP) or ``2`` (default). The SDK sets Triton's
request priority, which orders the queue of the ``chat`` model, and sends the same value as
the request parameter ``chat_priority``, which the pipeline carries to the engine's
scheduler (Python models in Triton 2.51 cannot read Triton's priority).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import queue
import struct
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import AsyncIterator, Iterator

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from switchboard.wire import (
    PRIORITY_PARAMETER,
    SESSION_HEADER,
    Asr,
    AsrResult,
    Chat,
    ChatStats,
    Pool,
    VoiceChat,
    channel_args,
    untag,
)

_ids = itertools.count()


def close_stream(client: grpcclient.InferenceServerClient, cancel: bool = False) -> None:
    """Stop a client's stream (cancelling what is still running when ``cancel``) and close it."""
    client.stop_stream(cancel_requests=cancel)
    client.close()


class ChatError(RuntimeError):
    """The server refused or failed the chat. ``code`` is the gRPC status (e.g. INVALID_ARGUMENT)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ChatReply:
    text: str
    stats: ChatStats
    logprobs: list[dict] | None = None  # with logprobs asked: every token's entry (TokenLogprobs)
    # with tools: the calls the answer made, OpenAI's {"id", "type": "function", "function":
    # {"name", "arguments": JSON text}} (stats.finish_reason "tool_calls")
    tool_calls: list[dict] = field(default_factory=list)


def collect_reply(events) -> ChatReply:
    """A chat's events as one ``ChatReply``."""
    parts, stats, scored, calls = [], None, None, []
    for event in events:
        if isinstance(event, ChatStats):
            stats = event
        elif isinstance(event, TokenLogprobs):
            scored = (scored or []) + event.entries
        elif isinstance(event, ToolCallDeltas):
            calls = event.joined(calls)
        else:
            parts.append(event)
    return ChatReply("".join(parts), stats, scored, calls)


# What Triton itself answers when the queue in front of a model is full or a request waited
# past the queue policy's timeout (no status code reaches a stream client in 2.51).
# Triton's own refusals that a retry later can get past: its queue in front of chat is full or
# its wait ran out (overloaded), or the server is stopping or has not loaded chat yet (restart).
TRITON_RETRYABLE = (
    "Exceeds maximum queue size",
    "Request timeout expired",
    "Server is stopping",
    "has no available versions",
)


def error_of(e: InferenceServerException) -> tuple[str | None, str]:
    """(gRPC status name or None, message) of an error from a stream: the code the model wrote
    at the head of its message (switchboard.wire), else the gRPC status of the call itself
    (UNAVAILABLE when the server is gone), else None (Triton's own dtype/shape checks)."""
    return error_code(e.message() if hasattr(e, "message") else str(e), e.status())


def error_code(message: str, status: str | None = None) -> tuple[str | None, str]:
    """``error_of`` for a message and the call's status (``StatusCode.UNAVAILABLE``, or None)."""
    code, message = untag(message)
    if code is None and status:
        code = status.split(".")[-1]
    if code is None and any(m in message for m in TRITON_RETRYABLE):
        code = "UNAVAILABLE"  # overloaded or restarting: retry later
    return code, message


def chat_inputs(
    text,
    session_id,
    max_new_tokens,
    temperature,
    top_p,
    history=None,
    response_format=None,
    logprobs=None,
    tools=None,
    tool_choice=None,
    tool_results=None,
    presence_penalty=None,
    frequency_penalty=None,
) -> list[tuple]:
    """(name, value, numpy dtype, Triton datatype) of each input of one chat. ``history``: the
    conversation before ``text`` (``[{"role": "system" | "user" | "assistant", "content": str}, ...]``)
    for a stateless chat. ``response_format``: ``{"type": "json_object"}`` or ``{"type":
    "json_schema", "schema": {...}}``: the answer is JSON (matching the schema). ``logprobs``
    (0-5): each token's log-probability and that many alternatives (``TokenLogprobs`` events).
    ``tools``: OpenAI's function definitions the answer may call, ``tool_choice``: "auto",
    "none", "required" or a function's name (``ToolCallDeltas`` events); ``tool_results``: the
    last answer's calls' results, ``[{"tool_call_id", "content"}]``, before ``text`` (then
    optional: None). ``presence_penalty``, ``frequency_penalty`` (-2 to 2): OpenAI's repetition
    control, over the answer's own tokens."""
    inputs = turn_inputs(session_id, max_new_tokens, temperature, top_p, history, presence_penalty, frequency_penalty)
    if text is not None:
        raw = text if isinstance(text, bytes) else text.encode("utf-8")
        inputs.insert(0, (Chat.TEXT, raw, np.object_, "BYTES"))
    for name, value in (
        (Chat.RESPONSE_FORMAT, response_format),
        (Chat.TOOLS, tools),
        (Chat.TOOL_RESULTS, tool_results),
    ):
        if value is not None:
            blob = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
            inputs.append((name, blob, np.object_, "BYTES"))
    if tool_choice is not None:
        choice = tool_choice if isinstance(tool_choice, str) else json.dumps(tool_choice, separators=(",", ":"))
        inputs.append((Chat.TOOL_CHOICE, choice.encode("utf-8"), np.object_, "BYTES"))
    if logprobs is not None:
        inputs.append((Chat.LOGPROBS, logprobs, np.int32, "INT32"))
    return inputs


def turn_inputs(
    session_id, max_new_tokens, temperature, top_p, history=None, presence_penalty=None, frequency_penalty=None
) -> list[tuple]:
    """``chat_inputs`` but the text: chat's optional inputs, which ``voice_chat`` takes too."""
    inputs = []
    if session_id is not None:
        sid = session_id if isinstance(session_id, bytes) else session_id.encode("utf-8")
        inputs.append((Chat.SESSION_ID, sid, np.object_, "BYTES"))
    if max_new_tokens is not None:
        inputs.append((Chat.MAX_NEW_TOKENS, max_new_tokens, np.int32, "INT32"))
    if temperature is not None:
        inputs.append((Chat.TEMPERATURE, temperature, np.float32, "FP32"))
    if top_p is not None:
        inputs.append((Chat.TOP_P, top_p, np.float32, "FP32"))
    if presence_penalty is not None:
        inputs.append((Chat.PRESENCE_PENALTY, presence_penalty, np.float32, "FP32"))
    if frequency_penalty is not None:
        inputs.append((Chat.FREQUENCY_PENALTY, frequency_penalty, np.float32, "FP32"))
    if history is not None:
        blob = json.dumps(list(history), ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
        inputs.append((Chat.HISTORY, blob, np.object_, "BYTES"))
    return inputs


def audio_inputs(audio, language=None) -> list[tuple]:
    """``asr``'s inputs: the audio file's bytes as they are (the server decodes WAV, FLAC, OGG...)
    and, when given, its language ("en", "zh"; none: detected, or the recognizer's only one)."""
    if not isinstance(audio, (bytes, bytearray, memoryview)):
        raise TypeError(f"audio: expected the file's bytes, got {type(audio).__name__}")
    inputs = [(Asr.AUDIO, bytes(audio), np.object_, "BYTES")]
    if language:
        inputs.append((Asr.LANGUAGE, language.encode("utf-8"), np.object_, "BYTES"))
    return inputs


def chat_parameters(priority: int, seed) -> dict[str, int]:
    parameters = {PRIORITY_PARAMETER: int(priority)}
    if seed is not None:
        parameters[Pool.SEED] = int(seed)
    return parameters


CHAT_OUTPUTS = (Chat.TEXT_OUTPUT, Chat.STATS)
SCORED_OUTPUTS = (*CHAT_OUTPUTS, Chat.LOGPROBS_OUTPUT)  # asked only with logprobs: older servers lack it


@dataclass
class ToolCallDeltas:
    """With tools: the calls as the answer writes them, OpenAI's stream deltas: a call's first
    ``{"index", "id", "type": "function", "function": {"name", "arguments"}}``, then ``{"index",
    "function": {"arguments"}}`` with more of its arguments."""

    deltas: list[dict]

    def joined(self, calls: list[dict]) -> list[dict]:
        """``calls`` (whole calls so far) with these deltas added."""
        calls = [dict(c, function=dict(c["function"])) for c in calls]
        for d in self.deltas:
            if d["index"] >= len(calls):
                calls.append({"id": d.get("id"), "type": "function", "function": {"name": "", "arguments": ""}})
            fn = calls[d["index"]]["function"]
            fn["name"] = d.get("function", {}).get("name") or fn["name"]
            fn["arguments"] += d.get("function", {}).get("arguments", "")
        return calls


@dataclass
class TokenLogprobs:
    """With ``logprobs``: the tokens' log-probabilities up to the text delta that follows, as
    OpenAI's ``logprobs.content`` entries (``token``, ``logprob``, ``bytes``, ``top_logprobs``)."""

    entries: list[dict]


def chat_io(text, session_id, max_new_tokens, temperature, top_p, history=None, **extra) -> tuple[list, tuple]:
    """One chat's inputs (``chat_inputs``; ``extra``: response_format, logprobs, tools...) and the
    outputs to ask for (logprobs and tool_calls only when asked: older servers lack them)."""
    inputs = chat_inputs(text, session_id, max_new_tokens, temperature, top_p, history, **extra)
    outputs = CHAT_OUTPUTS if extra.get("logprobs") is None else SCORED_OUTPUTS
    return inputs, outputs + ((Chat.TOOL_CALLS,) if extra.get("tools") else ())


def stream_request(
    model: str, text, session_id, priority: int, max_new_tokens, temperature, top_p, seed, history=None, **extra
) -> dict:
    """Keyword arguments of tritonclient's ``async_stream_infer`` for one chat (``chat_io``)."""
    inputs, outputs = chat_io(text, session_id, max_new_tokens, temperature, top_p, history, **extra)
    return stream_call(model, inputs, priority, seed, outputs)


def stream_call(
    model: str, inputs: list[tuple], priority: int, seed=None, outputs=CHAT_OUTPUTS, parameters: dict | None = None
) -> dict:
    """Keyword arguments of tritonclient's ``async_stream_infer`` for any model's ``inputs``
    (``chat_inputs``, ``audio_inputs``...), each a ``[1, 1]`` tensor; ``parameters``: more
    request parameters (``Asr.DELTAS``)."""

    def tensor(name, value, dtype, triton_type):
        t = grpcclient.InferInput(name, [1, 1], triton_type)
        t.set_data_from_numpy(np.asarray([[value]], dtype=dtype))
        return t

    return {
        "model_name": model,
        "inputs": [tensor(*i) for i in inputs],
        "request_id": f"{os.getpid()}-{next(_ids)}",
        "priority": int(priority),
        "parameters": chat_parameters(priority, seed) | (parameters or {}),
        "outputs": [grpcclient.InferRequestedOutput(name) for name in outputs],
    }


_RAW = {"INT32": struct.Struct("<i").pack, "FP32": struct.Struct("<f").pack}


def request_message(
    model: str, text, session_id, priority: int, max_new_tokens, temperature, top_p, seed, history=None, **extra
) -> service_pb2.ModelInferRequest:
    """The same chat as ``stream_request``, as the protobuf message of Triton's gRPC API."""
    inputs, outputs = chat_io(text, session_id, max_new_tokens, temperature, top_p, history, **extra)
    return infer_message(model, inputs, priority, seed, outputs)


def infer_message(
    model: str, inputs: list[tuple], priority: int, seed=None, outputs=CHAT_OUTPUTS, parameters: dict | None = None
) -> service_pb2.ModelInferRequest:
    """``stream_call``'s request as the protobuf message of Triton's gRPC API: each input one
    ``[1, 1]`` tensor in ``raw_input_contents`` (a BYTES element is its length, 4 bytes
    little-endian, then the bytes)."""
    request = service_pb2.ModelInferRequest(model_name=model, id=f"{os.getpid()}-{next(_ids)}")
    for name, value in (chat_parameters(priority, seed) | (parameters or {})).items():
        if isinstance(value, bool):
            request.parameters[name].bool_param = value
        else:
            request.parameters[name].int64_param = value
    request.parameters["priority"].uint64_param = int(priority)  # Triton's queue order
    for name, value, _, datatype in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=(1, 1))
        try:
            raw = len(value).to_bytes(4, "little") + value if datatype == "BYTES" else _RAW[datatype](value)
        except (struct.error, OverflowError):
            raise ChatError(f"{name}: {value!r} does not fit {datatype}", "INVALID_ARGUMENT") from None
        request.raw_input_contents.append(raw)
    for name in outputs:
        request.outputs.add(name=name)
    return request


# -- responses: each model's outputs as events -----------------------------------------------------
# A decoder takes one response's outputs (name -> the bytes of its [1, 1] BYTES tensor; absent
# outputs absent) and gives (its events, whether it is the request's last response).
def chat_decoder(outputs: dict[str, bytes]) -> tuple[list, bool]:
    """chat: text deltas (str), each after its ``TokenLogprobs`` when asked, then its ``ChatStats``
    on the last response."""
    events: list = []
    if outputs.get(Chat.LOGPROBS_OUTPUT):
        events.append(TokenLogprobs(json.loads(outputs[Chat.LOGPROBS_OUTPUT])))
    if outputs.get(Chat.TOOL_CALLS):
        events.append(ToolCallDeltas(json.loads(outputs[Chat.TOOL_CALLS])))
    if outputs.get(Chat.TEXT_OUTPUT):
        events.append(outputs[Chat.TEXT_OUTPUT].decode("utf-8"))
    if Chat.STATS in outputs:
        events.append(ChatStats.from_json(outputs[Chat.STATS]))
    return events, Chat.STATS in outputs


def asr_decoder(outputs: dict[str, bytes]) -> tuple[list, bool]:
    """asr: transcript deltas (str), then the ``AsrResult`` (its ``result`` is "" before the last)."""
    events: list = []
    if outputs.get(Asr.TEXT):
        events.append(outputs[Asr.TEXT].decode("utf-8"))
    if outputs.get(Asr.RESULT):
        events.append(AsrResult.from_json(outputs[Asr.RESULT]))
    return events, bool(outputs.get(Asr.RESULT))


def voice_decoder(outputs: dict[str, bytes]) -> tuple[list, bool]:
    """voice_chat: ``Heard`` (its first response's stats name the transcript), then chat's
    deltas and ``ChatStats`` (with ``asr``), which end it."""
    events: list = []
    if outputs.get(VoiceChat.TEXT_OUTPUT):
        events.append(outputs[VoiceChat.TEXT_OUTPUT].decode("utf-8"))
    if not outputs.get(VoiceChat.STATS):
        return events, False
    stats = json.loads(outputs[VoiceChat.STATS])
    if "transcript" in stats:
        return [Heard.from_dict(stats), *events], False
    return [*events, ChatStats.from_dict(stats)], True


def result_outputs(result, names) -> dict[str, bytes]:
    """The outputs of one tritonclient ``InferResult``."""
    out = {}
    for name in names:
        value = result.as_numpy(name)
        if value is not None:
            out[name] = value.reshape(-1)[0]
    return out


def parse_response(result, error) -> tuple[str, ChatStats | None]:
    """(text delta, stats if this is the last response) of one streamed response of chat; an
    error response (always the request's last) raises ``ChatError``."""
    if error is not None:
        code, message = error_of(error)
        raise ChatError(message, code)
    events, _ = chat_decoder(result_outputs(result, CHAT_OUTPUTS))
    delta = next((e for e in events if isinstance(e, str)), "")
    stats = next((e for e in events if isinstance(e, ChatStats)), None)
    return delta, stats


@dataclass(frozen=True)
class Heard:
    """What the recognizer heard: ``voice_chat``'s first event, before the answer. An empty
    ``transcript`` (silence) is followed by no answer, only the stats."""

    transcript: str
    language: str | None = None
    asr_ms: float | None = None
    audio_s: float | None = None  # seconds of audio

    @classmethod
    def from_dict(cls, d: dict) -> "Heard":
        return cls(str(d.get("transcript") or ""), d.get("language"), d.get("asr_ms"), d.get("audio_s"))

    def to_dict(self) -> dict:
        return {
            "transcript": self.transcript,
            "language": self.language,
            "asr_ms": self.asr_ms,
            "audio_s": self.audio_s,
        }


@dataclass(frozen=True)
class VoiceReply:
    """A whole voice chat: what was heard, the answer (empty after silence), its stats."""

    heard: Heard
    text: str
    stats: ChatStats | None


def collect_voice(events: list) -> VoiceReply:
    heard = next((e for e in events if isinstance(e, Heard)), Heard(""))
    stats = next((e for e in events if isinstance(e, ChatStats)), None)
    return VoiceReply(heard, "".join(e for e in events if isinstance(e, str)), stats)


def collect_transcript(events: list) -> AsrResult:
    result = next((e for e in events if isinstance(e, AsrResult)), None)
    if result is None:  # the stream ended without its result: the server went away mid-transcript
        raise ChatError("the transcription ended without its result", "UNAVAILABLE")
    return result


class ChatClient:
    def __init__(
        self,
        url: str = "127.0.0.1:8001",
        model: str = "chat",
        timeout_s: float = 120.0,
        private_connection: bool = False,
        *,
        asr_model: str = "asr",
        voice_model: str = "voice_chat",
    ):
        """``private_connection``: chats do not share this process's connection to ``url``
        (``channel_args``); for health checks. ``asr_model``, ``voice_model``: the Triton models
        ``transcribe`` and ``voice_chat`` call."""
        self.url = url
        self.model = model
        self.asr_model = asr_model
        self.voice_model = voice_model
        self.timeout_s = timeout_s
        self._channel_args = channel_args(private_connection)

    def _client(self) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(self.url, channel_args=self._channel_args)

    def ready(self, model: str | None = None) -> bool:
        """The server and ``model`` (default: the chat model) are ready."""
        with self._client() as c:
            try:
                return c.is_server_ready() and c.is_model_ready(model or self.model)
            except InferenceServerException:
                return False

    def chat(
        self,
        text: str,
        session_id: str | None = None,
        stream: bool = True,
        priority: int = 2,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        history: list[dict] | None = None,
        response_format: dict | None = None,
        logprobs: int | None = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = None,
        tool_results: list[dict] | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
    ) -> Iterator[str | TokenLogprobs | ToolCallDeltas | ChatStats] | ChatReply:
        """``stream=True``: an iterator of text deltas (str) ending with one ``ChatStats``.
        ``stream=False``: the whole ``ChatReply``. Raises ``ChatError`` on refusal.
        ``history`` (instead of ``session_id``): the conversation before ``text``, kept by the caller.
        ``response_format`` (``chat_inputs``): the answer is JSON, matching a schema if given.
        ``logprobs`` (0-5, ``chat_inputs``): ``TokenLogprobs`` events before the text they score.
        ``tools``, ``tool_choice``, ``tool_results`` (``chat_inputs``): ``ToolCallDeltas`` events;
        ``ChatReply.tool_calls``. ``text`` may be None when ``tool_results`` are sent.
        ``presence_penalty``, ``frequency_penalty`` (-2 to 2, ``chat_inputs``): repetition control."""
        extra = dict(
            response_format=response_format,
            logprobs=logprobs,
            tools=tools,
            tool_choice=tool_choice,
            tool_results=tool_results,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
        )
        events = self._events(text, session_id, priority, max_new_tokens, temperature, top_p, seed, history, **extra)
        return events if stream else collect_reply(events)

    def transcribe(
        self, audio: bytes, language: str | None = None, priority: int = 2, stream: bool = False
    ) -> AsrResult | Iterator[str | AsrResult]:
        """The transcript of an audio file (its bytes: WAV, FLAC, OGG...). ``stream=False``: the
        whole ``AsrResult`` (text, language, duration, segments, timings). ``stream=True``: an
        iterator of text deltas (str) ending with the ``AsrResult``. Silence gives an empty
        text; audio the server refuses raises ``ChatError`` (INVALID_ARGUMENT, its message
        headed by the reason: ``[too_long] ...``; UNAVAILABLE while the recognizer is not loaded)."""
        inputs = audio_inputs(audio, language)  # a wrong type fails here, not at the first event
        extra = None if stream else {Asr.DELTAS: False}  # the result alone: no delta to send or read
        request = partial(stream_call, self.asr_model, inputs, priority, None, Asr.OUTPUTS, extra)
        events = self._run(request, None, asr_decoder)
        return events if stream else collect_transcript(list(events))

    def voice_chat(
        self,
        audio: bytes,
        session_id: str | None = None,
        stream: bool = True,
        priority: int = 2,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        language: str | None = None,
        history: list[dict] | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
    ) -> Iterator[Heard | str | ChatStats] | VoiceReply:
        """A turn spoken instead of typed: the audio is transcribed, the transcript answered as
        ``chat`` answers text (the session's history, priority, limits). ``stream=True``: an
        iterator of one ``Heard`` (the transcript), then text deltas (str), then ``ChatStats``
        (its ``asr``: transcript, language, asr_ms, audio_s). ``stream=False``: the whole
        ``VoiceReply``. Silence: ``Heard("")``, no answer, the stats."""
        turn = turn_inputs(session_id, max_new_tokens, temperature, top_p, history, presence_penalty, frequency_penalty)
        request = partial(
            stream_call, self.voice_model, audio_inputs(audio, language) + turn, priority, seed, CHAT_OUTPUTS
        )
        events = self._run(request, session_headers(session_id), voice_decoder)
        return events if stream else collect_voice(list(events))

    def _events(
        self,
        text, session_id, priority, max_new_tokens, temperature, top_p, seed,
        history=None, **extra,
    ):  # fmt: skip
        args = (self.model, text, session_id, priority, max_new_tokens, temperature, top_p, seed, history)
        build = partial(stream_request, *args, **extra)
        return self._run(build, session_headers(session_id), chat_decoder)

    def _run(self, build, headers: dict | None, decode):
        """The events of the request ``build()`` makes (at the first event, as a generator does
        its work), each response through ``decode``."""
        request = build()
        outputs = [o.name() for o in request["outputs"]]
        # Behind a balancer (switchboard.ops.balancer) a request that got nothing from a replica
        # that died or could not be reached is sent again: the balancer has another one. Once
        # something arrived, a broken stream is the caller's error (the answer would start over).
        for attempt in range(1 + RETRIES_BEFORE_ANSWER):
            try:
                yield from self._attempt(request, headers, decode, outputs)
                return
            except _NothingReceived as e:
                if attempt == RETRIES_BEFORE_ANSWER:
                    raise e.error from None
                time.sleep(RETRY_AFTER_S)

    def _attempt(self, request: dict, headers: dict | None, decode, outputs):
        responses: queue.Queue = queue.Queue()
        done = threading.Event()
        received = False

        def callback(result, error):
            responses.put((result, error))

        client = self._client()
        try:
            # Not the `triton_grpc_error` header: streams it ends with an error status can crash
            # Triton 2.51 (docs/reliability.md); the code comes in the message instead.
            try:
                client.start_stream(callback=callback, headers=headers)
                client.async_stream_infer(**request)
            except InferenceServerException as e:  # no stream: the server is down or unreachable
                done.set()
                code = error_of(e)[0] or "UNAVAILABLE"
                error = ChatError(f"could not send to {self.url}: {e.message()}", code)
                raise (_NothingReceived(error) if code == "UNAVAILABLE" else error) from None
            while not done.is_set():
                try:
                    result, error = responses.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise ChatError(f"no response within {self.timeout_s:.0f} s", "DEADLINE_EXCEEDED") from None
                if error is not None:
                    done.set()  # an error response is the request's last
                    code, message = error_of(error)
                    if not received and transport_unavailable(error):
                        raise _NothingReceived(ChatError(message, code))
                    raise ChatError(message, code)
                events, last = decode(result_outputs(result, outputs))
                received = True
                if last:
                    done.set()
                yield from events
        finally:
            close_stream(client, cancel=not done.is_set())


class _NothingReceived(Exception):
    """A chat that failed before anything came back, in a way another replica could answer."""

    def __init__(self, error: ChatError):
        super().__init__(str(error))
        self.error = error


RETRIES_BEFORE_ANSWER = 1
RETRY_AFTER_S = 0.5  # the balancer takes a dead replica out after two failed checks 0.5 s apart
STREAM_END_S = 5.0  # a stream half-closed after its answer is cancelled if Triton has not ended it by then


def session_headers(session_id) -> dict | None:
    """The header the balancer hashes to keep a session on one replica (switchboard.ops.balancer):
    a digest of the session id, so any id (newlines, any script, any length) makes a valid HTTP/2
    header and the id itself stays out of the balancer's logs."""
    if session_id is None:
        return None
    raw = session_id if isinstance(session_id, bytes) else session_id.encode("utf-8", "surrogatepass")
    return {SESSION_HEADER: hashlib.sha256(raw).hexdigest()[:32]}


def transport_unavailable(error) -> bool:
    """The call failed on its way (connection refused or reset, a balancer without a replica),
    not a refusal the server wrote: those carry a tag (``[UNAVAILABLE] ...``)."""
    code, _ = untag(error.message() if hasattr(error, "message") else str(error))
    return code is None and (error.status() or "").endswith("UNAVAILABLE")


class AsyncChatClient:
    """The asyncio twin of ``ChatClient`` for services and load generators that hold many chats
    at once (the HTTP gateway, ``perf``): one gRPC channel for every chat, where ``ChatClient``
    opens a channel and a receiving thread per chat. Create and use it inside one running event loop.

        async with AsyncChatClient("127.0.0.1:8001") as client:
            async for event in client.stream("Where is my order?", priority=1):
                ...  # str deltas, then one ChatStats

    It speaks Triton's gRPC API on the channel's own stubs, and keeps up to ``idle_streams``
    streams open between chats: a chat ends with one final response (its stats, or an error),
    after which its stream carries the next chat, so a chat costs one write instead of a new
    call (setup, write, half-close: about a third of the gateway's CPU before). A chat left
    early cancels its stream, which cancels the chat in Triton; that stream is not reused. A
    chat with a ``session_id`` gets a stream of its own (its header routes it: ``session_headers``).
    """

    def __init__(
        self,
        url: str = "127.0.0.1:8001",
        model: str = "chat",
        timeout_s: float = 120.0,
        idle_streams: int = 64,
        *,
        asr_model: str = "asr",
        voice_model: str = "voice_chat",
    ):
        self.url = url
        self.model = model
        self.asr_model = asr_model
        self.voice_model = voice_model
        self.timeout_s = timeout_s
        self.idle_streams = idle_streams
        self._channel = grpc.aio.insecure_channel(url, options=channel_args())
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._idle: list[grpc.aio.StreamStreamCall] = []

    async def __aenter__(self) -> "AsyncChatClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        await asyncio.gather(*(self._finish(call) for call in idle))  # answered: ended, not cancelled
        await self._channel.close()

    async def ready(self, timeout_s: float = 5.0) -> bool:
        """The server and the chat model are ready."""
        return await self.model_ready(self.model, timeout_s)

    async def model_ready(self, model: str, timeout_s: float = 5.0) -> bool | None:
        """True: the server and ``model`` are ready; False: the server answers, ``model`` is not
        ready (not loaded yet); None: the server does not answer or is not ready itself."""
        try:
            server = await self._stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=timeout_s)
            if not server.ready:
                return None
        except grpc.aio.AioRpcError:
            return None
        try:
            return (await self._stub.ModelReady(service_pb2.ModelReadyRequest(name=model), timeout=timeout_s)).ready
        except grpc.aio.AioRpcError as e:
            return False if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE) else None

    async def chat(
        self,
        text: str,
        session_id: str | None = None,
        priority: int = 2,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        history: list[dict] | None = None,
        response_format: dict | None = None,
        logprobs: int | None = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = None,
        tool_results: list[dict] | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
    ) -> ChatReply:
        """The whole answer. Raises ``ChatError`` on refusal."""
        events = self.stream(
            text, session_id, priority, max_new_tokens, temperature, top_p, seed,
            history=history, response_format=response_format, logprobs=logprobs,
            tools=tools, tool_choice=tool_choice, tool_results=tool_results,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        )  # fmt: skip
        return collect_reply([event async for event in events])

    def stream(
        self,
        text: str,
        session_id: str | None = None,
        priority: int = 2,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        history: list[dict] | None = None,
        response_format: dict | None = None,
        logprobs: int | None = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = None,
        tool_results: list[dict] | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
    ) -> AsyncIterator[str | TokenLogprobs | ToolCallDeltas | ChatStats]:
        """Text deltas (str) ending with one ``ChatStats``; leaving early cancels the chat.
        ``history`` (instead of ``session_id``): the conversation before ``text``, kept by the caller.
        ``response_format`` (``chat_inputs``): the answer is JSON, matching a schema if given.
        ``logprobs`` (0-5, ``chat_inputs``): ``TokenLogprobs`` events before the text they score.
        ``tools``, ``tool_choice``, ``tool_results`` (``chat_inputs``): ``ToolCallDeltas`` events."""
        args = (self.model, text, session_id, priority, max_new_tokens, temperature, top_p, seed, history)
        extra = dict(tools=tools, tool_choice=tool_choice, tool_results=tool_results)
        extra.update(presence_penalty=presence_penalty, frequency_penalty=frequency_penalty)
        build = partial(request_message, *args, response_format=response_format, logprobs=logprobs, **extra)
        return self._exchange(build, session_headers(session_id), chat_decoder)

    async def transcribe(self, audio: bytes, language: str | None = None, priority: int = 2) -> AsrResult:
        """``ChatClient.transcribe``'s whole ``AsrResult``."""
        events = self.transcribe_stream(audio, language, priority, deltas=False)
        return collect_transcript([e async for e in events])

    def transcribe_stream(
        self, audio: bytes, language: str | None = None, priority: int = 2, *, deltas: bool = True
    ) -> AsyncIterator[str | AsrResult]:
        """Transcript deltas (str) ending with the ``AsrResult``; leaving early cancels the
        transcription. ``deltas`` False: the ``AsrResult`` alone (``Asr.DELTAS``)."""
        inputs = audio_inputs(audio, language)
        extra = None if deltas else {Asr.DELTAS: False}
        request = partial(infer_message, self.asr_model, inputs, priority, None, Asr.OUTPUTS, extra)
        return self._exchange(request, None, asr_decoder, pooled=False)

    async def voice_chat(
        self,
        audio: bytes,
        session_id: str | None = None,
        priority: int = 2,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        language: str | None = None,
        history: list[dict] | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
    ) -> VoiceReply:
        """``ChatClient.voice_chat``'s whole ``VoiceReply``."""
        events = self.voice_stream(
            audio, session_id, priority, max_new_tokens, temperature, top_p, seed, language=language, history=history,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        )  # fmt: skip
        return collect_voice([e async for e in events])

    def voice_stream(
        self,
        audio: bytes,
        session_id: str | None = None,
        priority: int = 2,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        language: str | None = None,
        history: list[dict] | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
    ) -> AsyncIterator[Heard | str | ChatStats]:
        """``stream`` for a spoken turn: one ``Heard``, then text deltas (str), then ``ChatStats``."""
        turn = turn_inputs(session_id, max_new_tokens, temperature, top_p, history, presence_penalty, frequency_penalty)
        inputs = audio_inputs(audio, language) + turn
        request = partial(infer_message, self.voice_model, inputs, priority, seed, CHAT_OUTPUTS)
        return self._exchange(request, session_headers(session_id), voice_decoder, pooled=False)

    async def _exchange(self, build, headers: dict | None, decode, pooled: bool = True) -> AsyncIterator:
        """The events of the request ``build()`` makes (at the first event: a value that does not
        fit its tensor fails there, as the chat's other refusals), ``decode`` of each response, on
        a stream of the pool (or one of its own, with ``headers`` or not ``pooled``); leaving
        early cancels it.

        Speech goes on streams of its own, closed when it is done: Triton does not finish
        unloading a model (``asr`` whose stub died and is reloaded; the recognizer replaced)
        while a stream that carried a request to it stays open, and a pooled stream stays open
        for as long as this client. A transcription costs far more than a stream's setup."""
        request = build()
        pooled = pooled and headers is None
        call = self._take() if pooled else None
        done = retried = False
        try:
            # A stream that failed before the request's first response (a reused one that broke
            # while idle; the replica behind a balancer died): once more on a new one. No
            # response means no token yet, so the turn was neither answered nor stored.
            while True:
                if call is None:
                    call = self._stub.ModelStreamInfer(metadata=tuple(headers.items()) if headers else None)
                try:
                    await self._write(call, request)
                    message = await self._read(call)
                    break
                except _StaleStream as e:
                    call.cancel()
                    if retried:
                        raise e.error from None
                    call, retried = None, True
            while True:
                events, done = decode(message_outputs(message))
                for event in events:
                    yield event
                if done:
                    return
                message = await self._read(call)
        except _StaleStream as e:
            raise e.error from None
        finally:
            if call is not None:
                if done and pooled and len(self._idle) < self.idle_streams and not call.done():
                    self._idle.append(call)
                elif done:
                    await self._finish(call)
                else:
                    call.cancel()  # cancels the request in Triton if it is still running

    async def _finish(self, call) -> None:
        """End a stream whose request is answered: the client half-closes and Triton ends it.
        Cancelled instead, as its last response goes out, Triton 2.51 can keep the model
        referenced: it never unloads, and a stop waits out the server's exit timeout
        (docs/voice.md)."""
        try:
            if not call.done():
                await call.done_writing()
                async with asyncio.timeout(STREAM_END_S):
                    await call.code()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError):
            call.cancel()

    def _take(self) -> grpc.aio.StreamStreamCall | None:
        while self._idle:
            call = self._idle.pop()
            if not call.done():
                return call
        return None

    async def _write(self, call, request) -> None:
        try:
            await call.write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
            raise self._broken(e) from None

    async def _read(self, call) -> service_pb2.ModelStreamInferResponse:
        try:
            async with asyncio.timeout(self.timeout_s):  # no task per response, unlike wait_for
                message = await call.read()
        except TimeoutError:
            raise ChatError(f"no response within {self.timeout_s:.0f} s", "DEADLINE_EXCEEDED") from None
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
            raise self._broken(e) from None
        if message is grpc.aio.EOF:
            raise _StaleStream(ChatError(f"{self.url} closed the stream before the answer was complete", "UNAVAILABLE"))
        return message

    def _broken(self, e: Exception) -> "_StaleStream":
        """The call failed: the server is down or unreachable, or the stream was ended."""
        if isinstance(e, grpc.aio.AioRpcError):
            return _StaleStream(ChatError(f"could not send to {self.url}: {e.details()}", e.code().name))
        return _StaleStream(ChatError(f"could not send to {self.url}: the stream has ended ({e})", "UNAVAILABLE"))


class _StaleStream(Exception):
    """The stream itself failed (not a response): on a stream reused from the pool, before any
    response, the chat goes once more on a new stream."""

    def __init__(self, error: ChatError):
        super().__init__(str(error))
        self.error = error


def message_outputs(message: service_pb2.ModelStreamInferResponse) -> dict[str, bytes]:
    """The outputs of one message of a stream (name -> the bytes of its [1, 1] BYTES tensor); an
    error (always the request's last response) raises ``ChatError``."""
    if message.error_message:
        code, text = error_code(message.error_message)
        raise ChatError(text, code)
    response = message.infer_response
    return {
        meta.name: raw[4 : 4 + int.from_bytes(raw[:4], "little")]
        for meta, raw in zip(response.outputs, response.raw_output_contents)
    }


def response_events(message: service_pb2.ModelStreamInferResponse) -> tuple[str, ChatStats | None, bool]:
    """(text delta, stats, whether it is the chat's last response) of one message of a chat's
    stream; an error (always the chat's last response) raises ``ChatError``."""
    events, done = chat_decoder(message_outputs(message))
    delta = next((e for e in events if isinstance(e, str)), "")
    stats = next((e for e in events if isinstance(e, ChatStats)), None)
    return delta, stats, done

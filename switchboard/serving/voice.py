"""A voice turn: the caller's audio through ``asr``, the transcript through ``chat``.

Both are reached over this server's gRPC (switchboard/serving/engine_client.py says why not
BLS), so each keeps its own queue, priorities and admission: ``asr`` batches the audio by
length, ``chat`` answers from the session's history, with its FAQ fallback and pools, exactly
as for a typed message. The caller hears the transcript first, then the answer as chat streams
it; the answer's final stats carry the transcript and how long the recognizer took.

Errors keep their codes: a refused file is ``asr``'s INVALID_ARG (``[too_long] ...``), an
overloaded chat is chat's UNAVAILABLE. Imports no Triton module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from switchboard.codec import build_request
from switchboard.common.tally import Tally
from switchboard.serving.engine_client import EngineClient, EngineStreamError
from switchboard.serving.metrics import starts_conversation
from switchboard.wire import PRIORITY_PARAMETER, TRACE_PARAMETER, Asr, AsrResult, Chat, ChatStats, untag

PREFIX = "switchboard_voice_"
# name -> (kind, help, label names, buckets), as ChatMetrics' (switchboard/serving/metrics.py)
METRICS = {
    "turns_total": ("counter", "voice turns answered: a caller's audio transcribed and answered by chat", (), None),
    "conversations_total": (
        "counter",
        "voice conversations started: answered voice turns that were their conversation's first turn",
        (),
        None,
    ),
}

# gRPC status names (what untag gives) back to Triton's error code names.
TRITON_CODES = {
    "INVALID_ARGUMENT": "INVALID_ARG",
    "UNAVAILABLE": "UNAVAILABLE",
    "CANCELLED": "CANCELLED",
    "NOT_FOUND": "NOT_FOUND",
    "UNIMPLEMENTED": "UNSUPPORTED",
    "INTERNAL": "INTERNAL",
}


class VoiceError(RuntimeError):
    """The turn failed: ``code`` is a Triton error code name, the message the client's."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class VoiceSink(Protocol):
    def transcript(self, asr: dict) -> None: ...
    def text(self, delta: str) -> None: ...
    def final(self, text: str, stats_json: str) -> None: ...


@dataclass
class VoiceRequest:
    audio: bytes
    language: str | None
    chat_inputs: dict  # chat's optional inputs as given (session_id, max_new_tokens, ...), name -> array
    priority: int
    parameters: dict  # request parameters passed on to chat (chat_priority, seed, traceparent)


def _failure(error: EngineStreamError, unavailable_hint: str) -> VoiceError:
    """What the client is told: the model's tagged code, or UNAVAILABLE for a model that is not
    loaded (the default recognizer is still being built after a fresh `make serve`)."""
    status, message = untag(str(error))
    if status is None:
        if "unknown model" in message or "is not found" in message or "not ready" in message:
            return VoiceError("UNAVAILABLE", unavailable_hint)
        return VoiceError("UNAVAILABLE", message)
    return VoiceError(TRITON_CODES.get(status, "INTERNAL"), message)


class VoiceMetrics(Tally):
    """What answered voice turns add up to since the last ``drain``: turns per conversation is
    ``turns_total`` over ``conversations_total`` (docs/metrics.md)."""

    def answered(self, request: VoiceRequest, stats: ChatStats) -> None:
        """chat answered ``request``'s transcript with ``stats``."""
        session_id, history = _conversation(request.chat_inputs)
        with self._lock:
            self._counts["turns_total", ()] += 1
            if starts_conversation(session_id, history, stats.session):
                self._counts["conversations_total", ()] += 1


def _conversation(chat_inputs: dict) -> tuple[str | None, list | None]:
    """The session id and the history of a voice request's chat inputs (each None when not
    given; chat checked both before it answered)."""

    def one(name: str):
        value = chat_inputs.get(name)
        return None if value is None or value.size == 0 else value.reshape(-1)[0]

    session_id, history = one(Chat.SESSION_ID), one(Chat.HISTORY)
    if history is not None:
        try:
            history = json.loads(history)
        except ValueError:
            history = None
        history = [m for m in history if isinstance(m, dict)] if isinstance(history, list) else []
    return (session_id.decode("utf-8", "replace") if session_id is not None else None), history


class VoiceTurn:
    def __init__(
        self,
        client: EngineClient,
        asr_model: str = "asr",
        chat_model: str = "chat",
        asr_timeout_s=60.0,
        metrics: VoiceMetrics | None = None,
    ):
        self.client, self.asr_model, self.chat_model = client, asr_model, chat_model
        self.asr_timeout_s = asr_timeout_s
        self.metrics = metrics

    def run(self, request: VoiceRequest, sink: VoiceSink, cancelled: Callable[[], bool]) -> None:
        result = self.transcribe(request, cancelled)
        sink.transcript(result.voice())
        if not result.text.strip():
            stats = ChatStats(priority=request.priority, asr=result.voice())
            sink.final("", stats.to_json())
            return
        self.answer(request, result, sink, cancelled)

    def transcribe(self, request: VoiceRequest, cancelled: Callable[[], bool]) -> AsrResult:
        inputs = {Asr.AUDIO: np.asarray([[request.audio]], dtype=np.object_)}
        if request.language:
            inputs[Asr.LANGUAGE] = np.asarray([[request.language.encode()]], dtype=np.object_)
        call = build_request(
            self.asr_model,
            inputs,
            list(Asr.OUTPUTS),
            # the transcript is read whole; the turn's trace context goes to asr as to chat
            {PRIORITY_PARAMETER: request.priority, Asr.DELTAS: False}
            | {k: v for k, v in request.parameters.items() if k == TRACE_PARAMETER},
            priority=request.priority,
            timeout_us=int(self.asr_timeout_s * 1e6),
        )
        stream = self.client.stream(call, self.asr_timeout_s)
        result = None
        try:
            for outputs in stream:
                if cancelled():
                    stream.cancel()
                    raise VoiceError("CANCELLED", "cancelled by the client")
                blob = outputs.get(Asr.RESULT)
                if blob is not None and blob.reshape(-1)[0]:
                    result = AsrResult.from_json(blob.reshape(-1)[0])
                    break
        except EngineStreamError as e:
            raise _failure(e, "the speech recognizer is not ready yet (it is being built); try again shortly") from None
        if result is None:
            raise VoiceError("INTERNAL", "the speech recognizer ended without a transcript")
        _read_to_end(stream)
        return result

    def answer(self, request: VoiceRequest, result: AsrResult, sink: VoiceSink, cancelled) -> None:
        inputs = {Chat.TEXT: np.asarray([[result.text.encode("utf-8")]], dtype=np.object_)}
        inputs.update(request.chat_inputs)
        call = build_request(
            self.chat_model,
            inputs,
            [Chat.TEXT_OUTPUT, Chat.STATS],
            request.parameters,
            priority=request.priority,
        )
        stream = self.client.stream(call)
        final = None
        try:
            for outputs in stream:
                if cancelled():
                    stream.cancel()
                    raise VoiceError("CANCELLED", "cancelled by the client")
                text = outputs.get(Chat.TEXT_OUTPUT)
                delta = "" if text is None else text.reshape(-1)[0].decode("utf-8")
                blob = outputs.get(Chat.STATS)
                if blob is not None and blob.reshape(-1)[0]:
                    stats = ChatStats.from_json(blob.reshape(-1)[0])
                    stats.asr = result.voice()
                    if self.metrics is not None:
                        self.metrics.answered(request, stats)
                    final = delta, stats.to_json()
                    break
                if delta:
                    sink.text(delta)
        except EngineStreamError as e:
            raise _failure(e, "the chat is not ready yet; try again shortly") from None
        if final is None:
            raise VoiceError("INTERNAL", "the chat ended without a final response")
        sink.final(*final)
        _read_to_end(stream)


def _read_to_end(stream) -> None:
    """Reads what is left of a stream after its final response: nothing but its end, so the
    call ends with the server's status. A stream left unread is cancelled when it is collected,
    racing Triton's own close; after such streams Triton 2.51 could not unload ``asr`` (a stop
    waited out its 30 s exit timeout)."""
    try:
        for _ in stream:
            pass
    except EngineStreamError:
        pass  # the answer is out; how the call ended changes nothing for the caller

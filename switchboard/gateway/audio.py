"""OpenAI's ``POST /v1/audio/transcriptions`` on the ``asr`` model, and what the voice channel's
routes share: the errors of a refused or unready recognizer.

A transcription is a multipart upload (``uploads``: read into memory with limits, never to
disk), checked field by field like a chat, then one ``asr`` request over gRPC (the SDK's
``transcribe_stream``), whose first event is awaited before the status goes out: refused audio
gets a real 400 or 413 even when streaming. The answer is OpenAI's: ``json`` (text and the
audio's duration as usage), ``text``, ``verbose_json`` (language, duration, segments),
``srt``, ``vtt``; with ``stream=true`` server-sent events ``transcript.text.delta`` then
``transcript.text.done``, as OpenAI streams transcripts (no ``[DONE]``: OpenAI sends none).

Model ids. A transcription names ``GatewayConfig.transcription_model`` (default
``switchboard-asr``, listed by ``GET /v1/models``) or an alias (``whisper-1``, what OpenAI's
examples send); another id is 404 as for chat. Which recognizer runs is the server's choice
(``make serve ASR_MODEL=...``), as the chat model is.

Not ready. Until the recognizer is loaded (a fresh ``make serve`` builds the default one after
text chat is up), Triton refuses ``asr`` and ``voice_chat`` requests (model unknown or not
ready). Such a refusal is told apart from an overloaded server by asking Triton whether the
model is ready, and answered 503 ``speech_model_not_ready`` with ``Retry-After`` (30 s).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from switchboard.client import ChatError, Heard
from switchboard.common import tracing
from switchboard.gateway.checks import (
    authenticate,
    priority_of,
    refuse_foreign_origin,
    state_of,
    trace_request,
    wants_stats,
)
from switchboard.gateway.errors import (
    APIError,
    bad_request,
    from_audio_error,
    from_chat_error,
    overloaded,
    speech_not_ready,
)
from switchboard.gateway.openai_request import check_language
from switchboard.gateway.openai_response import sse
from switchboard.gateway.state import GatewayState
from switchboard.gateway.streaming import ChatStreamResponse, ClientGone, or_gone
from switchboard.gateway.uploads import Upload, boundary_of, read_form
from switchboard.wire import AsrResult

log = logging.getLogger("switchboard.gateway")

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
FIELDS = (
    "file",
    "model",
    "language",
    "response_format",
    "stream",
    "temperature",
    "prompt",
    "timestamp_granularities[]",
    "include[]",
    "chunking_strategy",
)
# verbose_json names the language as OpenAI's Whisper does ("english"); other codes stay codes.
LANGUAGE_NAMES = {
    "en": "english",
    "zh": "chinese",
    "de": "german",
    "es": "spanish",
    "fr": "french",
    "it": "italian",
    "ja": "japanese",
    "ko": "korean",
    "pt": "portuguese",
    "ru": "russian",
}


@dataclass(frozen=True)
class TranscriptionCall:
    """One transcription request, checked."""

    model: str
    audio: bytes
    language: str | None = None
    response_format: str = "json"
    stream: bool = False


def _flag(name: str, value: str | None) -> bool:
    if value is None:
        return False
    v = value.strip().lower()
    if v not in ("true", "false"):
        raise bad_request(f"{name}: expected true or false", name)
    return v == "true"


def parse_transcription(upload: Upload, models: tuple[str, ...]) -> TranscriptionCall:
    """The form of ``POST /v1/audio/transcriptions`` checked; ``APIError`` naming the field
    otherwise (404 for a model this gateway does not serve)."""
    for name in upload.fields:
        if name not in FIELDS:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name)
    if upload.file is None:
        if "file" in upload.fields:
            raise bad_request("file: expected a file part (with a filename), got a text field", "file")
        raise bad_request("file: required (the audio file, as the multipart part named 'file')", "file")
    if upload.file_field != "file":
        raise bad_request(f"file: the audio must be the part named 'file', not {upload.file_field!r}", "file")
    if not upload.file:
        raise bad_request("file: the file is empty (0 bytes)", "file", "empty")

    model = (upload.value("model") or "").strip()
    if not model:
        raise bad_request("model: required", "model")
    if model not in models:
        served = ", ".join(repr(m) for m in models)
        raise APIError(
            404, f"The model {model[:64]!r} does not exist (transcriptions: {served})", "model", "model_not_found"
        )
    response_format = (upload.value("response_format") or "json").strip()
    if response_format not in RESPONSE_FORMATS:
        raise bad_request(
            f"response_format: {response_format[:32]!r} is not supported (one of {', '.join(RESPONSE_FORMATS)})",
            "response_format",
        )
    stream = _flag("stream", upload.value("stream"))
    if stream and response_format not in ("json", "text"):
        raise bad_request("stream: only with response_format json or text", "stream")
    temperature = upload.value("temperature")
    if temperature is not None:
        try:
            t = float(temperature)
        except ValueError:
            raise bad_request("temperature: expected a number", "temperature") from None
        if t != 0:
            raise bad_request("temperature: only 0 is supported (the recognizer decodes greedily)", "temperature")
    if (upload.value("prompt") or "").strip():
        raise bad_request("prompt: not supported (the recognizer takes no prompt)", "prompt")
    for granularity in upload.fields.get("timestamp_granularities[]", []):
        if granularity != "segment":
            raise bad_request(
                f"timestamp_granularities: {granularity[:16]!r} is not supported (segment only)",
                "timestamp_granularities",
            )
        if response_format != "verbose_json":
            raise bad_request(
                "timestamp_granularities: only with response_format verbose_json", "timestamp_granularities"
            )
    if upload.fields.get("include[]"):
        raise bad_request(f"include: {upload.fields['include[]'][0][:32]!r} is not supported", "include")
    chunking = upload.value("chunking_strategy")
    if chunking is not None and chunking.strip() != "auto":
        # the server cuts long audio at silences itself ("auto")
        raise bad_request("chunking_strategy: only 'auto' is supported", "chunking_strategy")
    return TranscriptionCall(
        model=model,
        audio=upload.file,
        language=check_language(upload.value("language"), "language", "language"),
        response_format=response_format,
        stream=stream,
    )


# -- the answer ------------------------------------------------------------------------------------
def segments_of(result: AsrResult) -> list[dict]:
    """OpenAI's segments of a transcript: one per chunk the server cut the audio into (at
    silences); a transcript without any is one segment over the whole audio."""
    segments = result.segments or ([{"start": 0.0, "end": result.duration, "text": result.text}] if result.text else [])
    out = []
    for i, s in enumerate(segments):
        start, end = float(s.get("start", 0.0)), float(s.get("end", result.duration))
        out.append(
            {
                "id": i,
                "seek": int(round(start * 100)),  # Whisper's: the segment's start in 10 ms frames
                "start": start,
                "end": end,
                "text": s.get("text", ""),
                "tokens": [],
                "temperature": 0.0,
            }
        )
    return out


def switchboard_stats(result: AsrResult) -> dict:
    return {
        "language": result.language,
        "duration": result.duration,
        "asr_ms": result.asr_ms,
        "queue_ms": result.queue_ms,
        "batch_size": result.batch_size,
        "chunks": result.chunks,
    }


def _timestamp(seconds: float, separator: str) -> str:
    ms = int(round(max(seconds, 0.0) * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{separator}{ms:03d}"


def subtitles(result: AsrResult, kind: str) -> str:
    """The transcript as SubRip (``srt``) or WebVTT (``vtt``) cues, one per segment."""
    separator = "," if kind == "srt" else "."
    cues = []
    for i, s in enumerate(segments_of(result), start=1):
        times = f"{_timestamp(s['start'], separator)} --> {_timestamp(s['end'], separator)}"
        text = s["text"].strip()
        cues.append(f"{i}\n{times}\n{text}\n" if kind == "srt" else f"{times}\n{text}\n")
    body = "\n".join(cues)
    return f"WEBVTT\n\n{body}" if kind == "vtt" else body


def duration_usage(result: AsrResult) -> dict:
    return {"type": "duration", "seconds": math.ceil(result.duration)}  # OpenAI bills whole seconds


def transcription_response(result: AsrResult, response_format: str, with_stats: bool) -> Response:
    if response_format == "text":
        return PlainTextResponse(result.text + "\n")
    if response_format in ("srt", "vtt"):
        media_type = "text/vtt" if response_format == "vtt" else "application/x-subrip"
        return PlainTextResponse(subtitles(result, response_format), media_type=media_type)
    if response_format == "verbose_json":
        body = {
            "task": "transcribe",
            "language": LANGUAGE_NAMES.get(result.language or "", result.language or ""),
            "duration": result.duration,
            "text": result.text,
            "segments": segments_of(result),
            "usage": duration_usage(result),
        }
    else:
        body = {"text": result.text, "usage": duration_usage(result)}
    if with_stats:
        body["switchboard"] = switchboard_stats(result)
    return JSONResponse(body)


async def transcript_sse(events, first, state: GatewayState, with_stats: bool):
    """OpenAI's transcript stream: ``transcript.text.delta`` events, then ``transcript.text.done``
    with the whole text. An error after the status went out is an ``error`` event."""
    event = first
    try:
        while event is not None and not isinstance(event, AsrResult):
            yield sse({"type": "transcript.text.delta", "delta": event})
            event = await next_asr_event(events, state)
        if event is None:
            raise APIError(502, "the speech service ended the transcript without its result", None, "server_error")
        done = {"type": "transcript.text.done", "text": event.text}
        if with_stats:
            done["switchboard"] = switchboard_stats(event)
        yield sse(done)
    except APIError as e:
        yield sse({"type": "error", **e.body()})


# -- errors ----------------------------------------------------------------------------------------
async def speech_error(state: GatewayState, e: ChatError, voice: bool, max_tokens_param: str = "max_tokens"):
    """The ``APIError`` for a transcription (``voice`` False) or voice chat that the server
    refused: asr's reasons by status (400, 413), 503 with Retry-After while the recognizer is not
    loaded, otherwise as for a chat."""
    config = state.config
    if e.code == "INVALID_ARGUMENT":
        where = ("messages", "messages: the audio: ", "messages") if voice else ("file", "file: ", "language")
        mapped = from_audio_error(str(e), *where)
        if mapped is not None:
            return mapped
    if e.code in (None, "UNAVAILABLE", "NOT_FOUND", "UNIMPLEMENTED") and await _speech_unready(state, voice):
        return speech_not_ready(config.voice_retry_after_s)
    if voice:
        return from_chat_error(e.code, str(e), config.retry_after_s, max_tokens_param, service="voice chat")
    return from_chat_error(e.code, str(e), config.retry_after_s, service="speech")


async def _speech_unready(state: GatewayState, voice: bool) -> bool:
    """Triton answers, but the model (or, behind voice_chat, the recognizer) is not ready."""
    models = (state.config.voice_model, state.config.asr_model) if voice else (state.config.asr_model,)
    for model in models:
        if await state.client.model_ready(model) is False:
            return True
    return False


async def next_asr_event(events, state: GatewayState):
    """The next event of a transcription (a text delta or the AsrResult), ChatError as APIError; None at the end."""
    try:
        return await events.__anext__()
    except StopAsyncIteration:
        return None
    except ChatError as e:
        raise await speech_error(state, e, voice=False) from None


async def collect_result(events, first, state: GatewayState) -> AsrResult:
    event = first
    while event is not None and not isinstance(event, AsrResult):
        event = await next_asr_event(events, state)
    if event is None:
        raise APIError(502, "the speech service ended the transcript without its result", None, "server_error")
    return event


# -- the routes' voice steps --------------------------------------------------------------------------
async def next_heard(events, call, state: GatewayState) -> dict:
    """A voice chat's first event: what the recognizer heard (``Heard``), as the answer's
    ``switchboard.asr``. An empty transcript (silence, noise) is 400 ``no_speech``: nothing was
    asked, so nothing is answered (voice_chat ends such a turn without calling chat)."""
    try:
        heard = await events.__anext__()
    except StopAsyncIteration:
        heard = None
    except ChatError as e:
        raise await speech_error(state, e, voice=True, max_tokens_param=call.max_tokens_param) from None
    if not isinstance(heard, Heard):
        raise APIError(502, "the voice chat service answered without a transcript", None, "server_error")
    if not heard.transcript.strip():
        raise bad_request(
            "messages: no speech in the audio (silence or noise only: nothing to answer)", "messages", "no_speech"
        )
    return heard.to_dict()


async def transcriptions(request: Request):
    """``POST /v1/audio/transcriptions``."""
    state = state_of(request)
    config, slots = state.config, state.slots
    boundary_of(request.headers.get("content-type"))  # 415 before the key, as the chat route
    refuse_foreign_origin(request, config.cors_origins)
    caller = authenticate(request, config.keys)
    priority = priority_of(request, caller)
    headers = request.headers
    form = await read_form(
        request.stream(), headers.get("content-type"), headers.get("content-length"), config.max_audio_bytes
    )
    call = parse_transcription(form, config.transcription_models())
    with_stats = wants_stats(request)
    if not slots.take():
        raise overloaded(429, f"too many requests in flight (limit {slots.limit}), retry later", config.retry_after_s)
    span = trace_request(request, "POST /v1/audio/transcriptions", stream=call.stream)
    traced = {"traceparent": tp} if (tp := tracing.inject(span)) else {}  # asked only when traced
    events = state.client.transcribe_stream(call.audio, call.language, priority, deltas=call.stream, **traced)
    released = False

    async def release():
        nonlocal released
        if not released:
            released = True
            slots.give()
            await events.aclose()  # cancels the transcription if it is still running
            span.end()

    handed_over = False
    try:
        first = await or_gone(request, next_asr_event(events, state))
        if call.stream:
            body = transcript_sse(events, first, state, with_stats)
            handed_over = True  # the response releases the slot when it ends, however it ends
            return ChatStreamResponse(
                body,
                release,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        result = await or_gone(request, collect_result(events, first, state))
        return transcription_response(result, call.response_format, with_stats)
    except ClientGone:
        log.debug("client left before the transcript: cancelled")
        return Response(status_code=499)
    finally:
        if not handed_over:
            await release()

"""The gateway's chat, model and health handlers (the checks they share: ``checks``;
transcriptions: ``audio``). Each reaches what the app holds (the configuration, the chats in
flight, the SDK client) at ``request.app.state.gateway``; ``app`` registers them.

A chat whose last message is audio (``input_audio``) goes to ``voice_chat`` instead of ``chat``:
what it heard is awaited first (silence is 400 ``no_speech``; a refused file 400 or 413; a
recognizer not loaded yet 503: ``audio.speech_error``), then the answer as any chat's.

A chat request is checked (content type, key, size, fields: ``openai_request``) before any chat starts;
``chat``'s first answer is awaited before the HTTP status is sent, so a refusal gets its status
(400, 503...) even when streaming. A client that leaves cancels its chat: the gRPC stream is
cancelled, and ``chat`` stops the generation at its next check (``cancel_poll_ms``).
"""

from __future__ import annotations

import dataclasses
import logging
from importlib import resources

from fastapi import Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from switchboard.common import tracing
from switchboard.gateway.audio import next_heard
from switchboard.gateway.checks import (
    authenticate,
    priority_of,
    read_body,
    require_json,
    state_of,
    trace_request,
    wants_stats,
)
from switchboard.gateway.errors import APIError, overloaded
from switchboard.gateway.openai_request import parse_body, parse_request
from switchboard.gateway.openai_response import Completion
from switchboard.gateway.state import GatewayConfig, GatewayState
from switchboard.gateway.streaming import ChatStreamResponse, ClientGone, collect, next_event, or_gone, sse_stream
from switchboard.serving import order_demo

log = logging.getLogger("switchboard.gateway")

STATIC = resources.files("switchboard.gateway") / "static"
INDEX_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


# -- routes --------------------------------------------------------------------------------------
async def chat_completions(request: Request):
    require_json(request)  # before the key, as 404 and 405: what the route takes, whoever asks
    state = state_of(request)
    config, slots = state.config, state.slots
    caller = authenticate(request, config.keys)
    priority = priority_of(request, caller)
    call = parse_request(parse_body(await read_chat_body(request, config)), config.model, config.max_audio_bytes)
    with_stats = wants_stats(request)
    if not slots.take():
        raise overloaded(429, f"too many chats in flight (limit {slots.limit}), retry later", config.retry_after_s)
    completion = Completion(call.model)
    span = trace_request(request, "POST /v1/chat/completions", stream=call.stream, voice=call.audio is not None)
    turn = dataclasses.replace(call.chat_request(priority), traceparent=tracing.inject(span))
    events = state.client.voice_stream(turn) if call.audio is not None else state.client.stream(turn)
    released = False

    async def release():
        nonlocal released
        if not released:
            released = True
            slots.give()
            await events.aclose()  # cancels the chat if it is still running
            span.end()  # the answer's last byte is out (or the client left)

    handed_over = False
    try:
        heard = None if call.audio is None else await or_gone(request, next_heard(events, call, state))
        first = await or_gone(request, next_event(events, call, config.retry_after_s))
        headers = {"X-Request-Id": completion.id}
        if call.stream:
            body = sse_stream(events, first, call, completion, with_stats, config.retry_after_s, heard)
            headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            handed_over = True  # the response releases the slot when it ends, however it ends
            return ChatStreamResponse(body, release, media_type="text/event-stream", headers=headers)
        text, stats, stopped, scored, calls = await or_gone(request, collect(events, first, call, config.retry_after_s))
        answer = completion.response(text, stats, stopped, with_stats, heard, scored, calls)
        return JSONResponse(answer, headers=headers)
    except ClientGone:
        log.debug("client left before the answer: chat cancelled")
        return Response(status_code=499)
    finally:
        if not handed_over:
            await release()


async def read_chat_body(request: Request, config: GatewayConfig) -> bytes:
    """The body of a chat: at most ``max_body_bytes``, or, carrying audio (``input_audio``), at
    most that and the largest audio file base64-encoded."""
    with_audio = config.max_body_bytes + 4 * -(-config.max_audio_bytes // 3)
    body = await read_body(request, with_audio)
    if len(body) > config.max_body_bytes and b'"input_audio"' not in body:
        raise APIError(
            413,
            f"request body: {len(body)} bytes is over the limit of {config.max_body_bytes} (without audio)",
            None,
            "too_large",
        )
    return body


def model_cards(state: GatewayState) -> list[dict]:
    """The chat model first (the web page takes the first), then the transcription model and its aliases."""
    ids = (state.config.model, *state.config.transcription_models())
    return [{"id": i, "object": "model", "created": state.started, "owned_by": "switchboard"} for i in ids]


async def models(request: Request):
    state = state_of(request)
    authenticate(request, state.config.keys)
    return {"object": "list", "data": model_cards(state)}


async def model(model_id: str, request: Request):
    state = state_of(request)
    authenticate(request, state.config.keys)
    for card in model_cards(state):
        if card["id"] == model_id:
            return card
    raise APIError(404, f"The model {model_id[:64]!r} does not exist", "model", "model_not_found")


async def healthz():
    return {"status": "ok"}


# -- the order-tools demo (the web chat's "order tools" switch) ----------------------------------
async def demo_tools(request: Request):
    """The demo's tools, OpenAI's definitions (switchboard/serving/order_demo.py)."""
    authenticate(request, state_of(request).config.keys)
    return {"tools": order_demo.TOOLS}


async def demo_call(name: str, request: Request):
    """One call of a demo tool: the JSON arguments the model wrote in, the fake order service's
    result out. Nothing here is a real order: it is what the page shows a tool loop with."""
    authenticate(request, state_of(request).config.keys)
    require_json(request)
    if name not in order_demo.NAMES:
        raise APIError(404, f"no demo tool {name[:64]!r} (one of {', '.join(order_demo.NAMES)})", None, "not_found")
    arguments = parse_body(await read_body(request, 4096))
    return order_demo.call(name, arguments)


async def readyz(request: Request):
    """200 once chat is ready; ``voice`` says whether the voice channel is too (its recognizer
    joins later after a fresh ``make serve``: text chat does not wait for it)."""
    state = state_of(request)
    if await state.client.ready():
        config = state.config
        voice = await state.client.model_ready(config.voice_model) and await state.client.model_ready(config.asr_model)
        return {"status": "ready", "voice": "ready" if voice else "not_ready"}
    raise overloaded(503, f"chat at {state.config.grpc_url} is not ready", state.config.retry_after_s)


async def index():
    return FileResponse(str(STATIC / "index.html"), headers=INDEX_HEADERS)


# -- errors: OpenAI's shape, never a traceback ------------------------------------------------------
def error_response(e: APIError) -> JSONResponse:
    headers = dict(e.headers)
    if e.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def api_error(request: Request, e: APIError):
    return error_response(e)


async def http_error(request: Request, e: StarletteHTTPException):
    message = {404: f"no route {request.url.path[:128]!r}", 405: f"method {request.method} not allowed"}
    return error_response(APIError(e.status_code, message.get(e.status_code, str(e.detail))))


async def unexpected(request: Request, e: Exception):
    log.exception("%s %s failed", request.method, request.url.path)
    return error_response(APIError(500, "internal error in the gateway", None, "server_error"))

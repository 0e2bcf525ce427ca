"""The gateway's handlers and the checks they share. Each reaches what the app holds (the
configuration, the chats in flight, the SDK client) at ``request.app.state.gateway``; ``app``
registers them.

A chat request is checked (content type, key, size, fields: ``mapping``) before any chat starts;
``chat``'s first answer is awaited before the HTTP status is sent, so a refusal gets its status
(400, 503...) even when streaming. A client that leaves cancels its chat: the gRPC stream is
cancelled, and ``chat`` stops the generation at its next check (``cancel_poll_ms``).
"""

from __future__ import annotations

import logging
from importlib import resources

from fastapi import Request
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from switchboard.gateway.errors import APIError, bad_request, overloaded
from switchboard.gateway.keys import Caller, KeyTable
from switchboard.gateway.mapping import Completion, parse_body, parse_request
from switchboard.gateway.state import GatewayState
from switchboard.gateway.streaming import ChatStreamResponse, ClientGone, collect, next_event, or_gone, sse_stream

log = logging.getLogger("switchboard.gateway")

PRIORITY_HEADER = "X-Switchboard-Priority"  # 1 (live/VIP) or 2; at best the key's tier allows
STATS_HEADER = "X-Switchboard-Stats"  # "1": the answer's stats under "switchboard" (the web page's "stats")
STATIC = resources.files("switchboard.gateway") / "static"
INDEX_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def state_of(request: Request) -> GatewayState:
    return request.app.state.gateway


# -- checks --------------------------------------------------------------------------------------
def require_json(request: Request) -> None:
    """415 unless the body is declared JSON. The types a browser may post to any origin without
    asking it first (a CORS preflight) are text/plain and the two form types: refusing them keeps
    a web page a user visits from posting chats to a gateway on their machine. Nothing but
    application/json: the body is OpenAI's request, no other JSON document type (``+json``)."""
    declared = request.headers.get("content-type")
    if declared is None:
        raise APIError(415, "Content-Type: missing; send application/json", None, "unsupported_media_type")
    media_type = declared.partition(";")[0].strip().lower()  # parameters (charset) are allowed
    if media_type != "application/json":
        raise APIError(
            415, f"Content-Type: expected application/json, got {media_type[:64]!r}", None, "unsupported_media_type"
        )


def authenticate(request: Request, keys: KeyTable) -> Caller:
    caller = keys.caller(request.headers.get("authorization"))
    if caller is None:
        given = "authorization" in request.headers
        message = "invalid API key" if given else "missing API key: send Authorization: Bearer <key>"
        raise APIError(401, message, None, "invalid_api_key" if given else "missing_api_key")
    return caller


def priority_of(request: Request, caller: Caller) -> int:
    """The header's priority (default: the best the key's tier allows); never better than that."""
    raw = request.headers.get(PRIORITY_HEADER)
    if raw is None:
        return caller.best_priority
    if raw.strip() not in ("1", "2"):
        raise bad_request(f"{PRIORITY_HEADER}: expected 1 (live) or 2 (default)", PRIORITY_HEADER)
    priority = int(raw)
    if priority < caller.best_priority:
        raise APIError(
            403,
            f"{PRIORITY_HEADER}: this API key's tier ({caller.tier}) allows priority {caller.best_priority} only",
            PRIORITY_HEADER,
            "priority_not_allowed",
        )
    return priority


async def read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise bad_request("Content-Length: not a number")
        if int(length) > limit:
            raise APIError(413, f"request body: {int(length)} bytes is over the limit of {limit}", None, "too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise APIError(413, f"request body: over the limit of {limit} bytes", None, "too_large")
    return bytes(body)


# -- routes --------------------------------------------------------------------------------------
async def chat_completions(request: Request):
    require_json(request)  # before the key, as 404 and 405: what the route takes, whoever asks
    state = state_of(request)
    config, slots = state.config, state.slots
    caller = authenticate(request, config.keys)
    priority = priority_of(request, caller)
    call = parse_request(parse_body(await read_body(request, config.max_body_bytes)), config.model)
    with_stats = request.headers.get(STATS_HEADER, "").strip().lower() in ("1", "true", "yes")
    if not slots.take():
        raise overloaded(429, f"too many chats in flight (limit {slots.limit}), retry later", config.retry_after_s)
    completion = Completion(call.model)
    events = state.client.stream(
        call.text,
        None,
        priority,
        call.max_tokens,
        call.temperature,
        call.top_p,
        call.seed,
        history=call.history,
    )
    released = False

    async def release():
        nonlocal released
        if not released:
            released = True
            slots.give()
            await events.aclose()  # cancels the chat if it is still running

    handed_over = False
    try:
        first = await or_gone(request, next_event(events, call, config.retry_after_s))
        headers = {"X-Request-Id": completion.id}
        if call.stream:
            body = sse_stream(events, first, call, completion, with_stats, config.retry_after_s)
            headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            handed_over = True  # the response releases the slot when it ends, however it ends
            return ChatStreamResponse(body, release, media_type="text/event-stream", headers=headers)
        text, stats, stopped = await or_gone(request, collect(events, first, call, config.retry_after_s))
        return JSONResponse(completion.response(text, stats, stopped, with_stats), headers=headers)
    except ClientGone:
        log.debug("client left before the answer: chat cancelled")
        return Response(status_code=499)
    finally:
        if not handed_over:
            await release()


def model_card(state: GatewayState) -> dict:
    return {"id": state.config.model, "object": "model", "created": state.started, "owned_by": "switchboard"}


async def models(request: Request):
    state = state_of(request)
    authenticate(request, state.config.keys)
    return {"object": "list", "data": [model_card(state)]}


async def model(model_id: str, request: Request):
    state = state_of(request)
    authenticate(request, state.config.keys)
    if model_id != state.config.model:
        raise APIError(404, f"The model {model_id[:64]!r} does not exist", "model", "model_not_found")
    return model_card(state)


async def healthz():
    return {"status": "ok"}


async def readyz(request: Request):
    state = state_of(request)
    if await state.client.ready():
        return {"status": "ready"}
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

"""The HTTP gateway: OpenAI's Chat Completions API and a web chat page in front of ``chat``,
which it reaches over gRPC with the SDK (``AsyncChatClient``: one channel, streams kept open
between chats).

Routes: ``POST /v1/chat/completions`` (JSON, or server-sent events with ``"stream": true``),
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /healthz`` (the gateway runs),
``GET /readyz`` (``chat`` is ready behind it), ``GET /`` (the web chat) and ``/static/``.

A request is checked (key, size, fields: ``mapping``) before any chat starts; ``chat``'s first
answer is awaited before the HTTP status is sent, so a refusal gets its status (400, 503...)
even when streaming. A client that leaves cancels its chat: the gRPC stream is cancelled, and
``chat`` stops the generation at its next check (``cancel_poll_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from switchboard.client.sdk import AsyncChatClient, ChatError
from switchboard.gateway.errors import APIError, bad_request, from_chat_error, overloaded
from switchboard.gateway.keys import Caller, KeyTable
from switchboard.gateway.mapping import (
    Completion,
    CompletionCall,
    StopScanner,
    finish_reason,
    parse_body,
    parse_request,
    sse,
)
from switchboard.wire import ChatStats

log = logging.getLogger("switchboard.gateway")

PRIORITY_HEADER = "X-Switchboard-Priority"  # 1 (live/VIP) or 2; at best the key's tier allows
STATS_HEADER = "X-Switchboard-Stats"  # "1": the answer's stats under "switchboard" (the web page's "stats")
STATIC = resources.files("switchboard.gateway") / "static"


@dataclass
class GatewayConfig:
    grpc_url: str = "127.0.0.1:8001"
    model: str = "switchboard"  # the model id clients name (GET /v1/models)
    chat_model: str = "chat"  # the Triton model behind it
    keys: KeyTable = field(default_factory=KeyTable)
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 1 << 20
    max_inflight: int = 256  # chats at once through this gateway; beyond: 429
    retry_after_s: int = 1
    timeout_s: float = 120.0  # no response from chat for this long: 504


class ClientGone(Exception):
    """The HTTP client disconnected."""


class Slots:
    """Chats in flight through this gateway. Used from the event loop's thread only."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def take(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used -= 1


class ChatStreamResponse(StreamingResponse):
    """A streaming response whose ``cleanup`` always runs: the body finished, the client left
    (Starlette then stops iterating, without closing the iterator), or the body never started."""

    def __init__(self, content, cleanup, **kw):
        super().__init__(content, **kw)
        self.cleanup = cleanup

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            await self.cleanup()


def error_response(e: APIError) -> JSONResponse:
    headers = dict(e.headers)
    if e.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


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


async def until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def or_gone(request: Request, awaitable):
    """``awaitable``'s result, or ``ClientGone`` (and ``awaitable`` cancelled) if the client leaves first."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(until_disconnected(request))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if work not in done:
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        raise ClientGone()
    return work.result()


def create_app(config: GatewayConfig) -> FastAPI:
    slots = Slots(config.max_inflight)
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.client = AsyncChatClient(config.grpc_url, config.chat_model, timeout_s=config.timeout_s)
        try:
            yield
        finally:
            await app.state.client.close()

    app = FastAPI(title="Switchboard", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", PRIORITY_HEADER, STATS_HEADER],
            expose_headers=["Retry-After", "X-Request-Id"],
            max_age=600,
        )

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        message = {404: f"no route {request.url.path[:128]!r}", 405: f"method {request.method} not allowed"}
        return error_response(APIError(e.status_code, message.get(e.status_code, str(e.detail))))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(APIError(500, "internal error in the gateway", None, "server_error"))

    def authenticate(request: Request) -> Caller:
        caller = config.keys.caller(request.headers.get("authorization"))
        if caller is None:
            given = "authorization" in request.headers
            message = "invalid API key" if given else "missing API key: send Authorization: Bearer <key>"
            raise APIError(401, message, None, "invalid_api_key" if given else "missing_api_key")
        return caller

    def model_card() -> dict:
        return {"id": config.model, "object": "model", "created": started, "owned_by": "switchboard"}

    @app.get("/v1/models")
    async def models(request: Request):
        authenticate(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request):
        authenticate(request)
        if model_id != config.model:
            raise APIError(404, f"The model {model_id[:64]!r} does not exist", "model", "model_not_found")
        return model_card()

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request):
        if await request.app.state.client.ready():
            return {"status": "ready"}
        raise overloaded(503, f"chat at {config.grpc_url} is not ready", config.retry_after_s)

    @app.get("/")
    async def index():
        return FileResponse(
            str(STATIC / "index.html"),
            headers={
                "Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'",
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "no-cache",
            },
        )

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        caller = authenticate(request)
        priority = priority_of(request, caller)
        call = parse_request(parse_body(await read_body(request, config.max_body_bytes)), config.model)
        with_stats = request.headers.get(STATS_HEADER, "").strip().lower() in ("1", "true", "yes")
        if not slots.take():
            raise overloaded(429, f"too many chats in flight (limit {slots.limit}), retry later", config.retry_after_s)
        completion = Completion(call.model)
        events = request.app.state.client.stream(
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
            first = await or_gone(request, _next(events, call, config))
            headers = {"X-Request-Id": completion.id}
            if call.stream:
                body = _sse(events, first, call, completion, with_stats, config)
                headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
                handed_over = True  # the response releases the slot when it ends, however it ends
                return ChatStreamResponse(body, release, media_type="text/event-stream", headers=headers)
            text, stats, stopped = await or_gone(request, _collect(events, first, call, config))
            return JSONResponse(completion.response(text, stats, stopped, with_stats), headers=headers)
        except ClientGone:
            log.debug("client left before the answer: chat cancelled")
            return Response(status_code=499)
        finally:
            if not handed_over:
                await release()

    return app


async def _next(events, call: CompletionCall, config: GatewayConfig):
    """The next event of a chat (text delta or ChatStats), ChatError as APIError; None at the end."""
    try:
        return await events.__anext__()
    except StopAsyncIteration:
        return None
    except ChatError as e:
        raise from_chat_error(e.code, str(e), config.retry_after_s, call.max_tokens_param) from None


async def _collect(events, first, call: CompletionCall, config: GatewayConfig) -> tuple[str, ChatStats | None, bool]:
    scanner, parts, event = StopScanner(call.stop), [], first
    while event is not None and not isinstance(event, ChatStats):
        parts.append(scanner.feed(event))
        event = await _next(events, call, config)  # after a stop sequence: on to the stats (usage)
    parts.append(scanner.flush())
    return "".join(parts), event, scanner.stopped


async def _sse(events, first, call: CompletionCall, completion: Completion, with_stats: bool, config):
    """The chat as OpenAI's stream: a first chunk with the role, content deltas, a chunk with the
    finish reason, the usage chunk when asked for (with the stats under ``switchboard`` when
    asked for too), ``[DONE]``. An error after the first chunk is an ``error`` event (the
    status line is gone)."""
    scanner, event, opened, finished = StopScanner(call.stop), first, False, False
    usage = call.include_usage
    try:
        while event is not None and not isinstance(event, ChatStats):
            text = scanner.feed(event)
            if not finished and (text or not opened):
                delta = {"content": text} if opened else {"role": "assistant", "content": text}
                yield sse(completion.chunk(delta, include_usage=usage))
                opened = True
            if scanner.stopped and not finished:
                finished = True
                yield sse(completion.chunk({}, "stop", include_usage=usage))
                if not usage:
                    break  # nothing more to send: the chat is cancelled (release)
            event = await _next(events, call, config)  # after a stop sequence: on to the stats (usage)
        stats = event if isinstance(event, ChatStats) else None
        if not finished:
            tail = scanner.flush()
            if tail:
                yield sse(completion.chunk({"content": tail}, include_usage=usage))
            yield sse(completion.chunk({}, finish_reason(stats, False), include_usage=usage))
        if usage:
            yield sse(completion.usage_chunk(stats, with_stats))
    except APIError as e:
        yield sse(e.body())
    yield sse("[DONE]")

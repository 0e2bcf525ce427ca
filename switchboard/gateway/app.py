"""The HTTP gateway: OpenAI's Chat Completions API (text, or the caller's audio) and Audio
Transcriptions API, and a web chat page, in front of ``chat``, ``voice_chat`` and ``asr``, which
it reaches over gRPC with the SDK (``AsyncChatClient``: one channel, streams kept open between
requests). This module wires the app: the routes (handlers in ``routes`` and ``audio``, the
answer's stream in ``streaming``), error handlers, CORS, the static files, the SDK client's lifetime.
"""

from __future__ import annotations

import contextlib
import time

from fastapi import APIRouter, FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from switchboard.client import AsyncChatClient
from switchboard.gateway import audio, routes
from switchboard.gateway.checks import PRIORITY_HEADER, STATS_HEADER
from switchboard.gateway.errors import APIError
from switchboard.gateway.routes import STATIC
from switchboard.gateway.state import GatewayConfig, GatewayState, Slots

__all__ = ["GatewayConfig", "ROUTES", "create_app"]

# (path, handler, methods). Each route that takes a body checks its type: the chat JSON, the
# transcription multipart (415 otherwise).
ROUTES = [
    ("/v1/chat/completions", routes.chat_completions, ["POST"]),  # JSON, or server-sent events with "stream": true
    ("/v1/audio/transcriptions", audio.transcriptions, ["POST"]),  # multipart; "stream": server-sent events
    ("/v1/models", routes.models, ["GET"]),
    ("/v1/models/{model_id:path}", routes.model, ["GET"]),
    ("/healthz", routes.healthz, ["GET"]),  # the gateway runs
    ("/readyz", routes.readyz, ["GET"]),  # chat is ready behind it (and whether voice is)
    ("/", routes.index, ["GET"]),  # the web chat (its files: /static/)
    ("/demo/tools", routes.demo_tools, ["GET"]),  # the web chat's order tools (a fake order service)
    ("/demo/tools/{name}", routes.demo_call, ["POST"]),
]
EXCEPTION_HANDLERS = [
    (APIError, routes.api_error),
    (StarletteHTTPException, routes.http_error),  # 404, 405 in OpenAI's shape
    (Exception, routes.unexpected),
]


def router() -> APIRouter:
    r = APIRouter()
    for path, handler, methods in ROUTES:
        r.add_api_route(path, handler, methods=methods)
    return r


def create_app(config: GatewayConfig, client=None) -> FastAPI:
    """The app. ``client``: what reaches the server (``AsyncChatClient``'s ``stream``, ``ready``,
    and for the voice routes ``voice_stream``, ``transcribe_stream``, ``model_ready``);
    by default an ``AsyncChatClient`` on ``config.grpc_url``, made and closed by the app's lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state: GatewayState = app.state.gateway
        state.client = client or AsyncChatClient(
            config.grpc_url,
            config.chat_model,
            timeout_s=config.timeout_s,
            asr_model=config.asr_model,
            voice_model=config.voice_model,
        )
        try:
            yield
        finally:
            if client is None:
                await state.client.close()

    app = FastAPI(title="Switchboard", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.gateway = GatewayState(config, Slots(config.max_inflight), started=int(time.time()))
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", PRIORITY_HEADER, STATS_HEADER],
            expose_headers=["Retry-After", "X-Request-Id"],
            max_age=600,
        )
    for exc_class, handler in EXCEPTION_HANDLERS:
        app.add_exception_handler(exc_class, handler)
    app.include_router(router())
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    return app

"""The checks every route of the gateway makes before it calls the server: what the body is
declared as, the API key, the priority asked for, the body's size; and where a handler finds
what the app holds (``state_of``)."""

from __future__ import annotations

from fastapi import Request

from switchboard.common import tracing
from switchboard.gateway.errors import APIError, bad_request
from switchboard.gateway.keys import Caller, KeyTable
from switchboard.gateway.state import GatewayState

PRIORITY_HEADER = "X-Switchboard-Priority"  # 1 (live/VIP) or 2; at best the key's tier allows
STATS_HEADER = "X-Switchboard-Stats"  # "1": the answer's stats under "switchboard" (the web page's "stats")


def state_of(request: Request) -> GatewayState:
    return request.app.state.gateway


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


def refuse_foreign_origin(request: Request, allowed: tuple[str, ...]) -> None:
    """403 for a POST a web page of another origin made (its ``Origin`` neither this gateway's
    nor one of ``--cors-origins``). Uploads are multipart, a type a page may post anywhere without
    a CORS preflight; this keeps a page a user visits from spending the gateway's recognizer
    (an open gateway's, on the user's machine) on its uploads. Clients outside a browser send no Origin."""
    origin = request.headers.get("origin")
    if origin is None or "*" in allowed or origin in allowed:
        return
    scheme, _, host = origin.partition("://")
    if host and host == request.headers.get("host") and scheme == request.url.scheme:
        return  # the gateway's own page
    raise APIError(403, f"Origin {origin[:64]!r} may not post here (see --cors-origins)", None, "origin_not_allowed")


def wants_stats(request: Request) -> bool:
    return request.headers.get(STATS_HEADER, "").strip().lower() in ("1", "true", "yes")


def trace_request(request: Request, name: str, **attributes):
    """The request's span (not current: handlers share the event loop's thread), joining the
    caller's ``traceparent`` when it sent a valid one; the gateway decides the sampling."""
    parent = tracing.extract(request.headers.get("traceparent"))
    return tracing.active().start(name, parent, attributes=attributes)

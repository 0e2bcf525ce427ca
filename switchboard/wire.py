"""The wire contract between Switchboard's server and its clients (the SDK, perf tools, the
``chat`` model calling its pools): what both sides must agree on, in one place. The SDK imports
only this module from the server side.

Priorities. ``1`` (live/VIP) or ``2`` (default), sent as Triton's request priority (which
orders the model's queue) and as the request parameter ``chat_priority``, which the pipeline
carries to the engine's scheduler (Python models in Triton 2.51 cannot read Triton's
priority).

Status codes are carried in the text of error messages. Over a gRPC stream, Triton 2.51 sends
a model's error code only when the client opens the stream with the header
``triton_grpc_error: true``, and that mode ends the stream with a gRPC status, a path in which
2.51 can crash (docs/reliability.md). So the models put the code at the head of the message,
``[INVALID_ARG] text: empty message``, which any client sees (the SDK, perf_analyzer, a
hand-written client) and the SDK turns back into a gRPC status name.
"""

from __future__ import annotations

import re

PRIORITY_LIVE, PRIORITY_DEFAULT = 1, 2
PRIORITY_PARAMETER = "chat_priority"

# Triton's error codes (TRITONSERVER_Error_Code) to the gRPC status names clients know.
GRPC_NAMES = {
    "UNKNOWN": "UNKNOWN",
    "INTERNAL": "INTERNAL",
    "NOT_FOUND": "NOT_FOUND",
    "INVALID_ARG": "INVALID_ARGUMENT",
    "UNAVAILABLE": "UNAVAILABLE",
    "UNSUPPORTED": "UNIMPLEMENTED",
    "ALREADY_EXISTS": "ALREADY_EXISTS",
    "CANCELLED": "CANCELLED",
}

_TAG = re.compile(r"\[([A-Z_]+)\] ")


def tag(code: str, message: str) -> str:
    """``message`` headed by the Triton code name, e.g. ``tag("INVALID_ARG", "text: empty")``."""
    if code not in GRPC_NAMES:
        raise ValueError(f"unknown Triton error code {code!r}")
    return f"[{code}] {message}"


def untag(message: str) -> tuple[str | None, str]:
    """(gRPC status name or None, message without its tag). Messages Triton wrote itself (a
    wrong dtype or shape, refused before the model runs) carry no tag and give None."""
    match = _TAG.match(message)
    if match is None or match.group(1) not in GRPC_NAMES:
        return None, message
    return GRPC_NAMES[match.group(1)], message[match.end() :]


# gRPC backs off between attempts to reach a server that is down, 1 s growing to 120 s, and
# every channel of a process to the same address shares that state (one subchannel): after a
# restart by switchboard.ops.supervisor (~15-25 s) even a channel opened once the server was back
# failed at once with UNAVAILABLE for seconds, and a supervisor probe in such a process failed
# on the new, healthy server. Capped at 1 s, clients reach it within about a second.
RECONNECT_BACKOFF_MS = 1000


def channel_args(private: bool = False) -> list[tuple[str, int]]:
    """tritonclient's channel options with the reconnect backoff capped. ``private``: a
    subchannel of its own (a new connection), for a health check that must see the server,
    not the state this process's other channels are in."""
    import tritonclient.grpc as grpcclient

    keepalive = grpcclient.KeepAliveOptions()
    args = [
        ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
    ]
    if private:
        args.append(("grpc.use_local_subchannel_pool", 1))
    return args

"""Status codes carried in the text of error messages.

Over a gRPC stream, Triton 2.51 sends a model's error code only when the client opens the
stream with the header ``triton_grpc_error: true``, and that mode ends the stream with a gRPC
status, a path in which 2.51 can crash (see the README, "Reliability"). So the models put the
code at the head of the message, ``[INVALID_ARG] text: empty message``, which any client sees
(the SDK, perf_analyzer, a hand-written client) and the SDK turns back into a gRPC status name.
"""

from __future__ import annotations

import re

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
    return GRPC_NAMES[match.group(1)], message[match.end():]

"""The HTTP/1.1 protocol uvicorn serves the gateway with (``HTTP_PROTOCOL``, its ``http=``).

uvicorn's httptools protocol (the fast one, chosen when httptools is installed) frames every
response without a Content-Length as chunked, to HTTP/1.0 requests too, which know no chunked
coding: an HTTP/1.0 client reads the chunk sizes as part of a streamed answer (uvicorn's h11
protocol gets this right; the fix for httptools, uvicorn#1360, was closed unmerged). HTTP/1.0's
way to end a body of unknown length is to close the connection, which uvicorn does after every
response to HTTP/1.0 anyway (it keeps none alive). ``CloseDelimitedHttpTools`` sends such
responses that way; HTTP/1.1 requests go through uvicorn's code untouched.
"""

from __future__ import annotations

import sys

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
except ImportError:  # no httptools: uvicorn's h11 protocol, which needs no fix
    HttpToolsProtocol = None


def close_delimited(cycle: RequestResponseCycle):
    """``cycle.send`` for an HTTP/1.0 request: a response with neither Content-Length nor
    Transfer-Encoding goes out unframed. uvicorn adds chunked framing only when it has chosen no
    framing at the response's start, and counts a known length down as the body goes out,
    closing the connection after the last part: it is given a length it cannot reach, and at
    the last part the length of that part."""
    send = cycle.send
    unframed = False

    async def send_close_delimited(message) -> None:
        nonlocal unframed
        if message["type"] == "http.response.start":
            names = {name.lower() for name, _ in message.get("headers", ())}
            unframed = b"content-length" not in names and b"transfer-encoding" not in names
            if unframed:
                cycle.chunked_encoding = False
                cycle.expected_content_length = sys.maxsize
        elif unframed and message["type"] == "http.response.body" and not message.get("more_body", False):
            cycle.expected_content_length = len(message.get("body", b""))
        await send(message)

    return send_close_delimited


if HttpToolsProtocol is not None:

    class CloseDelimitedHttpTools(HttpToolsProtocol):
        """uvicorn's httptools protocol; responses of unknown length to HTTP/1.0 requests close-delimited."""

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            cycle = self.cycle
            # A new cycle, not yet started (its task runs later on this loop); none on an upgrade.
            if self.scope.get("http_version") == "1.0" and cycle is not None and cycle.scope is self.scope:
                cycle.send = close_delimited(cycle)

    HTTP_PROTOCOL: type | str = CloseDelimitedHttpTools
else:
    HTTP_PROTOCOL = "h11"

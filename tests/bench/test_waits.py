"""Waiting for a peer or an HTTP server, on the product's ``wait_until``: ready, or the error
names what died."""

import http.server
import threading

import pytest

from perf.peers import wait_ready
from perf.servertools import wait_http


class _Dead:
    returncode = 3

    def poll(self):
        return 3


class _Peer:
    port = 9

    def __init__(self, ready_after: int):
        self.calls, self.ready_after = 0, ready_after

    def ready(self) -> bool:
        self.calls += 1
        return self.calls > self.ready_after


def test_wait_ready_returns_when_the_peer_is_ready_and_names_it_when_it_exits():
    peer = _Peer(ready_after=2)
    wait_ready(peer, 5)
    assert peer.calls == 3
    with pytest.raises(RuntimeError, match="the LitServe peer on :9 exited with code 3"):
        wait_ready(_Peer(ready_after=10**9), 5, _Dead(), "the LitServe peer")


def test_wait_http_returns_on_a_200():
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wait_http(f"http://127.0.0.1:{server.server_address[1]}/readyz", 5)
    finally:
        server.shutdown()

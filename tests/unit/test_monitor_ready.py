"""Readiness is a GET answered 200: Monitor.start waits for Prometheus's ``/-/ready``, not only
for its port (until its storage is open, Prometheus answers every query 503), and the stack for
Triton's ``/v2/health/ready``."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from switchboard.ops.process import http_ok


def test_ready_only_once_the_ready_endpoint_answers_200():
    answers = [503, 503, 200]
    paths = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            paths.append(self.path)
            self.send_response(answers.pop(0))
            self.end_headers()
            self.wfile.write(b"Service Unavailable")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert [http_ok(f"{url}/-/ready") for _ in range(3)] == [False, False, True]
        assert paths == ["/-/ready"] * 3
    finally:
        server.shutdown()
        server.server_close()
    assert not http_ok(f"{url}/-/ready")  # nothing listening

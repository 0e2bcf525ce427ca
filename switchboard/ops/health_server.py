"""The supervisor's own health over HTTP for an orchestrator (deploy/k8s, docs/kubernetes.md):
``LIVENESS_PATH`` (its rounds go on and its restarts do not keep failing) and
``READINESS_PATH`` (the server runs, answered its warm-up, and no probe has failed since)."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Callable

LIVENESS_PATH = "/livez"
READINESS_PATH = "/readyz"


class ProbeServer:
    """``LIVENESS_PATH`` and ``READINESS_PATH`` over HTTP on a thread of their own: 200 when
    ``why_not_live`` / ``why_not_ready`` give None, else 503; the body is the reason as JSON."""

    def __init__(self, address: str, port: int, why_not_live: Callable, why_not_ready: Callable):
        checks = {LIVENESS_PATH: why_not_live, READINESS_PATH: why_not_ready}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                check = checks.get(self.path.split("?")[0])
                reason = check() if check else "not found"
                body = json.dumps({"ok": reason is None, "reason": reason}).encode()
                self.send_response(404 if check is None else 200 if reason is None else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # kubelet asks every few seconds: not worth a line
                pass

        self.server = http.server.ThreadingHTTPServer((address, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="probe-server", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

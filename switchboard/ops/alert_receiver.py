"""Alertmanager's destination in the stack `make monitor` starts: a webhook receiver that keeps
every notification it is sent. ``python -m switchboard.ops.alert_receiver --port 9095 --out FILE``.

Each POST from Alertmanager (its webhook payload, version 4) is appended as one JSON line to
``FILE`` with the time it arrived, and each alert in it is logged on one line, so a page that
fired can be read back after the fact without Alertmanager's UI. GET answers 200: the readiness
check ``Monitor`` waits on.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

log = logging.getLogger("switchboard.alerts")

MAX_BODY = 1 << 20  # Alertmanager's notifications are a few KB; refuse anything far larger


def describe(alert: dict) -> str:
    """One log line for one alert of a notification."""
    labels = alert.get("labels", {})
    others = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
    summary = alert.get("annotations", {}).get("summary", "")
    return (
        f"{alert.get('status', '?')} {labels.get('alertname', '?')}"
        + (f" ({others})" if others else "")
        + (f": {summary}" if summary else "")
    )


class AlertLog:
    """The JSONL file notifications go to; one writer at a time (the server is threaded)."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()

    def record(self, notification: dict) -> None:
        line = json.dumps({"received_at": time.time(), **notification}, sort_keys=True)
        with self._lock, self.path.open("a") as f:
            f.write(line + "\n")
        for alert in notification.get("alerts", []):
            log.warning("alert %s", describe(alert))

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


class _Handler(BaseHTTPRequestHandler):
    server: AlertServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(HTTPStatus.OK, b"ok\n")

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, b"too large\n")
            return
        try:
            notification = json.loads(self.rfile.read(length))
            if not isinstance(notification, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            log.error("refused a notification that is not Alertmanager's JSON: %s", e)
            self._answer(HTTPStatus.BAD_REQUEST, b"expected Alertmanager's webhook JSON\n")
            return
        self.server.alerts.record(notification)
        self._answer(HTTPStatus.OK, b"ok\n")

    def _answer(self, status: HTTPStatus, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
        log.debug(format, *args)


class AlertServer(ThreadingHTTPServer):
    """The webhook on ``host:port`` (port 0: a free one, read back from ``port``)."""

    daemon_threads = True

    def __init__(self, out: Path, host: str = "127.0.0.1", port: int = 9095):
        self.alerts = AlertLog(out)
        super().__init__((host, port), _Handler)

    @property
    def port(self) -> int:
        return self.server_address[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.ops.alert_receiver", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9095)
    p.add_argument("--out", type=Path, required=True, help="the JSONL file notifications are appended to")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with AlertServer(args.out, args.host, args.port) as server:
        log.info("receiving Alertmanager's webhooks on http://%s:%d, kept in %s", args.host, server.port, args.out)
        try:
            server.serve_forever()
        except KeyboardInterrupt:  # `make stop` sends SIGINT
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

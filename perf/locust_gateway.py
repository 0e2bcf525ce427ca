"""Locust users for ``perf.gateway_cost`` (run by it as ``locust -f`` in a process of its
own: Locust runs on gevent, which must not enter the gateway or a test process).

Two users ask the same corpus questions, streaming, closed loop: ``GatewayUser`` through the
HTTP gateway (``POST /v1/chat/completions``, server-sent events), ``GrpcUser`` straight to
``chat`` through the SDK (gRPC). Each chat is reported to Locust, and written with its time to
first token at full precision to ``SWITCHBOARD_SAMPLES`` (one JSON line each), which the tool
reads: Locust's own percentiles round to whole milliseconds, too coarse for a 2 ms bound. Each
sample also carries ``chat``'s own time to first token (its stats; through the gateway with
``X-Switchboard-Stats: 1``), so the tool can tell the time spent outside ``chat`` from the server's.
"""

from __future__ import annotations

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # gRPC's core cooperates with gevent's greenlets (before any channel)

import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

from locust import HttpUser, User, task  # noqa: E402

from switchboard.client import ChatClient, ChatStats  # noqa: E402

QUESTIONS = json.loads(os.environ["SWITCHBOARD_QUESTIONS"])
MAX_TOKENS = int(os.environ.get("SWITCHBOARD_MAX_TOKENS", "48"))
SAMPLES = open(os.environ["SWITCHBOARD_SAMPLES"], "a", buffering=1)
STATS = {"X-Switchboard-Stats": "1"}  # chat's own stats in the usage chunk (switchboard.gateway.app)
_next = itertools.count()


def _question() -> str:
    return QUESTIONS[next(_next) % len(QUESTIONS)]


def _record(
    env, path: str, t0: float, ttft: float | None, tokens: int, error: Exception | None, server_ttft_ms=None
) -> None:
    end = time.perf_counter()
    env.events.request.fire(
        request_type="CHAT", name=path, response_time=(end - t0) * 1000, response_length=tokens, exception=error
    )
    SAMPLES.write(
        json.dumps(
            {
                "path": path,
                "t0": t0,
                "end": end,
                "ttft_s": ttft,
                "server_ttft_ms": server_ttft_ms,
                "tokens": tokens,
                "ok": error is None,
            }
        )
        + "\n"
    )


class GatewayUser(HttpUser):
    """OpenAI's streaming chat completions through the gateway."""

    @task
    def chat(self):
        body = {
            "model": "switchboard",
            "messages": [{"role": "user", "content": _question()}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0, ttft, tokens, error, server_ttft = time.perf_counter(), None, 0, None, None
        try:
            with self.client.post(
                "/v1/chat/completions", json=body, headers=STATS, stream=True, catch_response=True, name="http"
            ) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
                for line in r.iter_lines():
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if ttft is None and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                        ttft = time.perf_counter() - t0
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                        server_ttft = chunk.get("switchboard", {}).get("ttft_ms")
                r.success()  # reported once below, with the chat's own timing
        except Exception as e:  # counted as a failed chat
            error = e
        _record(self.environment, "http", t0, ttft, tokens, error, server_ttft)


class GrpcUser(User):
    """The same chats straight to chat over gRPC (the SDK)."""

    def on_start(self):
        self.client = ChatClient(os.environ["SWITCHBOARD_GRPC_URL"], timeout_s=60)

    @task
    def chat(self):
        t0, ttft, tokens, error, server_ttft = time.perf_counter(), None, 0, None, None
        try:
            for event in self.client.chat(_question(), max_new_tokens=MAX_TOKENS, temperature=0.0):
                if isinstance(event, ChatStats):
                    tokens, server_ttft = event.generated_tokens, event.ttft_ms
                elif ttft is None and event:
                    ttft = time.perf_counter() - t0
        except Exception as e:
            error = e
        _record(self.environment, "grpc", t0, ttft, tokens, error, server_ttft)

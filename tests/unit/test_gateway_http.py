"""The gateway's app on the wire, in front of a fake ``chat``: uvicorn in a thread on a socket of
its own, with the protocol ``python -m switchboard.gateway`` runs it with. A chat must be
declared JSON (415 otherwise: a browser posts text/plain and forms across origins without a
preflight); a streamed answer to HTTP/1.0 is close-delimited, to HTTP/1.1 chunked."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest
import uvicorn

from switchboard.client import ToolCallDeltas
from switchboard.gateway.app import ROUTES, GatewayConfig, create_app
from switchboard.gateway.server import HTTP_PROTOCOL
from switchboard.wire import ChatStats, FinishReason

ANSWER = ["You can ", "track it ", "in My Orders."]
CHAT = {"model": "switchboard", "messages": [{"role": "user", "content": "Where is my order?"}]}


class FakeChat:
    """``AsyncChatClient``'s face: every chat answers ``ANSWER`` in three deltas, then its stats."""

    def __init__(self):
        self.chats = 0

    def stream(self, request):
        self.chats += 1
        self.request = request
        return self._calls() if request.tools else self._events()

    async def _calls(self):  # with tools: one call, its arguments in two deltas
        yield ToolCallDeltas(
            [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]
        )
        yield ToolCallDeltas([{"index": 0, "function": {"arguments": '{"a":'}}])
        yield ToolCallDeltas([{"index": 0, "function": {"arguments": "1}"}}])
        yield ChatStats(prompt_tokens=12, generated_tokens=7, finish_reason=FinishReason.TOOL_CALLS)

    async def _events(self):
        for delta in ANSWER:
            yield delta
        yield ChatStats(prompt_tokens=12, generated_tokens=7)

    async def ready(self) -> bool:
        return True


@pytest.fixture(scope="module")
def chat() -> FakeChat:
    return FakeChat()


@pytest.fixture(scope="module")
def gateway(chat):
    """(host, port) of the app, served as ``python -m switchboard.gateway`` serves it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(GatewayConfig(), client=chat), http=HTTP_PROTOCOL, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield sock.getsockname()
    server.should_exit = True
    thread.join(10)
    sock.close()


def post(address, content_type: str | None, payload: dict = CHAT):
    """(status, headers, body) of a chat posted with this Content-Type (None: without one)."""
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        headers = {"Content-Type": content_type} if content_type is not None else {}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(payload).encode(), headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def raw_exchange(address, request: bytes) -> bytes:
    """The bytes the server sends back until it closes the connection."""
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(request)
        data = b""
        while True:
            try:
                part = s.recv(65536)
            except TimeoutError:
                pytest.fail(f"the answer is over but the connection was not closed: {data!r}")
            if not part:
                return data
            data += part


def chat_request(version: str, stream: bool = True) -> bytes:
    body = json.dumps({**CHAT, "stream": stream}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/{version}\r\nHost: gateway\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def split(response: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def events(body: bytes) -> list[str]:
    """The data of each server-sent event; fails on anything that is not one (a chunk size)."""
    assert body.endswith(b"\n\n"), body[-80:]
    out = []
    for event in body.decode().split("\n\n")[:-1]:
        assert event.startswith("data: "), event
        out.append(event.removeprefix("data: "))
    return out


def answer_of(data: list[str]) -> str:
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)


# -- 415 unless the body is declared JSON ---------------------------------------------------------
@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",  # what a page's fetch() or a form sends, no preflight asked
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
        "",
        "application/jsonx",
        "text/json",
    ],
)
def test_a_chat_not_declared_json_is_refused_with_415(gateway, chat, content_type):
    before = chat.chats
    status, headers, body = post(gateway, content_type)
    assert status == 415, body
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "unsupported_media_type"
    assert set(error) == {"message", "type", "param", "code"} and "application/json" in error["message"]
    assert chat.chats == before  # refused before a chat started


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"]
)
def test_a_chat_declared_json_is_answered(gateway, content_type):
    status, _, body = post(gateway, content_type)
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"] == "".join(ANSWER)


def test_the_content_type_is_checked_by_the_chat_route_only(gateway):
    conn = http.client.HTTPConnection(*gateway, timeout=10)
    try:
        conn.request("GET", "/v1/models", headers={"Content-Type": "text/plain"})
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["data"][0]["id"] == "switchboard"
    finally:
        conn.close()


# -- framing of a streamed answer -------------------------------------------------------------------
def test_a_streamed_answer_to_http_1_0_is_close_delimited(gateway):
    status, headers, body = split(raw_exchange(gateway, chat_request("1.0")))
    assert status.endswith(" 200 OK")
    assert "transfer-encoding" not in headers and "content-length" not in headers
    assert headers["connection"] == "close" and headers["content-type"].startswith("text/event-stream")
    assert answer_of(events(body)) == "".join(ANSWER)  # the events as they are, no chunk sizes


def test_a_whole_answer_to_http_1_0_keeps_its_length(gateway):
    status, headers, body = split(raw_exchange(gateway, chat_request("1.0", stream=False)))
    assert status.endswith(" 200 OK") and "transfer-encoding" not in headers
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body)["choices"][0]["message"]["content"] == "".join(ANSWER)


def test_a_streamed_answer_to_http_1_1_is_chunked_on_a_kept_connection(gateway):
    with socket.create_connection(gateway, timeout=10) as s:
        for _ in range(2):  # the second answer on the same connection: it was kept alive
            s.sendall(chat_request("1.1"))
            data = b""
            while not data.endswith(b"\r\n0\r\n\r\n"):
                part = s.recv(65536)
                assert part, f"the connection closed: {data!r}"
                data += part
            status, headers, body = split(data)
            assert status.endswith(" 200 OK") and headers["transfer-encoding"] == "chunked"
            assert "connection" not in headers
            unchunked = b""
            while True:
                size, _, body = body.partition(b"\r\n")
                if int(size, 16) == 0:
                    break
                unchunked, body = unchunked + body[: int(size, 16)], body[int(size, 16) + 2 :]
            assert answer_of(events(unchunked)) == "".join(ANSWER)


def test_routes_are_module_level_handlers():
    for path, handler, methods in ROUTES:
        assert handler.__qualname__ == handler.__name__, f"{path}: {handler.__qualname__} is not module-level"
        assert methods and path.startswith("/")


def test_tool_calls_whole_and_streamed(gateway):
    tools = {"tools": [{"type": "function", "function": {"name": "f"}}]}
    status, _, body = post(gateway, "application/json", {**CHAT, **tools})
    choice = json.loads(body)["choices"][0]
    assert status == 200 and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    ]
    status, _, body = post(gateway, "application/json", {**CHAT, **tools, "stream": True})
    chunks = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and deltas[0]["tool_calls"][0]["id"] == "call_1"
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d) == '{"a":1}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_demo_order_service(gateway):
    conn = http.client.HTTPConnection(*gateway, timeout=10)
    try:
        conn.request("GET", "/demo/tools")
        r = conn.getresponse()
        names = [t["function"]["name"] for t in json.loads(r.read())["tools"]]
        assert r.status == 200 and names == ["get_order_status", "start_return", "transfer_to_human"]
        for path, body, status, needle in [
            ("/demo/tools/get_order_status", {"order_id": "SB12345675"}, 200, '"status":"shipped"'),
            ("/demo/tools/get_order_status", {"order_id": "nope"}, 200, "order not found"),
            ("/demo/tools/delete_everything", {}, 404, "no demo tool"),
        ]:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            text = r.read().decode().replace(" ", "")
            assert r.status == status and needle.replace(" ", "") in text, text
    finally:
        conn.close()


def test_penalties_reach_the_chat(gateway, chat):
    status, _, _ = post(gateway, "application/json", {**CHAT, "presence_penalty": 1.5, "frequency_penalty": 0})
    assert status == 200 and (chat.request.presence_penalty, chat.request.frequency_penalty) == (1.5, 0.0)
    status, _, body = post(gateway, "application/json", {**CHAT, "presence_penalty": 2.5})
    error = json.loads(body)["error"]
    assert status == 400 and error["param"] == "presence_penalty" and "outside [-2, 2]" in error["message"]


def test_a_callers_traceparent_reaches_chat_through_the_gateways_span(gateway, chat):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from switchboard.common import tracing

    memory = InMemorySpanExporter()
    tracing.configure(tracing.TraceSettings(delay_s=0.01), exporter=memory, edge=True)
    try:
        trace_id, caller = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        conn = http.client.HTTPConnection(*gateway, timeout=10)
        headers = {"Content-Type": "application/json", "traceparent": f"00-{trace_id}-{caller}-01"}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(CHAT).encode(), headers=headers)
        assert conn.getresponse().status == 200
        conn.close()
        sent = chat.request.traceparent  # what chat gets: the same trace, the gateway's span as parent
        assert sent.startswith(f"00-{trace_id}-") and sent.endswith("-01")
        assert tracing.active().force_flush()
        (span,) = memory.get_finished_spans()
        assert span.name == "POST /v1/chat/completions" and span.parent.span_id == int(caller, 16)
        assert sent.split("-")[2] == f"{span.context.span_id:016x}"
        # a malformed header: a trace of its own, answered as always
        conn = http.client.HTTPConnection(*gateway, timeout=10)
        headers["traceparent"] = f"00-{trace_id}-{caller}-01-and-more"
        conn.request("POST", "/v1/chat/completions", body=json.dumps(CHAT).encode(), headers=headers)
        assert conn.getresponse().status == 200
        conn.close()
        assert chat.request.traceparent.split("-")[1] != trace_id
    finally:
        tracing.configure(tracing.TraceSettings())  # off again for the other tests

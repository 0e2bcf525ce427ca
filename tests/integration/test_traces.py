"""Traces end to end: a stack of its own with tracing pointed at a real receiver (Arize Phoenix,
from build/phoenix-venv, on free ports with its data in a temporary directory), one chat through
the gateway with a known ``traceparent``, its spans read back from Phoenix's REST API: the trace
id sent, each span under the right parent (gateway -> chat -> the stream to a pool -> the pool ->
its queue, prefill, decode and KV blocks in Redis), each inside its parent's time range (but the
KV store, which follows the answer). A chat
with a session straight to ``chat`` has its Redis session spans; a malformed ``traceparent``
starts a trace of its own and the chat is answered; a stack whose receiver is missing answers
every chat and a spoken turn, and counts the spans each model dropped on its metrics port."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
import urllib.request
from datetime import datetime

import openai
import pytest

from switchboard.client import ChatClient
from switchboard.ops import traces
from switchboard.ops.launch import Ports, Stack, free_ports
from tests.integration.gatewaytools import STANDARD_KEY, Gateway

pytestmark = pytest.mark.skipif(
    traces.executable() is None,
    reason=f"{traces.PHOENIX} is not installed in {traces.VENV}: `make traces-receiver` installs it (make test does)",
)
POOLS = ("engine_short", "engine_long")


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    port, grpc_port = free_ports(2)
    p = traces.Phoenix(tmp_path_factory.mktemp("phoenix"), port, grpc_port).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def tracing_env(phoenix) -> dict[str, str]:
    return {"SWITCHBOARD_TRACE_ENDPOINT": phoenix.url, "SWITCHBOARD_TRACE_SAMPLING": "1"}


@pytest.fixture(scope="module")
def traced_stack(artifacts, tracing_env, tmp_path_factory):
    s = Stack(Ports.free(), run_dir=tmp_path_factory.mktemp("traced"), env=tracing_env)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def traced_gateway(traced_stack, tracing_env, tmp_path_factory):
    g = Gateway(traced_stack.grpc_url, tmp_path_factory.mktemp("traced-gateway"), env=tracing_env)
    yield g
    g.stop()
    assert "Traceback" not in g.logs(), g.logs()[-3000:]


def chat(gateway: Gateway, traceparent: str | None, text: str = "Where is my order?") -> dict:
    body = {"model": "switchboard", "messages": [{"role": "user", "content": text}], "max_tokens": 12}
    headers = {"Authorization": f"Bearer {STANDARD_KEY}", "Content-Type": "application/json"}
    if traceparent is not None:
        headers["traceparent"] = traceparent
    req = urllib.request.Request(f"{gateway.url}/v1/chat/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def spans_of(phoenix, trace_id: str, names: set[str], timeout_s: float = 60) -> dict[str, dict]:
    """The trace's spans by name, once every one of ``names`` arrived (export is asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = {s["name"]: s for s in phoenix.spans(trace_id)}
        if names <= found.keys() or time.monotonic() > deadline:
            assert names <= found.keys(), f"missing {names - found.keys()}; arrived: {sorted(found)}"
            return found
        time.sleep(0.5)


def _t(span: dict, key: str) -> datetime:
    return datetime.fromisoformat(span[key])


def assert_child(spans: dict[str, dict], child: str, parent: str) -> None:
    c, p = spans[child], spans[parent]
    assert c["parent_id"] == p["context"]["span_id"], f"{child}'s parent is not {parent}"
    assert _t(p, "start_time") <= _t(c, "start_time") <= _t(c, "end_time") <= _t(p, "end_time"), (
        f"{child} [{c['start_time']}, {c['end_time']}] is not inside {parent} [{p['start_time']}, {p['end_time']}]"
    )


def test_a_chats_spans_arrive_under_their_parents_inside_their_times(traced_gateway, phoenix):
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    answer = chat(traced_gateway, f"00-{trace_id}-{caller}-01")
    assert answer["choices"][0]["message"]["content"]

    gateway = "POST /v1/chat/completions"
    first = {gateway, "chat", "admission", "queue", "prefill", "decode"}
    spans = spans_of(phoenix, trace_id, first)
    pool = next(p for p in POOLS if p in spans)  # the pool the router chose
    spans = spans_of(phoenix, trace_id, first | {f"stream {pool}", pool, "kv lookup", "kv store"})

    assert spans[gateway]["parent_id"] == caller  # the caller's traceparent honoured
    assert_child(spans, "chat", gateway)
    assert_child(spans, "admission", "chat")
    assert_child(spans, f"stream {pool}", "chat")
    assert_child(spans, pool, f"stream {pool}")
    for phase in ("kv lookup", "queue", "prefill", "decode"):
        assert_child(spans, phase, pool)
    # the engine's phases follow one another; the new blocks are stored after the answer left
    assert _t(spans["kv lookup"], "end_time") <= _t(spans["queue"], "start_time")
    assert _t(spans["queue"], "end_time") <= _t(spans["prefill"], "start_time")
    assert _t(spans["prefill"], "end_time") <= _t(spans["decode"], "start_time")
    assert spans["kv store"]["parent_id"] == spans[pool]["context"]["span_id"]
    assert _t(spans[pool], "end_time") <= _t(spans["kv store"], "start_time")
    assert spans["decode"]["attributes"]["generated_tokens"] == answer["usage"]["completion_tokens"]
    assert spans["kv store"]["attributes"]["db.system"] == "redis"


def test_a_session_chat_has_its_redis_spans(traced_stack, phoenix):
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    client = ChatClient(traced_stack.grpc_url, timeout_s=120)
    session = secrets.token_hex(4)
    reply = client.chat(
        "Where is my order?", stream=False, session_id=session, traceparent=f"00-{trace_id}-{caller}-01"
    )
    assert reply.text
    spans = spans_of(phoenix, trace_id, {"chat", "redis session.load", "redis session.save"})
    assert spans["chat"]["parent_id"] == caller
    assert_child(spans, "redis session.load", "chat")
    assert_child(spans, "redis session.save", "chat")
    assert spans["redis session.load"]["attributes"]["status"] == "miss"


def wait_for_asr(client: ChatClient) -> None:
    deadline = time.monotonic() + 120
    while not client.ready("asr"):
        if time.monotonic() > deadline:
            pytest.fail("asr did not become ready: `make test-recognizer` installs it (make test does)")
        time.sleep(0.5)


def spoken(text: str) -> bytes:
    return subprocess.run(["espeak-ng", "--stdout", text], capture_output=True, check=True).stdout


def test_a_transcriptions_spans_arrive_under_the_gateway(traced_stack, traced_gateway, phoenix):
    """Speech: the gateway's span, then ``asr`` under it, its ``queue`` and ``transcribe`` inside."""
    client = ChatClient(traced_stack.grpc_url, timeout_s=120)
    wait_for_asr(client)
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    wav = spoken("where is my order")
    oai = openai.OpenAI(base_url=f"{traced_gateway.url}/v1", api_key=STANDARD_KEY, max_retries=0)
    heard = oai.audio.transcriptions.create(
        file=("question.wav", wav), model="whisper-1", extra_headers={"traceparent": f"00-{trace_id}-{caller}-01"}
    )
    assert "order" in heard.text.lower()

    gateway = "POST /v1/audio/transcriptions"
    spans = spans_of(phoenix, trace_id, {gateway, "asr", "queue", "transcribe"})
    assert spans[gateway]["parent_id"] == caller
    assert_child(spans, "asr", gateway)
    assert_child(spans, "queue", "asr")
    assert_child(spans, "transcribe", "asr")
    assert _t(spans["queue"], "end_time") <= _t(spans["transcribe"], "start_time")


@pytest.mark.parametrize("traceparent", ["garbage", "00-" + "0" * 32 + "-" + "1" * 16 + "-01", "x" * 4000])
def test_a_malformed_traceparent_is_ignored_and_the_chat_answered(traced_gateway, traceparent):
    assert chat(traced_gateway, traceparent)["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def unreachable_stack(artifacts, tmp_path_factory):
    """A stack tracing everything to a port nothing listens on."""
    (closed,) = free_ports(1)
    env = {"SWITCHBOARD_TRACE_ENDPOINT": f"http://127.0.0.1:{closed}", "SWITCHBOARD_TRACE_SAMPLING": "1"}
    s = Stack(Ports.free(), run_dir=tmp_path_factory.mktemp("unreachable"), env=env)
    s.start()
    yield s
    s.stop()


def dropped_spans(stack: Stack) -> dict[str, float]:
    """``switchboard_trace_spans_dropped_total`` by model, from the metrics port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.ports.metrics}/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    out: dict[str, float] = {}
    for line in lines:
        if line.startswith("switchboard_trace_spans_dropped_total{"):
            model = line.split('model="', 1)[1].split('"', 1)[0]
            out[model] = out.get(model, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_a_missing_receiver_fails_no_chat_and_its_spans_are_counted(unreachable_stack):
    client = ChatClient(unreachable_stack.grpc_url, timeout_s=120)
    for _ in range(3):
        tp = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
        assert client.chat("Where is my order?", stream=False, traceparent=tp, max_new_tokens=8).text
    wait_for_asr(client)
    tp = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    reply = client.voice_chat(spoken("where is my order"), stream=False, traceparent=tp, max_new_tokens=8)
    assert reply.heard.transcript and reply.text
    deadline = time.monotonic() + 60  # export retries within its timeout; metrics publish every second
    while True:
        dropped = dropped_spans(unreachable_stack)
        counted = dropped.get("chat", 0) >= 3 * 3 and any(dropped.get(p, 0) >= 4 for p in POOLS)
        if counted and dropped.get("voice_chat", 0) >= 1 and dropped.get("asr", 0) >= 3:
            break  # chat: chat, admission, stream per chat; a pool: its span, lookup, queue, prefill, decode;
            # voice_chat: the turn's span; asr: its span, queue, transcribe
        assert time.monotonic() < deadline, f"dropped spans counted: {dropped}"
        time.sleep(0.5)

"""End to end over gRPC: real tritonserver, real redis-server, the exported default model."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from switchboard.client import ChatError, ChatStats
from switchboard.client.sync import error_of
from switchboard.serving.session import session_key
from tests.integration.kvtools import pool_generate


def collect(client, text, **kw) -> tuple[list[str], ChatStats]:
    deltas, stats = [], None
    for event in client.chat(text, temperature=0.0, **kw):
        if isinstance(event, ChatStats):
            stats = event
        else:
            deltas.append(event)
    return deltas, stats


def conversation(redis_client, session_id):
    raw = redis_client.get(session_key("sb", session_id) + ":conv")
    return json.loads(raw) if raw else None


def test_all_models_ready(stack):
    with grpcclient.InferenceServerClient(stack.grpc_url) as c:
        assert c.is_server_ready()
        for name in ("chat", "engine_short", "engine_long"):
            assert c.is_model_ready(name), name


def test_server_and_stubs_run_on_jemalloc(stack):
    from switchboard.ops.launch import children

    pids = {"tritonserver": stack.triton.pid, **children(stack.triton.pid)}
    assert set(pids) >= {"tritonserver", "chat", "engine_short", "engine_long"}
    for name, pid in pids.items():
        with open(f"/proc/{pid}/maps") as maps:
            assert "libjemalloc" in maps.read(), f"{name} runs on glibc's malloc"


def test_both_pools_map_one_prepared_copy_of_the_weights(stack):
    """One copy per machine: the pools memory-map the same pre-packed weights file (page cache,
    shared), and neither loaded the graph's own weights into private memory."""
    from switchboard.ops.launch import children

    stubs = children(stack.triton.pid)
    mapped = {}
    for pool in ("engine_short", "engine_long"):
        with open(f"/proc/{stubs[pool]}/maps") as maps:
            mapped[pool] = {line.split()[-1] for line in maps if line.rstrip().endswith("model.onnx.data")}
    assert len(mapped["engine_short"]) == 1 and mapped["engine_short"] == mapped["engine_long"], mapped
    assert "/cache/weights/" in next(iter(mapped["engine_short"]))


def test_second_turn_reuses_the_first_turns_kv_and_matches_a_cold_cache(stack, client, redis_client):
    turns = ["Where is my order?", "Can I change the delivery address?"]
    _, s1 = collect(client, turns[0], session_id="reuse-warm")
    _, s2 = collect(client, turns[1], session_id="reuse-warm")
    assert s1.raw["session"] == "miss" and s1.reused_tokens < s1.prompt_tokens  # at most the system prompt
    assert 0 < s1.raw["engine_ms"] < s1.raw["total_ms"], "the pool's time is part of the chat's"
    assert s2.reused_tokens > s1.prompt_tokens, "turn 2 should reuse turn 1's prompt and answer"
    assert s2.raw["kv_local_blocks"] * 16 == s2.reused_tokens and s2.raw["kv_redis_blocks"] == 0  # no KV moved
    assert s2.raw["cache_miss"] is None and s2.generated_tokens > 0

    # The same prompt straight to a pool, nothing reused: the same greedy tokens.
    stored = conversation(redis_client, "reuse-warm")["tokens"]
    prompt, answer = stored[: s2.prompt_tokens], stored[s2.prompt_tokens :][: s2.generated_tokens]
    assert pool_generate(stack.grpc_url, "engine_short", prompt, s2.generated_tokens) == answer


def test_identical_prefixes_are_shared_across_sessions(client):
    text = "Do you ship to Hong Kong, and how long does it take?"
    _, first = collect(client, text, session_id="shared-a")
    _, second = collect(client, text, session_id="shared-b")  # a new session, the same first prompt
    assert second.raw["session"] == "miss" and second.prompt_tokens == first.prompt_tokens
    assert second.reused_tokens == (first.prompt_tokens - 1) // 16 * 16 > first.reused_tokens


def test_streamed_deltas_join_to_the_stored_answer(client, redis_client):
    # Priority 1 streams a response per token, priority 2 at most every 50 ms (stream_interval_ms);
    # tokens that queue while the engine's sender is busy leave as one response
    # (tests/unit/test_stream.py), so on a loaded machine the count of deltas varies.
    # A busy machine can queue every token of one answer behind the sender: three tries, and an
    # answer always sent whole fails all three.
    for _ in range(3):
        vip, _ = collect(client, "我的订单什么时候发货？", priority=1)
        if len(vip) >= 2:
            break
    deltas, stats = collect(client, "我的订单什么时候发货？", session_id="stream-zh")
    answer = "".join(deltas)
    assert len(vip) >= 2, "a priority-1 answer should be streamed, not sent whole"
    assert "".join(vip) == answer
    assert stats.generated_tokens >= len(vip)
    assert answer.encode("utf-8").decode("utf-8") == answer and "\ufffd" not in answer
    stored = conversation(redis_client, "stream-zh")
    assert stored["messages"][-1] == {"role": "assistant", "content": answer}
    reply = client.chat("我的订单什么时候发货？", stream=False, temperature=0.0)
    assert reply.text == answer and reply.stats.generated_tokens == stats.generated_tokens


def test_length_aware_routing(client):
    _, short = collect(client, "Hi, is SKU-A7X92 in stock?", max_new_tokens=8)
    long_text = " ".join(
        [
            "My order arrived damaged and the box was open, the charger is missing,"
            " and the screen has a crack on the left side."
        ]
        * 8
    )
    _, long = collect(client, long_text, max_new_tokens=8)
    assert short.route == "short" and short.prompt_tokens <= 160
    assert long.route == "long" and long.prompt_tokens > 160


def _engine_metric(stack, name: str, pool="engine_short") -> float:
    from perf.servertools import scrape

    return scrape(stack.ports.metrics).get((name, (("model", pool),)), 0.0)


def _engine_waiting(stack, pool="engine_short") -> float:
    return _engine_metric(stack, "switchboard_engine_waiting", pool)


def test_priority_one_waits_less_than_a_backlog_of_priority_two(client, stack):
    """Keep a steady backlog of priority-2 chats queued in engine_short (24 senders, batches of
    8), send priority-1 chats into it one at a time, and compare the time each spent in the
    engine's queue. Without priorities a VIP queues like everyone else (equal medians); with
    them it takes the next free slot ahead of the backlog. With the backlog, priority 2's lane
    waits while a VIP decodes (hold_back_ms), which the pool's metrics count."""
    queued = {1: [], 2: []}
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[BaseException] = []

    def chat(priority):
        try:
            for event in client.chat("How do I return a damaged item?", priority=priority, max_new_tokens=48):
                if isinstance(event, ChatStats) and event.raw["engine_queue_ms"] is not None:
                    with lock:
                        queued[priority].append(event.raw["engine_queue_ms"])
        except Exception as e:  # noqa: BLE001 -- reported by the assertion below
            failures.append(e)

    def background():
        while not stop.is_set():
            chat(2)

    senders = [threading.Thread(target=background) for _ in range(24)]
    for t in senders:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while _engine_waiting(stack) < 8:
            assert time.monotonic() < deadline, "no backlog formed in engine_short"
            time.sleep(0.2)
        with lock:
            queued[2].clear()  # only chats that queued behind a backlog
        held_before = _engine_metric(stack, "switchboard_engine_held_back_s_total")
        for _ in range(7):
            chat(1)
            time.sleep(0.1)
    finally:
        stop.set()
        for t in senders:
            t.join(120)
    assert not failures, failures[:3]
    vip, others = np.median(queued[1]), np.median(queued[2])
    assert len(queued[1]) == 7 and len(queued[2]) >= 20
    assert vip * 2 < others, f"engine queue median: priority 1 {vip:.0f} ms, priority 2 {others:.0f} ms"
    deadline = time.monotonic() + 5  # the pool publishes its counters once a second
    while _engine_metric(stack, "switchboard_engine_held_back_s_total") <= held_before:
        assert time.monotonic() < deadline, "priority 2 was never held back for a VIP"
        time.sleep(0.2)


def _expect_invalid(raw, inputs, parameters=None, needle=""):
    _, error = raw(inputs, parameters)
    assert error is not None, "expected an error"
    assert error.message().startswith("[INVALID_ARG] "), error.message()
    code, message = error_of(error)
    assert code == "INVALID_ARGUMENT" and needle in message, (code, message)


def b(x):
    return np.asarray([[x]], dtype=np.object_)


@pytest.mark.parametrize(
    "inputs, needle",
    [
        ({"session_id": (b(b"s"), "BYTES")}, "text: required"),
        ({"text": (b(b""), "BYTES")}, "text: empty"),
        ({"text": (b(b"\xc3\x28 broken"), "BYTES")}, "not valid UTF-8"),
        (
            {"text": (b(b"hi"), "BYTES"), "max_new_tokens": (np.asarray([[-5]], np.int32), "INT32")},
            "max_new_tokens: -5",
        ),
        ({"text": (b(b"hi"), "BYTES"), "max_new_tokens": (np.asarray([[10**9]], np.int32), "INT32")}, "max_new_tokens"),
    ],
)
def test_bad_input_is_invalid_arg_and_server_stays_ready(raw, client, inputs, needle):
    _expect_invalid(raw, inputs, needle=needle)
    assert client.ready()


RETURN = {
    "type": "object",
    "properties": {"order_id": {"type": "string", "pattern": "^SB[0-9]{6}$"}, "reason": {"enum": ["damaged", "other"]}},
    "required": ["order_id", "reason"],
    "additionalProperties": False,
}


def test_a_json_schema_answer_over_grpc_validates_and_a_bad_schema_is_invalid_arg(client):
    fmt = {"type": "json_schema", "schema": RETURN}
    reply = client.chat("I want to return order SB000123", stream=False, max_new_tokens=64, response_format=fmt)
    answer = json.loads(reply.text)
    assert set(answer) == {"order_id", "reason"} and answer["reason"] in ("damaged", "other")
    assert reply.stats.raw["finish_reason"] == "stop" and reply.stats.raw["fallback"] is False
    with pytest.raises(ChatError) as e:
        client.chat("hi", stream=False, response_format={"type": "json_schema", "schema": {"$ref": "#/nowhere"}})
    assert e.value.code == "INVALID_ARGUMENT" and "json_schema:" in str(e.value)
    assert client.ready()


def test_a_json_schema_answer_cut_by_its_budget_parses_and_penalties_go_through_grpc(client):
    free = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    fmt = {"type": "json_schema", "schema": free}
    reply = client.chat("How do I delete my account?", stream=False, max_new_tokens=16, response_format=fmt)
    assert isinstance(json.loads(reply.text)["answer"], str) and reply.stats.raw["finish_reason"] == "length"
    penalized = client.chat("订单" * 100, stream=False, max_new_tokens=32, frequency_penalty=1.0, presence_penalty=0.5)
    assert penalized.text != client.chat("订单" * 100, stream=False, max_new_tokens=32).text
    for name in ("presence_penalty", "frequency_penalty"):
        with pytest.raises(ChatError) as e:
            client.chat("hi", stream=False, **{name: 2.5})
        assert e.value.code == "INVALID_ARGUMENT" and f"{name}: 2.5 is outside" in str(e.value)
    assert client.ready()


def test_logprobs_over_grpc_come_with_the_tokens(client):
    reply = client.chat("Where is my order?", stream=False, max_new_tokens=16, logprobs=2)
    scored = reply.logprobs
    assert len(scored) == reply.stats.generated_tokens - (reply.stats.raw["finish_reason"] == "stop")
    assert bytes(b for e in scored for b in e["bytes"]).decode("utf-8") == reply.text
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in scored)
    assert client.chat("Where is my order?", stream=False, max_new_tokens=16).logprobs is None


def test_constrained_rows_share_batches_leave_when_cancelled_and_store_their_kv(client, stack):
    fmt = {"type": "json_schema", "schema": RETURN}
    ask = dict(stream=False, max_new_tokens=64)
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(
                client.chat,
                "I want to return order SB000123",
                priority=1 if i % 4 == 0 else 2,
                response_format=fmt if i % 2 else None,
                **ask,
            )
            for i in range(8)
        ]
        replies = [f.result() for f in futures]
    for reply in replies[1::2]:
        assert set(json.loads(reply.text)) == {"order_id", "reason"}
    assert all(r.text.strip() and not r.stats.fallback for r in replies)
    assert max(r.stats.batch_size for r in replies) > 1, "constrained and free rows decode in one batch"
    # a constrained answer's KV is stored like any: the session's next turn reuses it
    client.chat("I want to return order SB000123", session_id="json-kv", response_format=fmt, **ask)
    again = client.chat("Thanks. When is the refund?", session_id="json-kv", **ask)
    assert again.stats.raw["session"] == "hit" and again.stats.reused_tokens > 16
    # a constrained chat the client leaves is cancelled in the pool like any other (its schema
    # holds it to 400 characters at least, in 404 tokens at least: past the pools' 50 ms cancel poll)
    note = {"type": "object", "properties": {"note": {"type": "string", "minLength": 400}}, "required": ["note"]}
    long = {"type": "json_schema", "schema": note}
    name = "switchboard_engine_finished_cancelled_total"
    before = sum(_engine_metric(stack, name, pool) for pool in ("engine_short", "engine_long"))
    events = client.chat("I want to return order SB000123", response_format=long, max_new_tokens=512)
    next(events)
    events.close()
    deadline = time.monotonic() + 10  # the pools publish their counters once a second
    while sum(_engine_metric(stack, name, pool) for pool in ("engine_short", "engine_long")) <= before:
        assert time.monotonic() < deadline, "the constrained chat was not cancelled in its pool"
        time.sleep(0.2)
    assert client.ready()


def test_bad_priority_parameter(raw):
    _expect_invalid(raw, {"text": (b(b"hi"), "BYTES")}, {"chat_priority": 9}, "chat_priority")


def test_chat_without_redis_answers_without_reuse(stack, client):
    collect(client, "Where is my order?", session_id="no-redis")
    stack.stop_redis()
    try:
        deltas, stats = collect(client, "Can I change the delivery address?", session_id="no-redis")
        assert "".join(deltas).strip()
        assert stats.raw["session"] == "unavailable" and stats.raw["cache_miss"] == "redis_unavailable"
    finally:
        stack.start_redis()
    time.sleep(2.5)  # the store retries Redis after its back-off
    collect(client, "Where is my order?", session_id="redis-back")
    _, stats = collect(client, "Can I change the delivery address?", session_id="redis-back")
    assert stats.reused_tokens > 0


def test_kv_block_metrics_count_hits_by_tier_and_misses_by_reason(stack, client):
    from perf.servertools import scrape

    def kv(name, **labels):
        key = (name, tuple(sorted({"model": "engine_short", **labels}.items())))
        return scrape(stack.ports.metrics).get(key, 0.0)

    before = kv("switchboard_kv_hit_blocks_total", tier="local"), kv("switchboard_kv_lookups_total")
    collect(client, "Where is my order? metrics", session_id="kv-metrics")
    _, s2 = collect(client, "Can I change the delivery address?", session_id="kv-metrics")
    deadline = time.monotonic() + 5  # the pool publishes its counters once a second
    while kv("switchboard_kv_lookups_total") < before[1] + 2:
        assert time.monotonic() < deadline, "switchboard_kv_lookups_total did not count the two turns"
        time.sleep(0.2)
    assert kv("switchboard_kv_hit_blocks_total", tier="local") >= before[0] + s2.reused_tokens // 16
    assert kv("switchboard_kv_redis_bytes_total", direction="written") > 0
    assert ("switchboard_kv_misses_total", (("model", "engine_short"), ("reason", "evicted"))) in scrape(
        stack.ports.metrics
    )  # every reason is exported, at 0 until it happens


def test_chat_metrics_count_real_chats_by_outcome_priority_and_route(stack, client, raw):
    from perf.servertools import scrape

    def value(name, **labels):
        return scrape(stack.ports.metrics).get((name, tuple(sorted(labels.items()))), 0.0)

    generated = ("switchboard_chat_requests_total", {"outcome": "generated"})
    ttft = ("switchboard_chat_time_to_first_token_seconds", {"priority": "1", "route": "short"})
    time.sleep(1.2)  # earlier tests' chats published first
    before = {
        "generated": value(generated[0], **generated[1]),
        "invalid": value("switchboard_chat_requests_total", outcome="invalid"),
        "ttft_count": value(ttft[0] + "_count", **ttft[1]),
        "ttft_sum": value(ttft[0] + "_sum", **ttft[1]),
        "miss": value("switchboard_chat_sessions_total", status="miss"),
        "tokens": value("switchboard_chat_generated_tokens_total", priority="1"),
    }
    _, vip = collect(client, "Where is my order?", priority=1)
    _, session = collect(client, "Where is my order? metrics", session_id="chat-metrics")
    _, error = raw({"text": (np.asarray([[b""]], np.object_), "BYTES")})
    assert error is not None
    deadline = time.monotonic() + 5  # published once a second
    while value(generated[0], **generated[1]) < before["generated"] + 2:
        assert time.monotonic() < deadline, "switchboard_chat_requests_total did not count the chats"
        time.sleep(0.2)
    time.sleep(1.2)  # one more publication: nothing else arrives
    assert value(generated[0], **generated[1]) == before["generated"] + 2
    assert value("switchboard_chat_requests_total", outcome="invalid") == before["invalid"] + 1
    assert value(ttft[0] + "_count", **ttft[1]) == before["ttft_count"] + 1
    assert abs(value(ttft[0] + "_sum", **ttft[1]) - before["ttft_sum"] - vip.ttft_ms / 1000) < 1e-4
    assert value("switchboard_chat_sessions_total", status="miss") == before["miss"] + 1
    assert value("switchboard_chat_generated_tokens_total", priority="1") == before["tokens"] + vip.generated_tokens
    metrics = scrape(stack.ports.metrics)
    assert ("switchboard_chat_admission_waiting", ()) in metrics
    assert ("switchboard_chat_fallbacks_total", (("reason", "engine_timeout"),)) in metrics  # at zero from the start
    assert session.raw["session"] == "miss"

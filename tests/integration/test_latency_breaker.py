"""The latency circuit breaker on a real server: with a bound every chat exceeds, priority 2 is
answered from the FAQ at once after the window fills, priority 1 still generates, and the
metrics count it."""

from __future__ import annotations

import time

import pytest

from switchboard.client import ChatClient
from switchboard.ops.launch import Ports, Stack
from switchboard.perf.servertools import scrape


@pytest.fixture(scope="module")
def breaker_stack(artifacts, tmp_path_factory):
    s = Stack(
        Ports.free(),
        run_dir=tmp_path_factory.mktemp("breaker"),
        env={
            "SWITCHBOARD_BREAKER_TTFT_P99_S": "0.001",  # 1 ms: every generated answer is "slow"
            "SWITCHBOARD_BREAKER_MIN_SAMPLES": "3",
            "SWITCHBOARD_BREAKER_WINDOW_S": "60",
        },
    )
    s.start()
    yield s
    s.stop()


def test_over_its_bound_the_breaker_sheds_priority_two_never_priority_one(breaker_stack):
    client = ChatClient(breaker_stack.grpc_url, timeout_s=60)
    first = [client.chat("Where is my order?", stream=False, max_new_tokens=8) for _ in range(3)]
    assert all(not r.stats.fallback and r.stats.ttft_ms > 1 for r in first)  # the window fills
    time.sleep(0.3)  # the P99 is recomputed at most every 0.25 s
    shed = client.chat("Where is my order?", stream=False, max_new_tokens=8)
    assert shed.stats.fallback and shed.stats.raw["fallback_reason"] == "latency_breaker" and shed.text
    vip = client.chat("Where is my order?", stream=False, max_new_tokens=8, priority=1)
    assert not vip.stats.fallback and vip.stats.generated_tokens > 0
    deadline = time.monotonic() + 5
    key = ("switchboard_chat_sheds_total", (("reason", "latency_breaker"),))
    while scrape(breaker_stack.ports.metrics).get(key, 0) < 1:
        assert time.monotonic() < deadline, "switchboard_chat_sheds_total{reason=latency_breaker} did not count it"
        time.sleep(0.2)

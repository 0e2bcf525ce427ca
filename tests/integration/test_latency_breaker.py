"""The latency circuit breakers on a real server: with a bound every chat exceeds, priority 2 is
answered from the FAQ at once after the window fills, priority 1 still generates, and the
metrics count it; with one every transcription exceeds, asr refuses priority-2 audio
UNAVAILABLE and still transcribes priority 1's."""

from __future__ import annotations

import time

import pytest

from perf.cold_start import spoken_question
from perf.servertools import scrape
from switchboard import paths
from switchboard.client import ChatClient, ChatError
from switchboard.ops.launch import Ports, Stack


@pytest.fixture(scope="module")
def breaker_stack(artifacts, tmp_path_factory):
    s = Stack(
        Ports.free(),
        run_dir=tmp_path_factory.mktemp("breaker"),
        env={
            "SWITCHBOARD_BREAKER_TTFT_P99_S": "0.001",  # 1 ms: every generated answer is "slow"
            "SWITCHBOARD_BREAKER_P99_S": "0.001",  # and every transcription (asr's breaker)
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


def test_over_its_bound_asrs_breaker_refuses_priority_two_audio_never_priority_one(breaker_stack):
    client = ChatClient(breaker_stack.grpc_url, timeout_s=60)
    deadline = time.monotonic() + 120
    while not client.ready("asr"):  # tiny.en, installed by make test, loads with the server
        assert time.monotonic() < deadline, "asr did not become ready"
        time.sleep(0.5)
    question, _ = spoken_question(paths.MODEL_REPOSITORY, 0)
    first = [client.transcribe(question, language="en") for _ in range(3)]
    assert all(r.text for r in first)  # the window fills with short requests' times
    time.sleep(0.3)
    with pytest.raises(ChatError) as refused:
        client.transcribe(question, language="en")
    assert refused.value.code == "UNAVAILABLE" and "latency bound" in str(refused.value)
    assert client.transcribe(question, language="en", priority=1).text
    deadline = time.monotonic() + 5
    key = ("switchboard_asr_requests_total", (("outcome", "shed_breaker"),))
    while scrape(breaker_stack.ports.metrics).get(key, 0) < 1:
        assert time.monotonic() < deadline, "switchboard_asr_requests_total{outcome=shed_breaker} did not count it"
        time.sleep(0.2)

"""A real Prometheus (and Alertmanager) scraping a live server: the chat histograms answer a
P99 query and the recording rules of monitoring/alerts.yml evaluate."""

from __future__ import annotations

import time

import pytest

from switchboard.ops.launch import free_ports
from switchboard.ops.monitor import Monitor


@pytest.fixture(scope="module")
def monitor(stack, tmp_path_factory):
    prometheus, alertmanager = free_ports(2)
    m = Monitor([f"127.0.0.1:{stack.ports.metrics}"], tmp_path_factory.mktemp("monitor"), prometheus, alertmanager, 1.0)
    m.start()
    yield m
    m.stop()


def _eventually(monitor, expr, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        result = monitor.query(expr)
        if result and result[0]["value"][1] not in ("NaN", "+Inf"):
            return result
        assert time.monotonic() < deadline, f"{expr} had no value within {timeout:.0f} s"
        time.sleep(0.5)


def test_prometheus_scrapes_the_server_and_evaluates_p99_time_to_first_token(monitor, client):
    [up] = _eventually(monitor, 'up{job="switchboard"}')
    assert up["value"][1] == "1"
    deadline = time.monotonic() + 30
    result = None
    while result is None:  # chats while Prometheus scrapes, until a rate over them exists
        for priority in (1, 2):
            client.chat("Where is my order?", stream=False, priority=priority, max_new_tokens=8)
        rows = monitor.query(
            "histogram_quantile(0.99, sum by (le, priority) "
            "(rate(switchboard_chat_time_to_first_token_seconds_bucket[10s])))"
        )
        values = {r["metric"].get("priority"): float(r["value"][1]) for r in rows if r["value"][1] != "NaN"}
        if {"1", "2"} <= set(values):
            result = values
        assert time.monotonic() < deadline, "no P99 over the chat histograms within 30 s"
        time.sleep(0.5)
    assert all(0 < v < 10 for v in result.values()), result  # seconds, from real chats
    [recorded] = _eventually(monitor, "switchboard:ttft_seconds:p99_1m")
    assert 0 < float(recorded["value"][1]) < 10


def test_prometheus_sends_its_alerts_to_alertmanager(monitor):
    import json
    import urllib.request

    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(f"{monitor.url}/api/v1/alertmanagers", timeout=5) as r:
            active = json.load(r)["data"]["activeAlertmanagers"]
        if active:
            break
        assert time.monotonic() < deadline, "Prometheus found no Alertmanager"
        time.sleep(0.5)
    assert str(monitor.alertmanager_port) in active[0]["url"]

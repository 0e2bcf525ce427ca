"""A real Prometheus (and Alertmanager) scraping a live server: the chat histograms answer a
P99 query and the recording rules of monitoring/alerts.yml evaluate."""

from __future__ import annotations

import time

import pytest

from switchboard.ops.launch import free_ports
from switchboard.ops.monitor import Monitor
from tests.integration.monitortools import eventually


@pytest.fixture(scope="module")
def monitor(stack, tmp_path_factory):
    prometheus, alertmanager, receiver = free_ports(3)
    run_dir = tmp_path_factory.mktemp("monitor")
    m = Monitor([f"127.0.0.1:{stack.ports.metrics}"], run_dir, prometheus, alertmanager, 1.0, receiver)
    m.start()
    yield m
    m.stop()


def test_prometheus_scrapes_the_server_and_evaluates_p99_time_to_first_token(monitor, client):
    [up] = eventually(monitor, 'up{job="switchboard"}')
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
    [recorded] = eventually(monitor, "switchboard:ttft_seconds:p99_1m")
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


def test_an_alert_reaches_the_webhook_receiver_through_alertmanager(monitor):
    """An alert posted to Alertmanager's API is routed, grouped (group_wait 10 s) and sent to
    the receiver the stack runs, which keeps it in alerts.jsonl."""
    import json
    import urllib.request

    alert = [
        {
            "labels": {"alertname": "SwitchboardReceiverCheck", "severity": "info"},
            "annotations": {"summary": "sent by the integration tests"},
        }
    ]
    request = urllib.request.Request(
        f"http://127.0.0.1:{monitor.alertmanager_port}/api/v2/alerts",
        data=json.dumps(alert).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.status == 200
    log = monitor.run_dir / "alert-receiver.log"
    deadline = time.monotonic() + 90
    while True:
        kept = monitor.alerts_file.read_text() if monitor.alerts_file.exists() else ""
        got = [json.loads(line) for line in kept.splitlines() if "SwitchboardReceiverCheck" in line]
        if got and "firing SwitchboardReceiverCheck" in log.read_text():
            break
        assert time.monotonic() < deadline, "the receiver got no notification from Alertmanager within 90 s"
        time.sleep(1)
    [sent] = [a for a in got[0]["alerts"] if a["labels"]["alertname"] == "SwitchboardReceiverCheck"]
    assert sent["status"] == "firing" and got[0]["receiver"] == "switchboard"


def test_a_monitor_that_cannot_start_its_receiver_stops_what_it_started(tmp_path):
    """The receiver's port taken: the start fails naming it, and Prometheus and Alertmanager,
    already running, are stopped rather than left behind without pid files."""
    import socket

    import pytest

    prometheus, alertmanager = free_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        m = Monitor(["127.0.0.1:1"], tmp_path, prometheus, alertmanager, 1.0, taken.getsockname()[1])
        started, stop = [], m.stop

        def stop_and_record():
            started.extend(m.procs.values())
            stop()

        m.stop = stop_and_record
        with pytest.raises(RuntimeError, match="alert receiver exited"):
            m.start()
    assert len(started) == 3 and all(p.poll() is not None for p in started) and m.procs == {}

"""The Grafana dashboard against a live server: every metric name its panels query is one the
server's /metrics exports after real chats, and a real Prometheus scraping that server evaluates
every panel's query without error and with data."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from switchboard.ops.dashboard import OUT, panels, unexported, with_window
from switchboard.ops.launch import free_ports
from switchboard.ops.monitor import Monitor
from switchboard.ops.promql import exported_names, metric_names

BOARD = json.loads(OUT.read_text())
TARGETS = [(p["title"], t["refId"], t["expr"]) for p in panels(BOARD) for t in p["targets"]]


@pytest.fixture(scope="module")
def chatted(client):
    """Real chats of both priorities, a second turn of a session (KV reuse, a session hit)
    included, published on the metrics port (the models publish once a second)."""
    for priority in (1, 2):
        session = f"dashboard-{priority}-{time.monotonic_ns()}"
        client.chat("Where is my order?", session_id=session, stream=False, priority=priority, max_new_tokens=12)
        client.chat("Can I change the address?", session_id=session, stream=False, priority=priority, max_new_tokens=12)
    time.sleep(2.5)  # two publishing rounds: the counters reached /metrics
    return True


@pytest.fixture(scope="module")
def exported(stack, chatted):
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.ports.metrics}/metrics", timeout=10) as r:
        return exported_names(r.read().decode())


@pytest.fixture(scope="module")
def prometheus(stack, chatted, tmp_path_factory):
    [port] = free_ports(1)
    m = Monitor([f"127.0.0.1:{stack.ports.metrics}"], tmp_path_factory.mktemp("dashboard-prometheus"), port, None, 1.0)
    m.start()
    yield m
    m.stop()


def test_the_dashboard_queries_something_in_every_panel():
    assert len(TARGETS) >= 18
    for title, ref, expr in TARGETS:
        assert metric_names(expr), f"{title} {ref} reads no metric: {expr}"


def test_every_metric_a_panel_queries_is_exported_by_the_live_server(exported):
    assert {"switchboard_chat_requests_total", "switchboard_engine_batch_steps_total"} <= exported  # after chats
    missing = unexported(BOARD, exported)
    assert not missing, "panels query metrics the server does not export: " + "; ".join(
        f"{title} ({ref}): {name}" for title, ref, name in missing
    )


def _query(monitor: Monitor, expr: str) -> list[dict]:
    try:
        return monitor.query(expr)
    except urllib.error.HTTPError as e:  # Prometheus answers a bad query with 400 and its reason
        raise AssertionError(f"Prometheus refused {expr}: {e.read().decode()}") from None


def test_prometheus_evaluates_every_panel_query_with_data(prometheus):
    # Each query once Prometheus has scraped the server a few times: every series the panels
    # read exists from the server's start or from the first chats, so each gives a vector.
    pending = {(title, ref): with_window(expr, "1m") for title, ref, expr in TARGETS}
    deadline = time.monotonic() + 60
    while pending:
        for key, expr in list(pending.items()):
            if _query(prometheus, expr):
                del pending[key]
        assert time.monotonic() < deadline or not pending, f"no data within 60 s for {sorted(pending)}"
        time.sleep(1)


def test_the_extractor_reads_prometheus_own_rendering_of_each_query_alike(prometheus):
    for title, ref, expr in TARGETS:
        url = f"{prometheus.url}/api/v1/format_query?" + urllib.parse.urlencode({"query": with_window(expr, "1m")})
        with urllib.request.urlopen(url, timeout=10) as r:
            formatted = json.load(r)["data"]
        assert set(metric_names(formatted)) == set(metric_names(expr)), (title, ref, formatted)

"""The capacity planner's exporter as Kubernetes runs it (``python -m switchboard.ops.capacity
serve``), scraped by a real Prometheus on free ports: the HPA's gauge arrives with the value the
calendar asks for, the adapter's external query reads it, and the planner's range queries
(``PrometheusHistory``) read a series back a minute at a time. No Switchboard server: the
planner does not need one."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from switchboard import paths
from switchboard.ops.capacity.exporter import DESIRED, PrometheusHistory
from switchboard.ops.launch import free_ports
from switchboard.ops.monitor import Monitor
from switchboard.ops.process import http_ok, stop_process, wait_until
from tests.integration.monitortools import eventually

REPLICAS = 7


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    """The exporter with a calendar whose promotion asks for REPLICAS now, and a Prometheus
    that is down as its history (so the forecast is left out and history_up reads 0)."""
    run = tmp_path_factory.mktemp("capacity")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    calendar = run / "calendar.toml"
    calendar.write_text(
        f'[[promotion]]\nname = "now"\nstart = {(now + timedelta(minutes=5)).isoformat()}\n'
        f"end = {(now + timedelta(hours=1)).isoformat()}\nreplicas = {REPLICAS}\n"
    )
    port, dead = free_ports(2)
    cmd = [sys.executable, "-m", "switchboard.ops.capacity", "serve", f"--calendar={calendar}", f"--port={port}"]
    cmd += ["--host=127.0.0.1", f"--prometheus=http://127.0.0.1:{dead}", "--refresh-s=1"]
    log = run / "capacity.log"
    proc = subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), 30, f"the planner (log: {log})", proc)
        yield port, proc, log
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def prometheus(planner, tmp_path_factory):
    port, _, _ = planner
    (prom,) = free_ports(1)
    m = Monitor([f"127.0.0.1:{port}"], tmp_path_factory.mktemp("prometheus"), prom, None, 1.0)
    m.start()
    yield m
    m.stop()


def test_prometheus_scrapes_the_desired_replicas_the_calendar_asks_for(prometheus):
    [sample] = eventually(prometheus, DESIRED)
    assert float(sample["value"][1]) == REPLICAS
    sources = {
        r["metric"]["source"]: float(r["value"][1]) for r in prometheus.query("switchboard_capacity_component_replicas")
    }
    assert sources == {"floor": 2, "calendar": REPLICAS}, "no forecast without a history"
    [up] = prometheus.query("switchboard_capacity_history_up")
    assert up["value"][1] == "0", "the history's Prometheus is down, and it says so"
    [active] = prometheus.query('switchboard_capacity_promotion_active{promotion="now"}')
    assert active["value"][1] == "1"


def test_the_adapters_external_query_reads_the_gauge(prometheus):
    adapter = yaml.safe_load((paths.K8S / "monitoring" / "prometheus-adapter.yaml").read_text())
    [rule] = yaml.safe_load(adapter["data"]["config.yaml"])["externalRules"]
    # here the scrape has no namespace label (static target): the job stands in for it
    expr = rule["metricsQuery"].replace("<<.Series>>", DESIRED).replace("<<.LabelMatchers>>", 'job="switchboard"')
    [sample] = eventually(prometheus, expr)
    assert float(sample["value"][1]) == REPLICAS


def test_the_planners_range_queries_read_a_series_a_minute_at_a_time(prometheus):
    eventually(prometheus, DESIRED)
    history = PrometheusHistory(prometheus.url, query=f"max({DESIRED})")
    now = datetime.now(timezone.utc)
    assert history.rates(now - timedelta(minutes=1), 1) == [REPLICAS], "the sample at the minute's end"
    assert history.rates(now - timedelta(hours=3), 2) == [None, None], "before Prometheus started: no sample"


def test_the_planner_logs_its_plan_and_the_missing_history(planner, prometheus):
    eventually(prometheus, DESIRED)
    _, proc, log = planner
    text = log.read_text()
    assert proc.poll() is None and "Traceback" not in text
    assert f"plan: {REPLICAS} replicas (floor 2, calendar {REPLICAS}); promotions asking: now" in text
    assert "traffic history unavailable" in text


def test_a_history_that_cannot_be_read_is_a_history_error(prometheus, planner):
    from switchboard.ops.capacity.exporter import HistoryError

    now = datetime.now(timezone.utc)
    with pytest.raises(HistoryError, match="400|bad_data|parse"):
        PrometheusHistory(prometheus.url, query="sum(").rates(now - timedelta(minutes=2), 2)
    port, _, _ = planner
    with pytest.raises(HistoryError, match="Expecting value"):  # a 200 that is no JSON: the planner's /metrics
        PrometheusHistory(f"http://127.0.0.1:{port}/metrics#").rates(now - timedelta(minutes=2), 2)


def test_record_writes_a_series_simulate_can_replay(prometheus, tmp_path):
    from switchboard.ops.capacity.__main__ import main
    from switchboard.ops.capacity.simulate import Day

    eventually(prometheus, DESIRED)
    start = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=2)
    out = tmp_path / "series.csv"
    argv = ["record", f"--prometheus={prometheus.url}", f"--query=max({DESIRED})", f"--out={out}"]
    assert main([*argv, f"--start={start.isoformat()}", f"--end={(start + timedelta(minutes=3)).isoformat()}"]) == 0
    day = Day.from_csv(out)
    assert day.start == start and len(day.rates) == 3
    assert day.rates[-1] == REPLICAS, "the last minute's sample"
    assert set(day.rates) <= {0.0, REPLICAS}, "minutes before Prometheus started: 0"

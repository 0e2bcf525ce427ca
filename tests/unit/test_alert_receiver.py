"""The webhook receiver Alertmanager sends to: what it keeps and logs, what it refuses."""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request

import pytest
import yaml

from switchboard.ops.alert_receiver import AlertServer, describe
from switchboard.ops.monitor import alertmanager_config

NOTIFICATION = {
    "version": "4",
    "status": "firing",
    "receiver": "switchboard",
    "groupLabels": {"alertname": "SwitchboardDown"},
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "SwitchboardDown", "severity": "page", "instance": "127.0.0.1:8002"},
            "annotations": {"summary": "the server is down"},
        }
    ],
}


@pytest.fixture
def server(tmp_path):
    s = AlertServer(tmp_path / "alerts.jsonl", port=0)
    thread = threading.Thread(target=s.serve_forever, daemon=True)
    thread.start()
    yield s
    s.shutdown()
    s.server_close()
    thread.join(5)


def post(server, body: bytes) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/alerts", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_notification_is_kept_as_one_json_line_and_each_alert_logged(server, caplog):
    with caplog.at_level(logging.WARNING, logger="switchboard.alerts"):
        assert post(server, json.dumps(NOTIFICATION).encode()) == 200
        assert post(server, json.dumps({**NOTIFICATION, "status": "resolved"}).encode()) == 200
    [first, second] = server.alerts.read()
    assert first["alerts"] == NOTIFICATION["alerts"] and first["received_at"] > 0
    assert second["status"] == "resolved"
    assert "firing SwitchboardDown (instance=127.0.0.1:8002, severity=page): the server is down" in caplog.text


def test_what_is_not_alertmanager_json_is_refused_and_not_kept(server):
    assert post(server, b"not json") == 400
    assert post(server, b"[1, 2]") == 400
    assert server.alerts.read() == []


def test_a_get_answers_for_the_readiness_check(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/-/ready", timeout=5) as r:
        assert r.status == 200


def test_describe_reads_an_alert_without_annotations():
    assert describe({"labels": {"alertname": "X"}}) == "? X"


def test_the_rendered_alertmanager_configuration_sends_to_the_receiver():
    config = yaml.safe_load(alertmanager_config("http://127.0.0.1:40123/alerts"))
    [receiver] = [r for r in config["receivers"] if r["name"] == config["route"]["receiver"]]
    assert receiver["webhook_configs"][0]["url"] == "http://127.0.0.1:40123/alerts"
    assert config["route"]["group_by"] == ["alertname"]

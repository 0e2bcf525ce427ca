"""The alert rules and the Prometheus configuration, checked and unit-tested by Prometheus' own
promtool (monitoring/alerts.test.yml holds the cases: each alert fires on its traffic, after its
`for`, and stays quiet on healthy traffic)."""

from __future__ import annotations

import subprocess

from switchboard.ops.monitor import MONITORING, binary, prometheus_config


def promtool(*args, cwd=MONITORING):
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, cwd=cwd)


def test_the_rules_are_valid():
    check = promtool("check", "rules", "alerts.yml")
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_alert_passes_its_unit_tests():
    run = promtool("test", "rules", "alerts.test.yml")
    assert run.returncode == 0, run.stdout + run.stderr
    tested = (MONITORING / "alerts.test.yml").read_text()
    alerts = [
        line.split(":", 1)[1].strip()
        for line in (MONITORING / "alerts.yml").read_text().splitlines()
        if "- alert:" in line
    ]
    assert len(alerts) == 9 and all(a in tested for a in alerts)


def test_the_rendered_prometheus_configuration_is_valid(tmp_path):
    path = tmp_path / "prometheus.yml"
    path.write_text(prometheus_config(["127.0.0.1:8112", "127.0.0.1:8122"], "127.0.0.1:9093"))
    check = promtool("check", "config", str(path), cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "'127.0.0.1:8112', '127.0.0.1:8122'" in path.read_text()

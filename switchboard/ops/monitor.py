"""Prometheus and Alertmanager (Debian's) against a running Switchboard:
``python -m switchboard.ops.monitor up|down``.

``up`` writes a Prometheus configuration that scrapes the server's metrics port (every
replica's with ``make serve REPLICAS=N``) every 5 s and evaluates monitoring/alerts.yml, and
starts Prometheus (:9090), Alertmanager (:9093) and the webhook receiver Alertmanager sends to
(:9095, ``switchboard.ops.alert_receiver``) in the background with their data under the run
directory; ``down`` stops them. ``Monitor`` does the same on free ports for the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from switchboard import paths
from switchboard.ops.process import http_ok, kill_pid, pid_file, port_open, stop_process, wait_until

MONITORING = paths.ROOT / "monitoring"
PROCESSES = ("prometheus", "alertmanager", "alert-receiver")


def binary(name: str) -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found is None:
        raise SystemExit(
            f"{name} is not installed: `make setup` installs Debian's prometheus and prometheus-alertmanager"
        )
    return found


def prometheus_config(targets: list[str], alertmanager: str | None, interval_s: float = 5.0) -> str:
    lines = [
        "# Rendered by switchboard.ops.monitor.",
        "global:",
        f"  scrape_interval: {interval_s:g}s",
        f"  evaluation_interval: {interval_s:g}s",
        "rule_files:",
        f"  - {MONITORING / 'alerts.yml'}",
    ]
    if alertmanager:
        lines += ["alerting:", "  alertmanagers:", f"    - static_configs: [{{targets: ['{alertmanager}']}}]"]
    lines += [
        "scrape_configs:",
        "  - job_name: switchboard",
        f"    static_configs: [{{targets: [{', '.join(repr(t) for t in targets)}]}}]",
    ]
    return "\n".join(lines) + "\n"


def alertmanager_config(receiver_url: str) -> str:
    """monitoring/alertmanager.yml with its webhook pointed at ``receiver_url``: the checked-in
    file names the default port, the tests run the receiver on a free one."""
    config = yaml.safe_load((MONITORING / "alertmanager.yml").read_text())
    [receiver] = [r for r in config["receivers"] if r["name"] == config["route"]["receiver"]]
    [webhook] = receiver["webhook_configs"]
    webhook["url"] = receiver_url
    return "# Rendered by switchboard.ops.monitor from monitoring/alertmanager.yml.\n" + yaml.safe_dump(
        config, sort_keys=False
    )


class Monitor:
    """Prometheus (and Alertmanager with its webhook receiver unless ``alertmanager_port`` is
    None) scraping ``targets``. The receiver appends what it gets to ``alerts_file``."""

    def __init__(
        self,
        targets: list[str],
        run_dir: Path,
        prometheus_port: int = 9090,
        alertmanager_port: int | None = 9093,
        interval_s: float = 5.0,
        receiver_port: int = 9095,
    ):
        self.targets, self.run_dir, self.interval_s = targets, run_dir, interval_s
        self.prometheus_port, self.alertmanager_port = prometheus_port, alertmanager_port
        self.receiver_port = receiver_port
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def alerts_file(self) -> Path:
        return self.run_dir / "alerts.jsonl"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    def start(self) -> Monitor:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        am = f"127.0.0.1:{self.alertmanager_port}" if self.alertmanager_port else None
        config = self.run_dir / "prometheus.yml"
        config.write_text(prometheus_config(self.targets, am, self.interval_s))
        check = subprocess.run([binary("promtool"), "check", "config", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"promtool refused {config}: {check.stdout}{check.stderr}")
        commands = {
            "prometheus": [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.run_dir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
            ]
        }
        if am:
            receiver = f"127.0.0.1:{self.receiver_port}"
            am_config = self.run_dir / "alertmanager.yml"
            am_config.write_text(alertmanager_config(f"http://{receiver}/alerts"))
            commands["alert-receiver"] = [
                sys.executable,
                "-m",
                "switchboard.ops.alert_receiver",
                f"--port={self.receiver_port}",
                f"--out={self.alerts_file}",
            ]
            commands["alertmanager"] = [
                binary("prometheus-alertmanager"),
                f"--config.file={am_config}",
                f"--storage.path={self.run_dir / 'alertmanager-data'}",
                f"--web.listen-address={am}",
                "--cluster.listen-address=",
            ]
        for name, cmd in commands.items():
            self.procs[name] = subprocess.Popen(
                cmd,
                stdout=open(self.run_dir / f"{name}.log", "ab"),
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            # Its port opens before its storage is: until /-/ready, queries answer 503.
            wait_until(lambda: http_ok(f"{self.url}/-/ready"), 30, "prometheus", self.procs["prometheus"])
            if am:
                wait_until(lambda: port_open(self.alertmanager_port), 30, "alertmanager", self.procs["alertmanager"])
                ready = f"http://{receiver}/-/ready"
                wait_until(lambda: http_ok(ready), 30, "alert receiver", self.procs["alert-receiver"])
        except BaseException:  # one did not start (a port taken): stop the others, no pid files are written
            self.stop()
            raise
        return self

    def query(self, expr: str) -> list[dict]:
        """The instant vector ``expr`` evaluates to now (Prometheus' HTTP API)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"{expr}: {body}")
        return body["data"]["result"]

    def stop(self) -> None:
        for proc in self.procs.values():
            stop_process(proc)
        self.procs.clear()


def targets(args: argparse.Namespace) -> list[str]:
    """The metrics ports of what `make serve` started: every replica's, or the one server's."""
    replicas = args.run_dir / "replicas.json"
    if replicas.exists():
        return [f"127.0.0.1:{r['metrics_port']}" for r in json.loads(replicas.read_text())]
    return [f"127.0.0.1:{args.metrics_port}"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.ops.monitor", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["up", "down"])
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    p.add_argument("--prometheus-port", type=int, default=int(os.environ.get("PROMETHEUS_PORT", 9090)))
    p.add_argument("--alertmanager-port", type=int, default=int(os.environ.get("ALERTMANAGER_PORT", 9093)))
    p.add_argument("--receiver-port", type=int, default=int(os.environ.get("ALERT_RECEIVER_PORT", 9095)))
    p.add_argument("--run-dir", type=Path, default=paths.RUN)
    args = p.parse_args(argv)
    run = args.run_dir / "monitor"
    if args.action == "down":
        stopped = [n for n in PROCESSES if kill_pid(pid_file(run, n), timeout=30)]
        print("stopped: " + (", ".join(stopped) if stopped else "no monitoring was running"))
        return 0
    if pid_file(run, "prometheus").exists():
        print("monitoring already up (make stop first)")
        return 1
    monitor = Monitor(
        targets(args), run, args.prometheus_port, args.alertmanager_port, receiver_port=args.receiver_port
    ).start()
    for name, proc in monitor.procs.items():
        pid_file(run, name).write_text(str(proc.pid))
    print(
        f"[monitor] Prometheus http://127.0.0.1:{args.prometheus_port} scraping {', '.join(monitor.targets)} "
        f"with monitoring/alerts.yml; Alertmanager http://127.0.0.1:{args.alertmanager_port} sending to "
        f"http://127.0.0.1:{args.receiver_port} (kept in {monitor.alerts_file}); logs in {run}/"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

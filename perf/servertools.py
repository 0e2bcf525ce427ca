"""Shared pieces of the perf tools about the server under test: a model repository with other
artifacts in place, Triton's /metrics read as numbers (``perf.bench``, ``scaling``, ``kv``,
``long_prompt`` and the integration tests), and waiting for an HTTP server to answer."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

from switchboard import paths
from switchboard.ops.process import wait_until


def wait_http(url: str, timeout: float, proc=None) -> None:
    """Until ``url`` answers 200; fails as soon as ``proc`` (the server's process) exits."""

    def ok() -> bool:
        try:
            return urllib.request.urlopen(url, timeout=2).status == 200
        except OSError:
            return False

    wait_until(ok, timeout, url, proc)


def repository_with(artifacts: Path, out: Path) -> Path:
    """A copy of the model repository's configs and glue with ``artifacts`` in place (hard links)."""
    from switchboard.repository.install import place_artifacts

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(
        paths.MODEL_REPOSITORY, out, ignore=lambda d, names: [n for n in names if n not in ("config.pbtxt", "model.py")]
        if Path(d).name == "1" else ["__pycache__"],
    )  # fmt: skip
    for version in out.glob("*/1"):
        place_artifacts(artifacts, version, version.parent.name, "local")
    return out


def scrape(port: int, merge: tuple[str, ...] = ("pid", "version")) -> dict:
    """Triton's /metrics as {(name, sorted label items): value} for the switchboard_ and nv_
    samples, summed over the ``merge`` labels (which process and which model version published
    them: docs/metrics.md)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(("switchboard_", "nv_inference_")):
                merged = s.name.startswith("switchboard_")
                key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if not (merged and k in merge))))
                out[key] = out.get(key, 0.0) + s.value
    return out


def metric_delta(before: dict, after: dict) -> dict:
    """Per pool: the engine counters over one run, and decode steps per batch size."""
    pools: dict = {}
    for (name, labels), value in after.items():
        if not name.startswith("switchboard_engine_") or not name.endswith("_total"):
            continue
        labels_d = dict(labels)
        pool = pools.setdefault(labels_d.get("model", "?"), {"batch_steps": {}})
        delta = value - before.get((name, labels), 0.0)
        key = name[len("switchboard_engine_") : -len("_total")]
        if key == "batch_steps":
            if delta > 0:
                pool["batch_steps"][int(labels_d["batch_size"])] = int(round(delta))
        else:
            pool[key] = delta
    return pools


class HttpServerProcess:
    """A peer's server process (llama-server, vLLM) listening on ``port``, started in a session of
    its own with its output in ``log``; ``wait()`` until ``GET /health`` answers 200, ``stop()``."""

    name = "server"

    def __init__(self, cmd: list[str], port: int, log: Path, env: dict | None = None):
        import subprocess

        self.cmd, self.port, self.log = cmd, port, log
        log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            cmd,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2).status == 200
        except OSError:
            return False

    def wait(self, timeout: float = 180):
        from switchboard.ops.process import wait_until

        try:
            wait_until(self.ready, timeout, f"{self.name} on :{self.port}", self.proc)
        except RuntimeError as e:
            tail = self.log.read_text(errors="replace").splitlines()[-10:]
            raise RuntimeError(f"{e}:\n" + "\n".join(tail)) from None
        return self

    def run(self) -> int:
        """In the foreground until the server exits or Ctrl-C stops it (the peers' ``serve``)."""
        print(f"{self.name}: http://127.0.0.1:{self.port}/v1 (log {self.log}); Ctrl-C stops it", flush=True)
        try:
            return self.proc.wait()
        except KeyboardInterrupt:
            self.stop()
            return 0

    def stop(self, grace_s: float = 30) -> None:
        import os
        import subprocess

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()

"""The trace receiver, Arize Phoenix, against a running Switchboard:
``python -m switchboard.ops.traces up|down|install`` (``make traces``).

Phoenix (PyPI's ``arize-phoenix``, pinned) runs from its own venv, ``build/phoenix-venv``,
made on first use (``install``; ``make test`` makes it): its dependencies (protobuf 6 among
them) clash with tritonclient's. It accepts OTLP over HTTP on its web port (``/v1/traces``),
keeps spans in SQLite under its working directory, shows them in its web UI and answers its
REST API (``spans``). Nothing is fetched at run time: its telemetry, its external resources and
its code sandboxes are off. ``up`` starts it in the background (web and OTLP on :6006) and says
how to point the stack at it (docs/tracing.md); ``down`` stops it. ``Phoenix`` does the same on
free ports for the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from switchboard import paths
from switchboard.ops.process import http_ok, kill_pid, pid_file, stop_process, wait_until

PHOENIX = "arize-phoenix==20.26.1"
VENV = paths.BUILD / "phoenix-venv"
_STAMP = VENV / ".switchboard-phoenix"
# The venv is made from Debian's python3.11 like the project's own (scripts/setup.sh says why).
_PYTHON = "/usr/bin/python3.11"


def executable() -> Path | None:
    """Phoenix's command in its venv, or None while the pinned version is not installed there."""
    exe = VENV / "bin" / "phoenix"
    return exe if exe.exists() and _STAMP.exists() and _STAMP.read_text() == PHOENIX else None


def install() -> Path:
    """Phoenix's command, its venv made first when missing (a few minutes, once)."""
    exe = executable()
    if exe is not None:
        return exe
    print(f"[traces] installing {PHOENIX} into {VENV} (a few minutes, once)", flush=True)
    python = _PYTHON if Path(_PYTHON).exists() else sys.executable
    subprocess.run([python, "-m", "venv", str(VENV)], check=True)
    log = paths.LOGS / "phoenix-venv.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as f:
        cmd = [str(VENV / "bin" / "pip"), "install", "--quiet", "--progress-bar", "off", PHOENIX]
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"installing {PHOENIX} failed; log {log}")
    _STAMP.write_text(PHOENIX)
    return VENV / "bin" / "phoenix"


class Phoenix:
    """Phoenix serving on ``port`` (web UI, REST API and OTLP/HTTP) and ``grpc_port`` (OTLP/gRPC),
    its database in ``working_dir``."""

    def __init__(self, working_dir: Path, port: int = 6006, grpc_port: int = 4317):
        self.working_dir, self.port, self.grpc_port = working_dir, port, grpc_port
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The web UI, the REST API and the OTLP/HTTP endpoint (``SWITCHBOARD_TRACE_ENDPOINT``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.working_dir / "phoenix.log"

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_WORKING_DIR": str(self.working_dir),
            # nothing fetched at run time: no usage telemetry, no external resources, no sandboxes
            "PHOENIX_TELEMETRY_ENABLED": "false",
            "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
            "PHOENIX_ALLOWED_SANDBOX_PROVIDERS": "NONE",
        }

    def start(self, timeout_s: float = 180) -> Phoenix:
        exe = executable()
        if exe is None:
            raise RuntimeError(f"{PHOENIX} is not installed in {VENV}: `make traces` installs it")
        self.working_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(exe), "serve"],
            cwd=self.working_dir,
            env=self.environment(),
            stdout=open(self.log, "ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_until(lambda: http_ok(f"{self.url}/healthz"), timeout_s, "phoenix", self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def spans(self, trace_id: str | None = None, project: str = "default") -> list[dict]:
        """The project's spans (Phoenix's REST API, every page), those of ``trace_id`` when given;
        each with ``name``, ``context`` (``trace_id``, ``span_id``), ``parent_id``, ``start_time``,
        ``end_time``, ``status_code`` and ``attributes``."""
        found, cursor = [], None
        while True:
            query = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            url = f"{self.url}/v1/projects/{urllib.parse.quote(project)}/spans?{urllib.parse.urlencode(query)}"
            with urllib.request.urlopen(url, timeout=30) as r:
                page = json.load(r)
            found += [s for s in page["data"] if trace_id is None or s["context"]["trace_id"] == trace_id]
            cursor = page.get("next_cursor")
            if not cursor:
                return found

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.ops.traces", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["up", "down", "install"])
    p.add_argument("--port", type=int, default=int(os.environ.get("PHOENIX_PORT", 6006)))
    p.add_argument("--grpc-port", type=int, default=int(os.environ.get("PHOENIX_GRPC_PORT", 4317)))
    p.add_argument("--run-dir", type=Path, default=paths.RUN)
    args = p.parse_args(argv)
    run = args.run_dir / "traces"
    if args.action == "install":
        install()
        print(f"[traces] {PHOENIX} in {VENV}")
        return 0
    if args.action == "down":
        stopped = kill_pid(pid_file(run, "phoenix"), timeout=30)
        print("stopped: phoenix" if stopped else "stopped: no trace receiver was running")
        return 0
    if pid_file(run, "phoenix").exists():
        print("the trace receiver is already up (make stop first)")
        return 1
    install()
    phoenix = Phoenix(run, args.port, args.grpc_port).start()
    pid_file(run, "phoenix").write_text(str(phoenix.proc.pid))
    print(
        f"[traces] Phoenix {phoenix.url} (web UI; OTLP/HTTP at {phoenix.url}/v1/traces; data and log in {run}/)\n"
        f"[traces] trace the stack: make stop; SWITCHBOARD_TRACE_ENDPOINT={phoenix.url} make serve"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

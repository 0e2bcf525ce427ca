"""The HTTP gateway (``python -m switchboard.gateway``) as a real process on a free port in
front of the test stack, and its API keys."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from switchboard.ops.launch import free_port

LIVE_KEY = "sk-live-" + secrets.token_hex(12)  # tier live: priority 1 allowed (agents)
STANDARD_KEY = "sk-std-" + secrets.token_hex(12)  # tier standard: priority 2 only


class Gateway:
    def __init__(self, grpc_url: str, run_dir: Path, *args: str, keys: bool = True, env: dict | None = None):
        """``env``: more environment variables for the gateway (its tracing, say)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = run_dir / f"gateway-{self.port}.log"
        cmd = [sys.executable, "-m", "switchboard.gateway", "--port", str(self.port), "--grpc-url", grpc_url, *args]
        if keys:
            keys_file = run_dir / f"keys-{self.port}"
            keys_file.write_text(f"# test keys\n{LIVE_KEY} live\n{STANDARD_KEY} standard\n")
            cmd += ["--keys-file", str(keys_file)]
        env = {k: v for k, v in os.environ.items() if k != "SWITCHBOARD_API_KEYS"} | (env or {})
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the gateway did not start: {self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

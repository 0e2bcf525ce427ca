"""Background processes as the stack runs them (tritonserver, redis-server, HAProxy,
Prometheus): wait until one is ready, stop one with its process group, and the pid files
``make stop`` reads.

Imported by ``launch``, ``balancer`` and ``monitor`` and importing none of them, so starting
the balancer from ``launch`` makes no import circle.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_ok(url: str, timeout: float = 2) -> bool:
    """A GET of ``url`` answers 200: False when refused, timed out or any other status
    (urllib's HTTPError is an OSError)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def wait_until(check: Callable[[], bool], timeout: float, what: str, proc: subprocess.Popen | None) -> None:
    """Until ``check()``; fails as soon as ``proc`` (the process that should get there) exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s")


def stop_process(proc: subprocess.Popen | None, timeout: float = 10, settled: Callable[[], bool] | None = None) -> None:
    """Stop a process started in its own session, then anything left in its group: the
    Python-backend stubs of a tritonserver that crashed outlive it otherwise. ``settled``: what
    says that the rest of the clean stop can be skipped."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # tritonserver shuts down models cleanly on SIGINT
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline and not (settled and settled()):
            time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def pid_file(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.pid"


def kill_pid(path: Path, timeout: float = 30) -> bool:
    """Stop the process whose pid ``path`` holds (SIGINT, its group killed after ``timeout``)
    and remove the file; False if there was none to stop."""
    try:
        pid = int(path.read_text())
    except (OSError, ValueError):
        return False
    path.unlink(missing_ok=True)
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.2)
    os.killpg(pid, signal.SIGKILL)
    return True


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stubs(pid: int) -> dict[tuple[str, str], int]:
    """Python-backend stub processes of a tritonserver, by (model, version)."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) != pid:
                continue
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        for a in args:
            path = Path(a.decode(errors="replace"))
            if path.name == "model.py" and path.parent.name.isdigit():  # <model>/<version>/model.py
                out[(path.parent.parent.name, path.parent.name)] = int(proc.name)
    return out

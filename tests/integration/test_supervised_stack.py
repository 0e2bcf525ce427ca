"""`python -m switchboard.ops.launch up` on free ports: the supervisor restarts tritonserver when it
dies (as 2.51 sometimes does when a stub is killed) and when a stub dies under a server that
stays up (which 2.51 never repairs), and `down` stops everything it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from switchboard.client import ChatClient, ChatError
from switchboard.ops.launch import Ports, children
from switchboard.ops.process import alive


@pytest.fixture(scope="module")
def supervised(artifacts, tmp_path_factory):
    ports, run = Ports.free(), tmp_path_factory.mktemp("supervised")
    args = [
        "--http-port",
        str(ports.http),
        "--grpc-port",
        str(ports.grpc),
        "--metrics-port",
        str(ports.metrics),
        "--redis-port",
        str(ports.redis),
        "--run-dir",
        str(run),
    ]
    launch = [sys.executable, "-m", "switchboard.ops.launch"]
    up = subprocess.run(
        launch + ["up", *args, "--probe-interval-s", "1", "--probe-failures", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    yield ports, run
    pids = [int((run / "supervisor.pid").read_text()), _state(run)["tritonserver_pid"]]
    down = subprocess.run(launch + ["down", *args], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
    time.sleep(0.5)
    assert not [pid for pid in pids if alive(pid)], "down must stop the supervisor and tritonserver"


def _state(run) -> dict:
    return json.loads((run / "supervisor.json").read_text())


def _wait_for_restart(run, restarts: int, client: ChatClient, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _state(run)
        if state["restarts"] >= restarts and client.ready():
            return state
        time.sleep(0.5)
    raise AssertionError(f"no restart {restarts} within {timeout:.0f} s: {_state(run)}")


def test_a_healthy_stack_passes_every_probe(supervised):
    _, run = supervised
    deadline = time.monotonic() + 60
    while _state(run)["probes"] < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    state = _state(run)
    assert state["probes"] >= 3, state
    assert state["restarts"] == 0 and state["failures"] == 0 and state["last_failure"] is None, state


def test_a_server_that_dies_is_restarted_and_sessions_survive(supervised):
    ports, run = supervised
    client = ChatClient(f"127.0.0.1:{ports.grpc}", timeout_s=60)
    client.chat("Where is my order?", session_id="survivor", stream=False, max_new_tokens=8)
    pid = _state(run)["tritonserver_pid"]
    os.kill(pid, signal.SIGKILL)  # as when 2.51 aborts (SIGSEGV, boost lock_exception)
    state = _wait_for_restart(run, 1, client)
    assert state["tritonserver_pid"] != pid and "exited" in state["last_failure"]
    again = client.chat("And when will it arrive?", session_id="survivor", stream=False, max_new_tokens=8)
    assert again.stats.raw["session"] == "hit", "Redis keeps running across restarts"


def test_a_dead_chat_stub_is_caught_by_the_probe_and_the_server_restarted(supervised):
    ports, run = supervised
    client = ChatClient(f"127.0.0.1:{ports.grpc}", timeout_s=60)
    before = _state(run)
    os.kill(children(before["tritonserver_pid"])["chat"], signal.SIGKILL)
    with pytest.raises(ChatError):  # 2.51 leaves the model READY but every chat fails
        client.chat("Where is my order?", stream=False, max_new_tokens=8)
    state = _wait_for_restart(run, before["restarts"] + 1, client)
    assert state["tritonserver_pid"] != before["tritonserver_pid"]
    assert "chat" in state["last_failure"], state
    assert client.chat("Where is my order?", stream=False, max_new_tokens=8).stats.generated_tokens > 0

"""The supervisor's restart policy, and its warm-up, readiness and liveness (what Kubernetes'
probes ask, deploy/k8s) with the HTTP endpoints that serve them, on a fake stack."""

import json
import threading
import urllib.error
import urllib.request

import pytest

from switchboard.ops.launch import free_port
from switchboard.ops.supervisor import LIVENESS_PATH, READINESS_PATH, ProbeServer, Supervisor


class FakeProc:
    def __init__(self, pid=100):
        self.pid, self.returncode = pid, None

    def poll(self):
        return self.returncode


class FakeStack:
    def __init__(self):
        self.triton = FakeProc()
        self.restarted = 0
        self.ready_during_restart = []  # what readiness said while tritonserver restarted
        self.supervisor = None

    def restart_triton(self):
        if self.supervisor is not None:
            self.ready_during_restart.append(self.supervisor.why_not_ready())
        self.restarted += 1
        self.triton = FakeProc(100 + self.restarted)


def test_a_server_that_exited_is_restarted_at_once():
    stack = FakeStack()
    sup = Supervisor(stack, probe=lambda: None)
    stack.triton.returncode = -11
    reason = sup.check()
    assert reason == "tritonserver exited with code -11"
    sup.restart(reason)
    assert stack.restarted == 1 and sup.restarts == 1 and sup.check() is None


def test_restart_only_after_the_given_number_of_failed_probes_in_a_row():
    results = iter(["chat: stub not healthy", None, "a", "b", "c"])
    stack = FakeStack()
    sup = Supervisor(stack, probe=lambda: next(results), failures_to_restart=3)
    assert sup.check() is None and sup.failures == 1
    assert sup.check() is None and sup.failures == 0, "a good probe resets the count"
    assert sup.check() is None and sup.check() is None
    assert sup.check() == "c"


def test_run_restarts_and_records_its_state(tmp_path):
    stack = FakeStack()
    failures = iter(["engine_short: Stub process is not healthy"] * 2)
    stop = threading.Event()

    def probe():
        failure = next(failures, None)
        if failure is None:
            stop.set()
        return failure

    sup = Supervisor(stack, probe, interval_s=0.01, failures_to_restart=2, state_file=tmp_path / "s.json")
    sup.run(stop)
    assert stack.restarted == 1
    state = (tmp_path / "s.json").read_text()
    assert '"restarts": 1' in state and '"tritonserver_pid": 101' in state and "not healthy" in state


def test_a_failed_restart_is_retried_with_a_growing_pause():
    stack = FakeStack()
    calls = []

    def restart():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("ports still in use")
        stack.triton = FakeProc(200)

    stack.restart_triton = restart
    stack.triton.returncode = 1
    stop = threading.Event()
    sup = Supervisor(stack, probe=lambda: stop.set(), interval_s=0.01)
    sup.run(stop)
    assert len(calls) == 2 and stack.triton.pid == 200


class Script:
    """A probe or warm-up answering from a list, then None; records its calls."""

    def __init__(self, name, calls, answers=()):
        self.name, self.calls, self.answers = name, calls, list(answers)

    def __call__(self):
        self.calls.append(self.name)
        return self.answers.pop(0) if self.answers else None


def supervised(probe_answers=(), warm_up_answers=(), **kwargs):
    stack, calls = FakeStack(), []
    sup = Supervisor(
        stack, Script("probe", calls, probe_answers), warm_up=Script("warm-up", calls, warm_up_answers), **kwargs
    )
    stack.supervisor = sup
    return stack, sup, calls


def test_not_ready_until_the_warm_up_has_answered_then_the_probe_takes_over():
    _, sup, calls = supervised()
    assert sup.why_not_ready() == "warming up"
    assert sup.check() is None
    assert calls == ["warm-up"] and sup.why_not_ready() is None
    assert sup.check() is None
    assert calls == ["warm-up", "probe"] and sup.why_not_ready() is None


def test_a_failed_warm_up_keeps_it_not_ready_and_counts_towards_a_restart():
    stack, sup, calls = supervised(
        warm_up_answers=["chat: no answer within 60 s", "chat: refused"], failures_to_restart=2
    )
    assert sup.check() is None and "warm-up failed" in sup.why_not_ready()
    reason = sup.check()
    assert reason == "chat: refused", "the second failure in a row restarts (failures_to_restart=2)"
    assert sup.last_failure == "warm-up: chat: refused"
    sup.restart(reason)
    assert stack.ready_during_restart == ["warming up"], "not ready while tritonserver restarts"
    assert sup.failures == 0
    assert sup.why_not_ready() == "warming up", "the new server has not answered yet"
    assert sup.check() is None and sup.why_not_ready() is None
    assert calls == ["warm-up"] * 3


def test_a_failed_probe_makes_it_not_ready_until_one_passes():
    _, sup, calls = supervised(probe_answers=["engine_long: Stub process is not healthy"])
    sup.check()
    assert sup.check() is None and sup.failures == 1
    assert sup.why_not_ready() == "probe failed: engine_long: Stub process is not healthy"
    assert sup.check() is None and sup.why_not_ready() is None
    assert calls == ["warm-up", "probe", "probe"]


def test_a_server_that_exited_is_not_ready_at_once():
    stack, sup, _ = supervised()
    sup.check()
    stack.triton.returncode = -9
    assert sup.why_not_ready() == "tritonserver is not running"
    stack.triton = None  # between the stop and the start of a restart
    assert sup.why_not_ready() == "tritonserver is not running"


def test_without_a_warm_up_the_probe_warms_up(tmp_path):
    calls = []
    sup = Supervisor(FakeStack(), Script("probe", calls))
    assert sup.check() is None and sup.warmed and calls == ["probe"]


class RecordingStop(threading.Event):
    """A stop event that records how long each round waited before it ran."""

    def __init__(self):
        super().__init__()
        self.waits = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return self.is_set()


def test_run_warms_up_at_once_and_again_at_once_after_a_restart(tmp_path):
    stop = RecordingStop()
    stack, sup, calls = supervised(
        probe_answers=["a", "b"], failures_to_restart=2, interval_s=5.0, state_file=tmp_path / "s.json"
    )

    def warm_up():  # the second one, the restarted server's, ends the run
        calls.append("warm-up")
        if calls.count("warm-up") == 2:
            stop.set()

    sup.warm_up = warm_up
    sup.run(stop)
    assert calls == ["warm-up", "probe", "probe", "warm-up"] and stack.restarted == 1
    assert stop.waits == [0.0, 5.0, 5.0, 0.0, 5.0], "warm-ups at once, probes every interval_s"
    state = json.loads((tmp_path / "s.json").read_text())
    assert state["ready"] is True and state["restarts"] == 1


def test_not_live_when_restarts_keep_failing_or_the_rounds_stop():
    _, sup, _ = supervised(give_up_after_s=300.0, stuck_after_s=600.0)
    now = sup.heartbeat
    assert sup.why_not_live(now + 599) is None
    assert sup.why_not_live(now + 601) == "no probe round for 601 s"
    sup.heartbeat, sup.restart_failing_since, sup.last_failure = now + 400, now + 100, "ports still in use"
    assert sup.why_not_live(now + 399) is None
    assert sup.why_not_live(now + 401) == "restarts failing for 301 s: ports still in use"


def test_run_records_when_restarts_started_failing_and_clears_it_on_success():
    stack, sup, _ = supervised()
    seen = []

    def restart():
        seen.append(sup.restart_failing_since)
        if len(seen) < 3:
            raise RuntimeError("ports still in use")
        stack.triton = FakeProc(200)

    stack.restart_triton = restart
    stack.triton.returncode = 1
    stop = RecordingStop()
    sup.warm_up = stop.set  # the new server's warm-up ends the run
    sup.run(stop)
    assert seen[0] is None and seen[1] is not None and seen[2] == seen[1], "the first failure in a row counts"
    assert sup.restart_failing_since is None and sup.why_not_live() is None


def _get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def endpoints():
    state = {"live": None, "ready": "warming up"}
    server = ProbeServer("127.0.0.1", free_port(), lambda: state["live"], lambda: state["ready"])
    yield server.port, state
    server.stop()


def test_the_endpoints_answer_200_or_503_with_the_reason(endpoints):
    port, state = endpoints
    assert _get(port, LIVENESS_PATH) == (200, {"ok": True, "reason": None})
    assert _get(port, READINESS_PATH) == (503, {"ok": False, "reason": "warming up"})
    state["ready"] = None
    assert _get(port, READINESS_PATH + "?verbose=1") == (200, {"ok": True, "reason": None})
    state["live"] = "no probe round for 601 s"
    assert _get(port, LIVENESS_PATH)[0] == 503
    assert _get(port, "/v2/health/ready")[0] == 404, "only the two paths"

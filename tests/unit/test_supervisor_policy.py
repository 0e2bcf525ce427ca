"""The supervisor's restart policy, and its warm-up, readiness and liveness (what Kubernetes'
probes ask, deploy/k8s) with the HTTP endpoints that serve them, on a fake stack."""

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from switchboard.ops.crash_log import CrashLog
from switchboard.ops.health_server import LIVENESS_PATH, READINESS_PATH, ProbeServer
from switchboard.ops.launch import free_port
from switchboard.ops.supervisor import Supervisor


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


class Repairable:
    """A supervisor's view of one server's stubs, model probes and reloads, scripted."""

    def __init__(self, reload_works=True):
        self.now = {("chat", "1"): 10, ("engine_short", "1"): 11, ("engine_long", "1"): 12}
        self.dead, self.reloaded, self.reload_works = set(), [], reload_works
        self.unloaded = set()

    def kill(self, model):
        del self.now[(model, "1")]
        self.dead.add(model)

    def stubs(self):
        return dict(self.now)

    def loaded(self, model, version):
        return (model, version) not in self.unloaded

    def probe(self, model, version):
        return f"{model}: Stub process '{model}_0_0' is not healthy." if model in self.dead else None

    def reload(self, model):
        self.reloaded.append(model)
        if not self.reload_works:
            raise RuntimeError(f"loading {model} failed (400)")
        self.dead.discard(model)
        self.now[(model, "1")] = 20 + len(self.reloaded)


def repairable(reload_works=True, **kwargs):
    stack, calls = FakeStack(), []
    r = Repairable(reload_works)
    sup = Supervisor(
        stack, Script("probe", calls), stubs=r.stubs, model_probe=r.probe, reload=r.reload, loaded=r.loaded, **kwargs
    )
    sup.warmed = True
    return stack, sup, r


def test_a_stub_that_died_is_reloaded_alone_at_once_and_the_server_keeps_running():
    stack, sup, r = repairable()
    assert sup.watch() is None  # the first look learns the stubs
    r.kill("engine_short")
    assert sup.watch() is None
    assert r.reloaded == ["engine_short"] and sup.reloads == 1 and stack.restarted == 0
    assert "engine_short" in sup.last_reload and sup.known_stubs[("engine_short", "1")] == 21
    assert sup.watch() is None and r.reloaded == ["engine_short"], "the new stub is known: nothing more to do"


def test_a_stub_that_exited_with_its_version_unloaded_is_left_alone():
    _, sup, r = repairable()
    sup.watch()
    del r.now[("engine_short", "1")]  # a rollout unloaded the version
    r.unloaded.add(("engine_short", "1"))
    assert sup.watch() is None and r.reloaded == [] and sup.reloads == 0


def test_a_reload_that_fails_asks_for_a_restart():
    stack, sup, r = repairable(reload_works=False)
    sup.watch()
    r.kill("chat")
    reason = sup.watch()
    assert r.reloaded == ["chat"] and "chat" in reason and sup.reloads == 0


def test_a_server_that_exited_is_seen_between_rounds():
    stack, sup, _ = repairable()
    stack.triton.returncode = -6  # 2.51 sometimes aborts when a stub is killed
    assert sup.watch() == "tritonserver exited with code -6"


def run_until_answered(sup, *answers):
    """``sup.run`` with a probe that fails with ``answers`` in turn, then stops the run."""
    stop, left = threading.Event(), list(answers)

    def probe():
        if not left:
            stop.set()
            return None
        return left.pop(0)

    sup.probe = probe
    sup.run(stop)


def test_a_probe_failure_naming_a_model_reloads_that_model_before_any_restart():
    stack, sup, r = repairable(interval_s=0.01, failures_to_restart=1)
    r.kill("engine_long")
    run_until_answered(sup, "engine_long: no answer within 20 s")
    assert r.reloaded == ["engine_long"] and stack.restarted == 0 and sup.reloads == 1


def test_the_server_is_restarted_when_a_failure_names_no_model_or_the_reload_fails():
    for answer, reload_works in (("tritonserver: connection refused", True), ("chat: not healthy", False)):
        stack, sup, r = repairable(reload_works=reload_works, interval_s=0.01, failures_to_restart=1)
        r.dead.add("chat")
        run_until_answered(sup, answer)
        assert stack.restarted == 1 and sup.reloads == 0, answer


def test_between_rounds_a_dead_stub_is_reloaded_within_the_watch_interval():
    stack, sup, r = repairable(interval_s=60.0, watch_s=0.01)
    stop = threading.Event()
    runner = threading.Thread(target=sup.run, args=(stop,))
    runner.start()
    try:
        deadline = time.monotonic() + 5
        while not sup.known_stubs and time.monotonic() < deadline:
            time.sleep(0.01)
        r.kill("engine_short")
        while not r.reloaded and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.reloaded == ["engine_short"] and stack.restarted == 0, "long before the next round (60 s)"
    finally:
        stop.set()
        runner.join(5)


CRASH = "Signal (6) received.\n 0# 0x00005555 in /opt/tritonserver/bin/tritonserver\n"


def test_the_crash_log_reports_a_crash_line_once_and_only_after_its_mark(tmp_path):
    path = tmp_path / "tritonserver.log"
    path.write_text("I1126 model loaded\n" + CRASH)  # the last server's crash
    log = CrashLog(path)
    log.mark()
    assert log.crashed() is None
    with path.open("a") as f:
        f.write("E1126 Stub process 'chat_0_0' is not healthy.\nterminate called after throwing 'lock_exception'\nSig")
    assert log.crashed() is None
    with path.open("a") as f:
        f.write("nal (6) received.\n")  # the line split across two reads
    assert "Signal (6) received." in log.crashed()
    assert log.crashed() is None, "reported once"
    with path.open("a") as f:
        f.write("Signal (15) received.\n")  # SIGTERM: a stop, not a crash
    assert log.crashed() is None
    assert CrashLog(tmp_path / "none.log").crashed() is None


def test_a_reload_sent_to_a_server_that_crashed_is_not_waited_for(tmp_path):
    """2.51 sometimes aborts when a stub is killed; the aborting server runs on while it writes
    its stack trace and the reload would wait out its whole timeout."""
    stack, sup, r = repairable(watch_s=0.01)
    sup.crash_log = CrashLog(tmp_path / "tritonserver.log")
    sup.crash_log.mark()
    hung = threading.Event()
    sup.reload = lambda model: hung.wait(30)  # the server never answers
    sup.watch()
    r.kill("chat")
    (tmp_path / "tritonserver.log").write_text(CRASH)
    t0 = time.monotonic()
    reason = sup.watch()
    hung.set()
    assert time.monotonic() - t0 < 10, "a bound against the reload's own 30 s, not a timing check"
    assert reason is not None and "crashed" in reason and sup.reloads == 0
    sup.restart(reason)
    assert stack.restarted == 1 and sup.crash_log.crashed() is None


def test_a_crash_in_the_log_is_seen_between_rounds(tmp_path):
    stack, sup, _ = repairable()
    sup.crash_log = CrashLog(tmp_path / "tritonserver.log")
    sup.crash_log.mark()
    assert sup.watch() is None
    (tmp_path / "tritonserver.log").write_text("Signal (11) received.\n")
    assert "Signal (11) received." in sup.watch()

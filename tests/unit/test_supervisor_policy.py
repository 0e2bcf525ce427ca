import threading

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

    def restart_triton(self):
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

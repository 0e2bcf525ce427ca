"""Stopping a process: SIGINT first, then the whole group killed after the timeout, or as soon
as ``settled`` says the rest of the clean stop is not worth waiting for (tritonserver waiting on
a model whose stub died, which never unloads in 2.51)."""

import subprocess
import sys
import time

from switchboard.ops.process import stop_process

IGNORES_SIGINT = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"


def _start():
    return subprocess.Popen([sys.executable, "-c", IGNORES_SIGINT], start_new_session=True)


def test_a_process_that_ignores_sigint_is_killed_after_the_timeout():
    proc = _start()
    time.sleep(0.3)
    t0 = time.monotonic()
    stop_process(proc, timeout=1.0)
    assert proc.poll() is not None and 1.0 <= time.monotonic() - t0 < 10


def test_settled_ends_the_wait_before_the_timeout():
    proc, asked = _start(), []
    time.sleep(0.3)
    t0 = time.monotonic()
    stop_process(proc, timeout=30, settled=lambda: asked.append(1) or len(asked) >= 3)
    assert proc.poll() is not None and len(asked) == 3 and time.monotonic() - t0 < 10


def test_a_process_that_exits_on_sigint_is_not_waited_for():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    time.sleep(0.3)
    stop_process(proc, timeout=30, settled=lambda: False)
    assert proc.returncode is not None

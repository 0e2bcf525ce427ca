"""Stopping a process: SIGINT first, then the whole group killed after the timeout, or as soon
as ``settled`` says the rest of the clean stop is not worth waiting for (tritonserver waiting on
a model whose stub died, which never unloads in 2.51)."""

import subprocess
import sys
import time

from switchboard.ops.process import stop_process

READY = "print('ready', flush=True); time.sleep(60)"
IGNORES_SIGINT = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); " + READY


def _start(code: str = IGNORES_SIGINT) -> subprocess.Popen:
    """A child running ``code``, once it has set its SIGINT handler (it prints ``ready``)."""
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    return proc


def test_a_process_that_ignores_sigint_is_killed_after_the_timeout():
    proc = _start()
    t0 = time.monotonic()
    stop_process(proc, timeout=1.0)
    assert proc.poll() is not None and 1.0 <= time.monotonic() - t0 < 10


def test_settled_ends_the_wait_before_the_timeout():
    proc, asked = _start(), []
    t0 = time.monotonic()
    stop_process(proc, timeout=30, settled=lambda: asked.append(1) or len(asked) >= 3)
    assert proc.poll() is not None and len(asked) == 3 and time.monotonic() - t0 < 10


# SIGINT's Python default, set in the child: a shell that ran the tests in the background left
# SIGINT ignored, and a child inherits that (it then waited out the whole timeout).
EXITS_ON_SIGINT = "import signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); " + READY


def test_a_process_that_exits_on_sigint_is_not_waited_for():
    proc = _start(EXITS_ON_SIGINT)
    t0 = time.monotonic()
    stop_process(proc, timeout=30, settled=lambda: False)
    assert proc.returncode is not None and time.monotonic() - t0 < 10

"""Keep tritonserver serving: restart it when it exits or stops answering real requests.

Triton 2.51 never restarts a Python-backend stub that died: its model stays READY and every
request to it fails ("Stub process ... is not healthy"), and a killed stub sometimes aborts the
whole server (boost::interprocess::lock_exception). Readiness alone cannot see the first case.
So the supervisor probes with real requests every few seconds (one priority-1 chat, and one
token from each engine pool directly) and restarts tritonserver when it has exited or failed
``failures`` probes in a row. redis-server keeps running across restarts: sessions survive.
A dead stub is reloaded alone (``with_reloads``); a server whose log says it crashed
(``CrashLog``) is restarted at once, not waited for while it writes its stack trace.

After each (re)start the first round is a warm-up: the same probe with a few generated tokens,
sent at once. The supervisor calls itself ready only once it has answered and no probe has
failed since; with ``--probe-port`` it serves that on ``READINESS_PATH`` and its own health on
``LIVENESS_PATH`` for an orchestrator (deploy/k8s, docs/kubernetes.md).

Here the loop and its decisions (``Supervisor``) and the command line; the probes are
``probes``, the crash line ``crash_log``, the two HTTP paths ``health_server``.

``python -m switchboard.ops.launch up`` runs the stack under this supervisor in the background;
``python -m switchboard.ops.supervisor --help`` runs it in the foreground.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from switchboard.ops.crash_log import CrashLog
from switchboard.ops.health_server import LIVENESS_PATH, READINESS_PATH, ProbeServer
from switchboard.ops.probes import WARM_UP_TOKENS, model_of, probe, probe_model

log = logging.getLogger("switchboard.ops.supervisor")


@dataclass
class Supervisor:
    """Restart decisions over a ``Stack`` (switchboard.ops.launch) and a probe."""

    stack: object
    probe: Callable[[], str | None]
    interval_s: float = 5.0
    failures_to_restart: int = 3
    state_file: Path | None = None
    probes: int = 0
    failures: int = 0
    restarts: int = 0
    last_failure: str | None = None
    restarted_at: float | None = None  # time.monotonic() when the last restart was ready
    # The first round after each (re)start (None: ``probe``); ready only once it has answered.
    warm_up: Callable[[], str | None] | None = None
    warmed: bool = False
    restart_failing_since: float | None = None  # time.monotonic() of the first failed restart in a row
    heartbeat: float = field(default_factory=time.monotonic)  # the last round's end
    give_up_after_s: float = 300.0  # restarts failing this long: not live (the container restarts)
    stuck_after_s: float = 600.0  # no round this long (more than a start, 180 s, plus a probe): not live
    # Repairing one model without a restart (None: restarts only). ``stubs``: the stub processes
    # now, by (model, version); ``model_probe(model, version)``: that model's probe; ``reload(model)``:
    # load it again through the model-repository API (raises on failure); ``loaded``: below.
    stubs: Callable[[], dict] | None = None
    model_probe: Callable[[str, str | None], str | None] | None = None
    loaded: Callable[[str, str], bool] | None = None  # whether Triton still has (model, version) loaded
    reload: Callable[[str], None] | None = None
    watch_s: float = 0.5  # how often the stubs are looked at between rounds
    reloads: int = 0
    last_reload: str | None = None
    known_stubs: dict = field(default_factory=dict)
    crash_log: CrashLog | None = None  # tritonserver's log, for the line it writes as it crashes

    def why_not_ready(self) -> str | None:
        """None while tritonserver runs, has answered its warm-up and no probe failed since."""
        proc = self.stack.triton
        if proc is None or proc.poll() is not None:
            return "tritonserver is not running"
        if not self.warmed:
            return "warming up" if self.failures == 0 else f"warm-up failed: {self.last_failure}"
        return f"probe failed: {self.last_failure}" if self.failures else None

    def why_not_live(self, now: float | None = None) -> str | None:
        """None unless the supervisor cannot bring tritonserver back (restarts failing for
        ``give_up_after_s``) or its rounds stopped: then the container should be restarted."""
        now = time.monotonic() if now is None else now
        if self.restart_failing_since is not None and now - self.restart_failing_since > self.give_up_after_s:
            return f"restarts failing for {now - self.restart_failing_since:.0f} s: {self.last_failure}"
        if now - self.heartbeat > self.stuck_after_s:
            return f"no probe round for {now - self.heartbeat:.0f} s"
        return None

    def check(self) -> str | None:
        """One round: why tritonserver must restart now, or None."""
        proc = self.stack.triton
        if proc is None:
            return "tritonserver is not running"
        if proc.poll() is not None:
            return f"tritonserver exited with code {proc.returncode}"
        warming = not self.warmed
        failure = (self.warm_up or self.probe)() if warming else self.probe()
        self.probes += 1
        if failure is None:
            self.failures = 0
            if warming:
                self.warmed = True
                log.info("warm-up answered: ready")
            return None
        self.failures += 1
        self.last_failure = f"warm-up: {failure}" if warming else failure
        log.warning("probe failed (%d of %d): %s", self.failures, self.failures_to_restart, self.last_failure)
        if proc.poll() is not None:
            return f"tritonserver exited with code {proc.returncode}"
        return failure if self.failures >= self.failures_to_restart else None

    def restart(self, reason: str) -> None:
        self.restarts += 1
        self.last_failure = reason
        log.error("restarting tritonserver (restart %d): %s", self.restarts, reason)
        self.warmed, self.failures, self.known_stubs = False, 0, {}  # none of the old server's
        self.stack.restart_triton()
        if self.crash_log is not None:  # the new server's log from here (the old one's end is not its)
            self.crash_log.mark()
        self.known_stubs = self.stubs() if self.stubs is not None else {}  # every model is ready now
        self.restarted_at = time.monotonic()
        log.info("tritonserver ready again (pid %d)", self.stack.triton.pid)

    def watch(self) -> str | None:
        """Between rounds: a stub that exited since the last look while its model version is
        still loaded died (Triton 2.51 keeps it READY) and is reloaded at once (``recover``); one
        whose version was unloaded (a rollout's canary) is left alone. Returns why tritonserver
        must restart, or None."""
        failure = self.gone()
        if failure is not None:
            return failure
        proc = self.stack.triton
        if self.stubs is None or proc is None:
            return None
        now = self.stubs()
        gone = [key for key in self.known_stubs if key not in now]
        self.known_stubs = now
        for model, version in gone:
            if self.loaded is not None and not self.loaded(model, version):
                log.info("%s version %s: its stub exited as the version was unloaded", model, version)
                continue
            self.last_failure = f"{model} version {version}: its stub process exited"
            if not self.recover(model, self.last_failure):
                return self.last_failure
        return None

    def gone(self) -> str | None:
        """Why tritonserver is gone or going: it exited, or its log says it crashed."""
        proc = self.stack.triton
        if proc is not None and proc.poll() is not None:
            return f"tritonserver exited with code {proc.returncode}"
        return self.crash_log.crashed() if self.crash_log is not None else None

    def recover(self, model: str, reason: str) -> bool:
        """Reload ``model`` alone (Triton 2.51 never restarts a dead stub, and a server restart
        takes every model away for seconds); True once it answers its probe again. A server that
        exits or crashes meanwhile is not waited for."""
        if self.reload is None or self.model_probe is None:
            return False
        t0 = time.monotonic()
        log.error("%s; reloading %s alone", reason, model)
        try:
            failure = self._watched(lambda: self.reload(model))
            if failure is None:
                failure = self.model_probe(model, None)
            else:
                self.last_failure = failure
        except Exception as e:  # noqa: BLE001 - any failure here means: restart the server
            failure = str(e)
        if failure is not None:
            log.error("reloading %s did not bring it back (%s): restarting tritonserver", model, failure)
            return False
        self.reloads += 1
        self.failures = 0
        self.last_reload = f"{model} in {time.monotonic() - t0:.1f} s ({reason})"
        self.known_stubs = self.stubs() if self.stubs is not None else {}
        log.warning("%s reloaded and answering again %.1f s later", model, time.monotonic() - t0)
        self.write_state()
        return True

    def _watched(self, call: Callable[[], None]) -> str | None:
        """Run ``call`` (a reload) while watching the server every ``watch_s``: None once it
        returned, why the server is gone if it went first (the call is left to fail on its own);
        what ``call`` raised is raised."""
        done, raised = threading.Event(), []

        def run() -> None:
            try:
                call()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                raised.append(e)
            finally:
                done.set()

        threading.Thread(target=run, name="supervisor-reload", daemon=True).start()
        while not done.wait(self.watch_s):
            failure = self.gone()
            if failure is not None:
                return failure
        if raised:
            raise raised[0]
        return None

    def run(self, stop: threading.Event) -> None:
        backoff, wait = 0.0, 0.0  # the first round, the warm-up, at once
        self.known_stubs = self.stubs() if self.stubs is not None else {}  # the server is ready: every model
        self.write_state()
        while True:
            stopped, reason = self.pause(stop, wait)
            if stopped:
                return
            wait = self.interval_s
            if reason is None:
                reason = self.check()
                model = model_of(reason) if reason is not None else None
                if model is not None and self.stack.triton.poll() is None and self.recover(model, reason):
                    reason = None
            if reason is not None:
                try:
                    self.restart(reason)
                    backoff, wait = 0.0, 0.0  # warm the new server up at once
                    self.restart_failing_since = None
                except Exception as e:  # the next round tries again, waiting longer each time
                    backoff = min(60.0, max(2.0, backoff * 2))
                    wait = self.interval_s + backoff
                    if self.restart_failing_since is None:
                        self.restart_failing_since = time.monotonic()
                    log.error("restart failed (next try in %.0f s): %s", wait, e)
            self.heartbeat = time.monotonic()
            self.write_state()

    def pause(self, stop: threading.Event, seconds: float) -> tuple[bool, str | None]:
        """Wait ``seconds`` between rounds, watching the stubs every ``watch_s`` meanwhile:
        (stopped, why tritonserver must restart now or None)."""
        if self.stubs is None:
            return stop.wait(seconds), None
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if stop.wait(min(self.watch_s, left)):
                return True, None
            reason = self.watch()
            if reason is not None:
                return False, reason
        return stop.is_set(), None

    def write_state(self) -> None:
        if self.state_file is None:
            return
        proc = self.stack.triton
        state = {
            "pid": os.getpid(),
            "tritonserver_pid": proc.pid if proc is not None else None,
            "probes": self.probes,
            "restarts": self.restarts,
            "reloads": self.reloads,
            "last_reload": self.last_reload,
            "failures": self.failures,
            "last_failure": self.last_failure,
            "ready": self.why_not_ready() is None,
            "checked_at": time.time(),
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_file)


def with_reloads(supervisor: Supervisor, timeout_s: float = 120.0) -> Supervisor:
    """``supervisor`` repairing a dead model of its stack (``switchboard.ops.launch.Stack``) by
    reloading that model alone, through the model-repository API with the stack's operator key."""
    from switchboard.ops.launch import operator_key
    from switchboard.ops.model_control import reload_model, version_ready
    from switchboard.ops.process import stubs

    stack = supervisor.stack
    key, http = operator_key(stack.run_dir), f"http://127.0.0.1:{stack.ports.http}"
    supervisor.stubs = lambda: stubs(stack.triton.pid) if stack.triton is not None else {}
    supervisor.model_probe = lambda model, version: probe_model(stack.grpc_url, model, 10.0, version=version)
    supervisor.reload = lambda model: reload_model(http, model, key, timeout_s=timeout_s)
    supervisor.loaded = lambda model, version: version_ready(http, model, version)
    return supervisor


def with_crash_log(supervisor: Supervisor) -> Supervisor:
    """``supervisor`` reading its stack's tritonserver log for a crash, from now on."""
    supervisor.crash_log = CrashLog(supervisor.stack.triton_log)
    supervisor.crash_log.mark()
    return supervisor


def parser() -> argparse.ArgumentParser:
    """The command line (also what deploy/k8s runs in each pod; tests/unit/test_k8s_manifests.py parses it)."""
    from switchboard.ops.launch import add_stack_arguments

    p = argparse.ArgumentParser(prog="python -m switchboard.ops.supervisor", description=__doc__.split("\n\n")[0])
    add_stack_arguments(p)
    p.add_argument("--interval-s", type=float, default=5.0, help="seconds between probes (default 5)")
    p.add_argument("--failures", type=int, default=3, help="failed probes in a row before a restart (default 3)")
    p.add_argument("--probe-timeout-s", type=float, default=20.0, help="deadline of one probe request (default 20)")
    p.add_argument(
        "--shared-redis",
        action="store_true",
        help="Redis on --redis-port is another replica's: neither start nor stop it",
    )
    p.add_argument("--redis-url", help="Redis elsewhere (e.g. redis://redis:6379/0): implies --shared-redis")
    p.add_argument(
        "--probe-port",
        type=int,
        default=int(os.environ.get("PROBE_PORT", 0)),
        help=f"serve {LIVENESS_PATH} and {READINESS_PATH} on this port (default 0: not served)",
    )
    p.add_argument("--probe-address", default="0.0.0.0", help="address of --probe-port (default 0.0.0.0)")
    p.add_argument(
        "--warm-up-timeout-s", type=float, default=60.0, help="deadline of the warm-up requests (default 60)"
    )
    p.add_argument(
        "--reload-timeout-s",
        type=float,
        default=120.0,
        help="how long reloading one dead model may take before the server is restarted instead (default 120)",
    )
    p.add_argument(
        "--no-reload",
        action="store_true",
        help="repair a dead model by restarting tritonserver, not by reloading the model alone",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    from switchboard.ops.launch import stack_from_arguments

    args = parser().parse_args(argv)
    args.shared_redis = args.shared_redis or bool(args.redis_url)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.run_dir.mkdir(parents=True, exist_ok=True)
    stack = stack_from_arguments(args)
    if args.redis_url:
        stack.env["SWITCHBOARD_REDIS_URL"] = args.redis_url
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    state_file = args.run_dir / "supervisor.json"
    state_file.unlink(missing_ok=True)
    supervisor = Supervisor(
        stack, lambda: probe(stack.grpc_url, args.probe_timeout_s), args.interval_s, args.failures, state_file
    )
    supervisor.warm_up = lambda: probe(stack.grpc_url, args.warm_up_timeout_s, WARM_UP_TOKENS)
    if not args.no_reload:
        with_reloads(supervisor, args.reload_timeout_s)
    endpoints = None
    if args.probe_port:  # up before the slow start: live while loading, not ready
        endpoints = ProbeServer(
            args.probe_address,
            args.probe_port,
            supervisor.why_not_live,
            lambda: "stopping" if stop.is_set() else supervisor.why_not_ready(),
        )
        log.info("probes: http://%s:%d%s and %s", args.probe_address, endpoints.port, LIVENESS_PATH, READINESS_PATH)
    log.info("starting redis-server :%d and tritonserver (gRPC :%d)", args.redis_port, args.grpc_port)
    try:
        stack.start_triton() if args.shared_redis else stack.start()
    except BaseException as e:
        log.error("the stack did not start: %s", e)
        return 1
    with_crash_log(supervisor)
    log.info("serving: gRPC %s; warming up, then probing every %.0f s", stack.grpc_url, args.interval_s)
    try:
        supervisor.run(stop)
    finally:
        log.info("stopping")
        if endpoints is not None:
            endpoints.stop()
        stack.stop_triton() if args.shared_redis else stack.stop()
        state_file.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Start and stop the stack: ``python -m switchboard.ops.launch up|down|status``.

``up`` starts a private redis-server and tritonserver (the pytriton build, Python backend)
in the background under ``switchboard.ops.supervisor`` (which restarts tritonserver when it dies or
stops answering), waits until every model is READY and records the supervisor's pid under the
run directory; ``down`` stops exactly what ``up`` started. ``up --replicas N`` starts N
tritonservers sharing one Redis, each under its own supervisor on ports 100 + 10 * i above the
given ones, and Debian's HAProxy on the gRPC port in front of them (switchboard.ops.balancer);
``scale --replicas N`` then starts or stops replicas while the stack serves, and HAProxy takes
them in or drains them through its admin socket. The same ``Stack`` class starts servers on free
ports for the integration tests.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from switchboard import paths
from switchboard.ops.balancer import SLOTS, Admin, Balancer, BalancerError, Replica, add, admin_socket, remove
from switchboard.ops.model_control import OPERATOR_HEADER
from switchboard.ops.process import http_ok, kill_pid, pid_file, port_open, stop_process, stubs, wait_until

# `up --replicas`'s ports, repository and balancer, for `scale`
FLEET = "fleet.json"


def jemalloc(env: dict[str, str]) -> str | None:
    """The jemalloc library to preload into tritonserver and its stubs, or None. With glibc's
    malloc, tritonserver's memory crept up 10% in a 10-minute `make soak` (streams of KV-sized
    messages freed on many threads: fragmentation); with jemalloc it stayed flat
    (docs/reliability.md, "`make soak` runs"). ``SWITCHBOARD_ALLOCATOR=glibc`` keeps glibc's."""
    if env.get("SWITCHBOARD_ALLOCATOR", "jemalloc") != "jemalloc" or "jemalloc" in env.get("LD_PRELOAD", ""):
        return None
    name = ctypes.util.find_library("jemalloc")
    return name if name and name.startswith("libjemalloc.so") else None


def operator_key(run_dir: Path) -> str:
    """The key the model-repository API wants in the ``switchboard-operator-key`` header:
    ``SWITCHBOARD_OPERATOR_KEY`` when set (a Kubernetes Secret), else ``operator.key`` in the run
    directory, made on first use and readable only by its owner. Whoever can read it can load
    and unload models; it is also on tritonserver's command line (Triton 2.51 takes it nowhere
    else), so keep the server's host to the operators (docs/rollout.md)."""
    if os.environ.get("SWITCHBOARD_OPERATOR_KEY"):
        return os.environ["SWITCHBOARD_OPERATOR_KEY"]
    path = Path(run_dir) / "operator.key"
    if not path.exists():
        import secrets

        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    key = path.read_text().strip()
    if not key or any(c in key for c in ",= \t"):
        raise SystemExit(f"{path}: the operator key must be one word without ',' or '='")
    return key


def loadable(repository: Path) -> list[str]:
    """The models of ``repository`` that can load now: all but ``asr`` before a recognizer is
    installed in it (its ``asr.json``), which would fail the start (``--exit-on-error``)."""
    out = []
    for config in sorted(Path(repository).glob("*/config.pbtxt")):
        model = config.parent.name
        if model == "asr" and not (config.parent / "1" / "asr.json").is_file():
            continue
        out.append(model)
    return out


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports. Each socket stays bound until all are picked: a port released
    after one pick can be handed out again by the next (CI once got the same port for Triton's
    HTTP and Redis)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@dataclass
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002
    redis: int = 6379

    @classmethod
    def free(cls) -> "Ports":
        return cls(*free_ports(4))


@dataclass
class Stack:
    ports: Ports = field(default_factory=Ports)
    repository: Path = paths.MODEL_REPOSITORY
    run_dir: Path = paths.RUN
    backends: Path = paths.BUILD / "triton" / "backends"
    env: dict[str, str] = field(default_factory=dict)  # extra SWITCHBOARD_* overrides
    redis: subprocess.Popen | None = None
    triton: subprocess.Popen | None = None

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.ports.redis}/0"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    def start_redis(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if port_open(self.ports.redis):
            raise SystemExit(f"port {self.ports.redis} is in use: set REDIS_PORT or stop what listens there")
        self.redis = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(self.ports.redis),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--maxmemory",
                "512mb",
                "--maxmemory-policy",
                "volatile-ttl",  # KV blocks (shorter TTL) before conversations: docs/kv-cache.md
            ],
            stdout=open(self.run_dir / f"redis-{self.ports.redis}.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(lambda: port_open(self.ports.redis), 10, "redis-server", self.redis)

    def stop_redis(self) -> None:
        stop_process(self.redis)
        self.redis = None

    def start_triton(self, timeout: float = 180) -> None:
        from switchboard.ops.install_backend import install, server_binary, server_library_dir

        install(self.backends)
        for p in (self.ports.http, self.ports.grpc, self.ports.metrics):
            if port_open(p):
                raise SystemExit(f"port {p} is in use: set HTTP_PORT/GRPC_PORT/METRICS_PORT or stop what listens there")
        env = dict(os.environ)
        venv_bin = str(Path(sys.executable).parent)
        # The Python backend stub imports from the environment first on PATH.
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
        env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)
        env["LD_LIBRARY_PATH"] = str(server_library_dir()) + os.pathsep + env.get("LD_LIBRARY_PATH", "")
        env["SWITCHBOARD_REDIS_URL"] = self.redis_url
        env["SWITCHBOARD_ENGINE_URL"] = self.grpc_url
        env.update(self.env)
        key = operator_key(self.run_dir)
        preload = jemalloc(env)
        if preload:
            env["LD_PRELOAD"] = " ".join(filter(None, (preload, env.get("LD_PRELOAD"))))
        cmd = [
            str(server_binary()),
            "--model-repository",
            str(self.repository),
            "--backend-directory",
            str(self.backends),
            "--http-port",
            str(self.ports.http),
            "--grpc-port",
            str(self.ports.grpc),
            "--metrics-port",
            str(self.ports.metrics),
            # Every model that can serve at start-up (``loadable``); later loads (the recognizer once
            # it is built: switchboard/ops/voice.py; a new model version: switchboard/ops/rollout.py)
            # only through the model-repository API, which answers only requests carrying the
            # operator key (--*-restricted-*: Triton's restricted APIs).
            "--model-control-mode",
            "explicit",
            *[arg for model in loadable(self.repository) for arg in ("--load-model", model)],
            "--http-restricted-api",
            f"model-repository:{OPERATOR_HEADER}={key}",
            "--grpc-restricted-protocol",
            f"model-repository:{OPERATOR_HEADER}={key}",
            "--exit-on-error",
            "true",
            "--strict-readiness",
            "true",
            "--backend-config",
            "python,shm-default-byte-size=16777216",
            "--backend-config",
            "python,shm-growth-byte-size=16777216",
            "--log-verbose",
            "0",
        ]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.triton_log = self.run_dir / f"tritonserver-{self.ports.grpc}.log"
        self.triton = subprocess.Popen(
            cmd, env=env, stdout=open(self.triton_log, "ab"), stderr=subprocess.STDOUT, start_new_session=True
        )
        wait_until(self.ready, timeout, f"tritonserver (log: {self.triton_log})", self.triton)

    def ready(self) -> bool:
        return http_ok(f"http://127.0.0.1:{self.ports.http}/v2/health/ready", timeout=1)

    def stop_triton(self, timeout: float = 30, settled: Callable[[], bool] | None = None) -> None:
        stop_process(self.triton, timeout, settled)
        self.triton = None

    def restart_triton(self, stop_timeout: float = 10) -> None:
        """Stop tritonserver and whatever stubs it left, then start it again on the same ports.
        A model whose stub died never unloads in 2.51, so a clean stop would wait out its 30 s:
        once no stub runs any more (requests in flight finished, the live models unloaded),
        what is left is killed."""
        proc = self.triton
        self.stop_triton(stop_timeout, settled=lambda: not children(proc.pid))
        ports = (self.ports.http, self.ports.grpc, self.ports.metrics)
        wait_until(lambda: not any(port_open(p) for p in ports), 30, "the old tritonserver's ports", None)
        self.start_triton()

    def start(self) -> "Stack":
        self.start_redis()
        try:
            self.start_triton()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.stop_triton()
        self.stop_redis()


def children(pid: int) -> dict[str, int]:
    """Python-backend stubs of a tritonserver process, by model name (one of each model's versions)."""
    return {model: stub for (model, _), stub in stubs(pid).items()}


def add_stack_arguments(p: argparse.ArgumentParser) -> None:
    """Ports, repository and run directory, shared by ``launch`` and ``supervisor``."""
    p.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    p.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    p.add_argument("--redis-port", type=int, default=int(os.environ.get("REDIS_PORT", 6379)))
    p.add_argument("--repository", type=Path, default=paths.MODEL_REPOSITORY)
    p.add_argument("--run-dir", type=Path, default=paths.RUN)


def stack_arguments(args: argparse.Namespace) -> list[str]:
    """``args`` from ``add_stack_arguments`` as a command line again."""
    return [
        "--http-port",
        str(args.http_port),
        "--grpc-port",
        str(args.grpc_port),
        "--metrics-port",
        str(args.metrics_port),
        "--redis-port",
        str(args.redis_port),
        "--repository",
        str(args.repository),
        "--run-dir",
        str(args.run_dir),
    ]


def stack_from_arguments(args: argparse.Namespace) -> Stack:
    return Stack(
        Ports(args.http_port, args.grpc_port, args.metrics_port, args.redis_port), args.repository, args.run_dir
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.ops.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["up", "down", "status", "scale"])
    add_stack_arguments(p)
    p.add_argument("--timeout-s", type=float, default=300, help="how long `up` waits for the models (default 300)")
    p.add_argument("--probe-interval-s", type=float, default=5.0, help="seconds between the supervisor's probes")
    p.add_argument("--probe-failures", type=int, default=3, help="failed probes in a row before a restart")
    p.add_argument(
        "--replicas",
        type=int,
        default=int(os.environ.get("REPLICAS", 1)),
        help="tritonservers sharing one Redis behind HAProxy on the gRPC port (default 1: no balancer); "
        f"`scale`: how many to run now, 1 to {SLOTS}",
    )
    p.add_argument(
        "--gateway-port",
        type=int,
        default=0,
        help="start the HTTP gateway (OpenAI-compatible API, web chat) on this port in front of the gRPC port "
        "(`make serve`: GATEWAY_PORT, 8080; default 0: none)",
    )
    p.add_argument(
        "--asr-model",
        default=os.environ.get("ASR_MODEL") or "",
        help="the speech recognizer: a Hugging Face Whisper checkpoint (`make serve`: ASR_MODEL; default: Whisper "
        "base, converted from its pinned packages and exported in the background while text chat already serves); "
        "'off': none",
    )
    args = p.parse_args(argv)
    run = args.run_dir
    pidfile, state_file = pid_file(run, "supervisor"), run / "supervisor.json"
    if args.action == "down":
        stopped = [name for name, path in _pidfiles(run) if kill_pid(path, timeout=90)]
        (run / "replicas.json").unlink(missing_ok=True)
        (run / FLEET).unlink(missing_ok=True)
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        return 0
    if args.action == "scale":
        return scale(run, args.replicas, args.timeout_s)
    if args.action == "status":
        _voice_status(run)
        if (run / "replicas.json").exists():
            return _replicas_status(run)
        if not pidfile.exists():
            print("not started")
            return 1
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        print(
            f"supervisor: pid {pidfile.read_text().strip()}; tritonserver: pid {state.get('tritonserver_pid')}, "
            f"restarts {state.get('restarts', 0)}, last failure: {state.get('last_failure') or 'none'}"
        )
        return 0
    if pidfile.exists() or (run / "replicas.json").exists():
        print("already up (make stop first)")
        return 1
    if args.replicas > 1:
        return _up_replicas(args)
    t0 = time.monotonic()
    print(
        f"[serve] starting redis-server on :{args.redis_port} and tritonserver (HTTP :{args.http_port}, "
        f"gRPC :{args.grpc_port}, metrics :{args.metrics_port}) under a supervisor ...",
        flush=True,
    )
    if not _start_supervisor(args, []) or not _start_gateway(args):
        return 1
    _start_voice(args)
    print(
        f"[serve] ready in {time.monotonic() - t0:.0f} s: gRPC 127.0.0.1:{args.grpc_port}, HTTP http://127.0.0.1:"
        f"{args.http_port}, metrics http://127.0.0.1:{args.metrics_port}/metrics\n[serve] logs in {run}/ "
        f"(supervisor.log: probes and restarts); try `make chat`; `make stop` stops everything"
    )
    return 0


def _start_supervisor(args: argparse.Namespace, extra: list[str]) -> bool:
    """One tritonserver (and Redis, unless ``--shared-redis`` is in ``extra``) under a supervisor
    with ``args``'s ports and run directory; True once every model is ready."""
    run = args.run_dir
    run.mkdir(parents=True, exist_ok=True)
    state_file, log_path = run / "supervisor.json", run / "supervisor.log"
    state_file.unlink(missing_ok=True)
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "switchboard.ops.supervisor",
            *stack_arguments(args),
            "--interval-s",
            str(args.probe_interval_s),
            "--failures",
            str(args.probe_failures),
            *extra,
        ],
        stdout=open(log_path, "ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(state_file.exists, args.timeout_s, f"the stack (log: {log_path})", supervisor)
    except (RuntimeError, TimeoutError) as e:
        stop_process(supervisor, timeout=60)
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        print(f"{e}\n" + "\n".join(tail), file=sys.stderr)
        return False
    pid_file(run, "supervisor").write_text(str(supervisor.pid))
    return True


def _start_gateway(args: argparse.Namespace) -> bool:
    """The HTTP gateway (switchboard.gateway: OpenAI-compatible API, web chat) on
    ``--gateway-port`` in front of the gRPC port; True once it listens (or with port 0: none)."""
    if not args.gateway_port:
        return True
    if port_open(args.gateway_port):
        print(f"port {args.gateway_port} is in use: set GATEWAY_PORT (0: no gateway); `make stop` stops the rest")
        return False
    log_path = args.run_dir / "gateway.log"
    cmd = [sys.executable, "-m", "switchboard.gateway", "--port", str(args.gateway_port)]
    cmd += ["--grpc-url", f"127.0.0.1:{args.grpc_port}"]
    proc = subprocess.Popen(
        cmd, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_until(lambda: port_open(args.gateway_port), 60, f"the gateway (log: {log_path})", proc)
    except (RuntimeError, TimeoutError) as e:
        stop_process(proc)
        print(f"{e}; `make stop` stops the rest", file=sys.stderr)
        return False
    pid_file(args.run_dir, "gateway").write_text(str(proc.pid))
    print(
        f"[serve] gateway: OpenAI-compatible API http://127.0.0.1:{args.gateway_port}/v1, web chat "
        f"http://127.0.0.1:{args.gateway_port}/ (docs/gateway.md)"
    )
    return True


def _start_voice(args: argparse.Namespace) -> None:
    """The recognizer joins in the background (switchboard/ops/voice.py): built, installed and
    loaded while text chat already serves."""
    if args.asr_model == "off":
        return
    cmd = [sys.executable, "-m", "switchboard.ops.voice", "join", "--repository", str(args.repository)]
    cmd += ["--run-dir", str(args.run_dir), "--http-port", str(args.http_port)]
    if args.asr_model:
        cmd += ["--model", args.asr_model]
    log_path = args.run_dir / "voice.log"
    proc = subprocess.Popen(
        cmd, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    pid_file(args.run_dir, "voice").write_text(str(proc.pid))
    ready = "asr" in loadable(args.repository)
    print(
        "[serve] voice: "
        + ("the recognizer is installed; checking it is the one asked for" if ready else "building the recognizer")
        + f" in the background (log: {log_path}); until it is loaded, speech requests get 503 with Retry-After"
    )


def _voice_status(run: Path) -> None:
    """The recognizer's stage (switchboard/ops/voice.py), if `make serve` started it."""
    try:
        state = json.loads((run / "voice.json").read_text())
    except (OSError, ValueError):
        return
    detail = f" ({state['error']})" if state.get("error") else ""
    print(f"voice: {state['stage']}{detail}, recognizer {state['model']}")


def replica_arguments(args: argparse.Namespace, i: int) -> argparse.Namespace:
    """Replica ``i``'s ports (100 + 10 * i above the given HTTP, gRPC and metrics ports) and run directory."""
    offset = 100 + 10 * i
    return argparse.Namespace(
        **{
            **vars(args),
            "http_port": args.http_port + offset,
            "grpc_port": args.grpc_port + offset,
            "metrics_port": args.metrics_port + offset,
            "run_dir": args.run_dir / f"replica-{i}",
        }
    )


def _up_replicas(args: argparse.Namespace) -> int:
    t0, run = time.monotonic(), args.run_dir
    run.mkdir(parents=True, exist_ok=True)
    os.environ["SWITCHBOARD_OPERATOR_KEY"] = operator_key(run)  # one key for every replica
    replicas = []
    for i in range(args.replicas):
        r = replica_arguments(args, i)
        what = f"redis-server on :{args.redis_port} and " if i == 0 else ""
        print(f"[serve] replica {i}: starting {what}tritonserver (gRPC :{r.grpc_port}) under a supervisor ...")
        if not _start_supervisor(r, [] if i == 0 else ["--shared-redis"]):
            for _, path in _pidfiles(run):
                kill_pid(path, timeout=90)
            return 1
        replicas.append(Replica(f"replica-{i}", r.grpc_port, r.http_port, r.metrics_port))
    balancer = Balancer(args.grpc_port, replicas, run, stats_port=args.http_port).start()
    pid_file(run, "haproxy").write_text(str(balancer.proc.pid))
    if not _start_gateway(args):
        return 1
    (run / "replicas.json").write_text(json.dumps([vars(r) for r in replicas]))
    # what `scale` needs to start more replicas as these were started
    fleet = {key: getattr(args, key) for key in ("http_port", "grpc_port", "metrics_port", "redis_port")}
    (run / FLEET).write_text(json.dumps({**fleet, "repository": str(args.repository), "port": args.grpc_port}))
    _start_voice(args)
    print(
        f"[serve] ready in {time.monotonic() - t0:.0f} s: {args.replicas} replicas behind HAProxy on gRPC "
        f"127.0.0.1:{args.grpc_port} (sessions kept on one replica), its stats on http://127.0.0.1:{args.http_port}/"
        f"\n[serve] replicas' own ports: {', '.join(str(r.grpc_port) for r in replicas)}; logs in {run}/; "
        "`make scale REPLICAS=n` runs more or fewer, live; `make stop` stops everything"
    )
    return 0


def scale(run: Path, replicas: int, timeout_s: float = 300) -> int:
    """Runs ``replicas`` replicas where ``up --replicas`` runs some: starts the missing ones (each
    under its supervisor, on Redis of replica 0) and adds each to HAProxy once it is ready, or
    drains the last ones out of HAProxy (their streams finish) and stops them."""
    listed = run / "replicas.json"
    if not listed.exists() or not (run / FLEET).exists():
        up = "is not running" if not pid_file(run, "supervisor").exists() else "runs one server, no balancer"
        print(f"`make serve` {up} ({run}): scaling needs `make serve REPLICAS=n` with n >= 2", file=sys.stderr)
        return 1
    if not 1 <= replicas <= SLOTS:
        print(f"--replicas {replicas}: from 1 to {SLOTS} (the balancer's slots)", file=sys.stderr)
        return 1
    fleet = json.loads((run / FLEET).read_text())
    base = argparse.Namespace(**{**fleet, "repository": Path(fleet["repository"]), "run_dir": run})
    base.timeout_s, base.probe_interval_s, base.probe_failures = timeout_s, 5.0, 3
    admin = Admin(admin_socket(run, fleet["port"]))
    os.environ["SWITCHBOARD_OPERATOR_KEY"] = operator_key(run)  # the key every replica has
    running = json.loads(listed.read_text())
    t0 = time.monotonic()
    try:
        while len(running) < replicas:
            i = len(running)
            r = replica_arguments(base, i)
            print(f"[scale] replica {i}: starting tritonserver (gRPC :{r.grpc_port}) under a supervisor", flush=True)
            if not _start_supervisor(r, ["--shared-redis"]):
                return 1
            replica = Replica(f"replica-{i}", r.grpc_port, r.http_port, r.metrics_port)
            try:
                add(admin, i, replica)
            except BalancerError:
                kill_pid(pid_file(r.run_dir, "supervisor"), timeout=90)
                raise
            running.append(vars(replica))
            listed.write_text(json.dumps(running))
            print(f"[scale] replica {i} takes chats (+{time.monotonic() - t0:.0f} s)", flush=True)
        if len(running) > replicas:
            gone = list(range(replicas, len(running)))
            print(f"[scale] draining replicas {', '.join(map(str, gone))} (their chats finish, sessions move) ...")
            ports = {i: running[i]["metrics_port"] for i in gone}
            drained = remove(admin, gone, idle=lambda i: _chats_in_flight(ports[i]) == 0)
            for i in reversed(gone):
                kill_pid(pid_file(run / f"replica-{i}", "supervisor"), timeout=90)
                running.pop()
                listed.write_text(json.dumps(running))
                left = "" if drained[i] else " (chats still open at the drain's end were cut)"
                print(f"[scale] replica {i} stopped{left} (+{time.monotonic() - t0:.0f} s)", flush=True)
    except (BalancerError, OSError) as e:
        print(f"[scale] {e}", file=sys.stderr)
        return 1
    n = len(running)
    print(f"[scale] {n} replica{'s' if n != 1 else ''} behind HAProxy on gRPC 127.0.0.1:{fleet['port']}")
    return 0


def _chats_in_flight(metrics_port: int) -> float | None:
    """Chats a replica holds (generating or waiting in its admission), from its /metrics; None
    when it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    names = ("switchboard_chat_admission_running", "switchboard_chat_admission_waiting")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name in names)


def _pidfiles(run: Path) -> list[tuple[str, Path]]:
    """What ``down`` stops, balancer first: (name, pid file)."""
    out = [("voice build", pid_file(run, "voice")), ("gateway", pid_file(run, "gateway"))]
    out.append(("haproxy", pid_file(run, "haproxy")))
    out += [(f"{d.name} (supervisor, tritonserver)", pid_file(d, "supervisor")) for d in sorted(run.glob("replica-*"))]
    out.append(("supervisor, tritonserver, redis-server", pid_file(run, "supervisor")))
    return [(name, path) for name, path in out if path.exists()]


def _replicas_status(run: Path) -> int:
    for r in json.loads((run / "replicas.json").read_text()):
        state_file = run / r["name"] / "supervisor.json"
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        print(
            f"{r['name']}: gRPC :{r['grpc_port']}, tritonserver pid {state.get('tritonserver_pid')}, "
            f"restarts {state.get('restarts', 0)}, last failure: {state.get('last_failure') or 'none'}"
        )
    haproxy = pid_file(run, "haproxy")
    print(f"haproxy: pid {haproxy.read_text().strip() if haproxy.exists() else 'not running'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""HAProxy (Debian's) in front of several Switchboard replicas: one gRPC address for clients.

gRPC is HTTP/2 end to end (``proto h2`` on both sides). Session affinity: the SDK sends a
digest of a chat's session id as the ``x-session-id`` header and HAProxy picks the replica by a consistent
hash of it, so a session's turns land where its KV blocks are local; chats without a session id
go round robin. Each replica is health-checked on its HTTP port (``/v2/health/ready``) every
half second: a replica that dies is out within about a second, its sessions move to the others
(whose Redis tier has their blocks), and connections that cannot reach a replica are
re-dispatched to another. A chat already streaming from a replica that dies is lost with it;
the SDK retries a chat that had received nothing yet.

Replicas join and leave a running HAProxy through its runtime API (the admin socket in the run
directory): the configuration holds ``SLOTS`` servers, those not running disabled; ``add``
points a free slot at a replica and enables it, ``remove`` drains one (no new streams; its chats
finish) and then disables it. HAProxy routes each stream on its own, so a replica added live takes
new streams on the connections clients already hold; the SDK's pooled streams, each routed once,
are renewed every ``stream_max_age_s`` (15 s), so their chats follow within that time.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from switchboard.ops.process import port_open, stop_process, wait_until
from switchboard.wire import SESSION_HEADER, STREAM_MAX_AGE_S


@dataclass(frozen=True)
class Replica:
    name: str
    grpc_port: int
    http_port: int
    metrics_port: int | None = None


SLOTS = 16  # servers a running balancer can hold: the replicas it started with and those added live


def slot_name(i: int) -> str:
    return f"replica-{i}"


def haproxy_config(
    port: int,
    replicas: list[Replica],
    stats_port: int | None = None,
    host: str = "127.0.0.1",
    admin_socket: Path | None = None,
    slots: int = 0,
) -> str:
    """``replicas`` as HAProxy servers, then (with ``slots``) disabled servers up to ``slots`` in
    all, named ``replica-<i>`` by position, for replicas added live through ``admin_socket``."""
    if slots and len(replicas) > slots:
        raise ValueError(f"{len(replicas)} replicas, but the balancer holds {slots}")
    servers = [
        f"    server {r.name} 127.0.0.1:{r.grpc_port} proto h2 check port {r.http_port} check-proto h1"
        for r in replicas
    ]
    # a free slot: an address nothing listens on, in maintenance until `add` points it at a replica
    servers += [
        f"    server {slot_name(i)} 127.0.0.1:1 proto h2 check port 1 check-proto h1 disabled"
        for i in range(len(replicas), slots)
    ]
    servers = "\n".join(servers)
    admin = f"\n    stats socket {admin_socket} mode 600 level admin" if admin_socket else ""
    stats = (
        f"""
frontend stats
    bind {host}:{stats_port}
    stats enable
    stats uri /
    stats refresh 2s
"""
        if stats_port
        else ""
    )
    return f"""# Rendered by switchboard.ops.balancer: gRPC to {len(replicas)} Switchboard replicas.
global
    maxconn 4096{admin}
    # one client connection carries many chats (the SDK multiplexes its streams on one channel):
    # at HAProxy's default of 100 streams a connection, the 101st chat waited in the client's
    # gRPC queue, unseen by chat's admission, which could neither shed nor order it
    tune.h2.max-concurrent-streams 4096
    log stdout format raw local0 warning

defaults
    mode http
    log global
    timeout connect 1s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
    # a connection that cannot reach its replica goes to another one
    retries 2
    option redispatch 1

frontend grpc
    bind {host}:{port} proto h2
    default_backend replicas

backend replicas
    # the same session to the same replica (its KV blocks are local there); no header: round robin
    balance hdr({SESSION_HEADER})
    hash-type consistent
    option httpchk GET /v2/health/ready
    http-check expect status 200
    default-server inter 500ms fall 2 rise 2
{servers}
{stats}"""


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        raise SystemExit("haproxy is not installed: `make setup` installs Debian's haproxy")
    return found


class BalancerError(RuntimeError):
    pass


class Admin:
    """HAProxy's runtime API on its admin socket: one command a connection."""

    def __init__(self, path: Path, timeout_s: float = 5.0):
        self.path, self.timeout_s = path, timeout_s

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(self.timeout_s)
            s.connect(str(self.path))
            s.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace").strip()

    def servers(self, backend: str = "replicas") -> dict[str, dict[str, str]]:
        """Each server's row of ``show stat`` (status: UP, DOWN, DRAIN, MAINT, ...; scur: streams now)."""
        lines = self.command("show stat").splitlines()
        if not lines or not lines[0].startswith("# "):
            raise BalancerError(f"haproxy's `show stat` said: {lines[:1]}")
        header = lines[0][2:].split(",")
        rows = [dict(zip(header, line.split(","))) for line in lines[1:] if line]
        return {r["svname"]: r for r in rows if r["pxname"] == backend and r["svname"] not in ("FRONTEND", "BACKEND")}

    def set(self, line: str) -> None:
        """A command that answers nothing when it succeeds (HAProxy's convention), else fails."""
        answer = self.command(line)
        if answer and not answer.startswith("no need to change"):
            raise BalancerError(f"haproxy refused `{line}`: {answer}")


def admin_socket(run_dir: Path, port: int) -> Path:
    return run_dir / f"haproxy-{port}.sock"


class Balancer:
    """A haproxy process in front of ``replicas``, listening on ``port``; replicas added and
    removed while it runs (``add``, ``remove``) through its admin socket."""

    def __init__(self, port: int, replicas: list[Replica], run_dir: Path, stats_port: int | None = None):
        self.port, self.replicas, self.run_dir, self.stats_port = port, replicas, run_dir, stats_port
        self.proc: subprocess.Popen | None = None
        self.admin = Admin(admin_socket(run_dir, port))

    def config(self) -> str:
        slots = max(SLOTS, len(self.replicas))
        return haproxy_config(self.port, self.replicas, self.stats_port, admin_socket=self.admin.path, slots=slots)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Balancer":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = self.run_dir / f"haproxy-{self.port}.cfg"
        config.write_text(self.config())
        binary = haproxy_binary()
        check = subprocess.run([binary, "-c", "-q", "-f", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused {config}: {check.stderr.strip() or check.stdout.strip()}")
        self.proc = subprocess.Popen(
            [binary, "-db", "-f", str(config)],
            stdout=open(self.run_dir / f"haproxy-{self.port}.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(lambda: port_open(self.port), 10, "haproxy", self.proc)
        return self

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None


def add(admin: Admin, slot: int, replica: Replica, timeout_s: float = 30.0) -> None:
    """Points slot ``slot`` at ``replica`` and enables it; returns once HAProxy's check finds it UP."""
    name = slot_name(slot)
    servers = admin.servers()
    if name not in servers:
        raise BalancerError(f"the balancer has no slot {name} (it holds {len(servers)})")
    if servers[name]["status"] != "MAINT":
        raise BalancerError(f"slot {name} is in use ({servers[name]['status']})")
    admin.set(f"set server replicas/{name} addr 127.0.0.1 port {replica.grpc_port}")
    admin.set(f"set server replicas/{name} check-port {replica.http_port}")
    admin.set(f"enable server replicas/{name}")
    deadline = time.monotonic() + timeout_s
    while (status := admin.servers()[name]["status"]) != "UP":
        if time.monotonic() > deadline:
            admin.set(f"disable server replicas/{name}")  # the slot free again
            raise BalancerError(f"{name} (gRPC :{replica.grpc_port}) not UP after {timeout_s:.0f} s: {status}")
        time.sleep(0.2)


def remove(
    admin: Admin,
    slots: list[int],
    idle: Callable[[int], bool] | None = None,
    settle_s: float = STREAM_MAX_AGE_S + 1,
    timeout_s: float = 60.0,
) -> dict[int, bool]:
    """Drains ``slots`` together and disables each once done: HAProxy routes no new stream to
    them (sessions hashed to them move to the others). A slot is done when it holds no stream,
    or once ``settle_s`` have passed (the SDK's pooled streams on it have aged out: no chat starts
    on them any more) and ``idle(slot)`` (its replica has no chat in flight) has held for a
    second; its idle streams are then shut, which their clients retry elsewhere. Per slot: True
    when done, False when ``timeout_s`` ran out first (what was open is cut)."""
    for slot in slots:
        admin.set(f"set server replicas/{slot_name(slot)} state drain")
    start = time.monotonic()
    idle_since: dict[int, float] = {}
    done: dict[int, bool] = {}
    while len(done) < len(slots):
        now, servers = time.monotonic(), admin.servers()
        for slot in slots:
            if slot in done:
                continue
            if idle is not None and now - start >= settle_s and idle(slot):
                idle_since.setdefault(slot, now)
            else:
                idle_since.pop(slot, None)
            empty = not int(servers[slot_name(slot)]["scur"] or 0)
            if empty or now - idle_since.get(slot, now) >= 1.0 or now - start > timeout_s:
                done[slot] = empty or slot in idle_since
                admin.set(f"shutdown sessions server replicas/{slot_name(slot)}")
                admin.set(f"disable server replicas/{slot_name(slot)}")
        time.sleep(0.2)
    return done

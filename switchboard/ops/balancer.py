"""HAProxy (Debian's) in front of several Switchboard replicas: one gRPC address for clients.

gRPC is HTTP/2 end to end (``proto h2`` on both sides). Session affinity: the SDK sends a
digest of a chat's session id as the ``x-session-id`` header and HAProxy picks the replica by a consistent
hash of it, so a session's turns land where its KV blocks are local; chats without a session id
go round robin. Each replica is health-checked on its HTTP port (``/v2/health/ready``) every
half second: a replica that dies is out within about a second, its sessions move to the others
(whose Redis tier has their blocks), and connections that cannot reach a replica are
re-dispatched to another. A chat already streaming from a replica that dies is lost with it;
the SDK retries a chat that had received nothing yet.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from switchboard.ops.process import port_open, stop_process, wait_until
from switchboard.wire import SESSION_HEADER


@dataclass(frozen=True)
class Replica:
    name: str
    grpc_port: int
    http_port: int
    metrics_port: int | None = None


def haproxy_config(port: int, replicas: list[Replica], stats_port: int | None = None, host: str = "127.0.0.1") -> str:
    servers = "\n".join(
        f"    server {r.name} 127.0.0.1:{r.grpc_port} proto h2 check port {r.http_port} check-proto h1"
        for r in replicas
    )
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
    maxconn 4096
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


class Balancer:
    """A haproxy process in front of ``replicas``, listening on ``port``."""

    def __init__(self, port: int, replicas: list[Replica], run_dir: Path, stats_port: int | None = None):
        self.port, self.replicas, self.run_dir, self.stats_port = port, replicas, run_dir, stats_port
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Balancer":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = self.run_dir / f"haproxy-{self.port}.cfg"
        config.write_text(haproxy_config(self.port, self.replicas, self.stats_port))
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

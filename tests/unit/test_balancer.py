"""The HAProxy configuration for replicas: what it says, and that haproxy itself accepts it."""

from __future__ import annotations

import subprocess

from switchboard.ops.balancer import Replica, haproxy_binary, haproxy_config
from switchboard.wire import SESSION_HEADER

REPLICAS = [Replica("replica-0", 8101, 8100), Replica("replica-1", 8111, 8110)]


def test_sessions_are_hashed_consistently_and_replicas_checked_on_their_http_port():
    cfg = haproxy_config(8001, REPLICAS, stats_port=8000)
    assert f"balance hdr({SESSION_HEADER})" in cfg and "hash-type consistent" in cfg
    assert "bind 127.0.0.1:8001 proto h2" in cfg
    assert "server replica-1 127.0.0.1:8111 proto h2 check port 8110 check-proto h1" in cfg
    assert "option httpchk GET /v2/health/ready" in cfg and "option redispatch" in cfg
    assert "bind 127.0.0.1:8000" in cfg and "stats enable" in cfg


def test_haproxy_accepts_the_configuration(tmp_path):
    path = tmp_path / "haproxy.cfg"
    path.write_text(haproxy_config(8001, REPLICAS, stats_port=8000))
    check = subprocess.run([haproxy_binary(), "-c", "-f", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr

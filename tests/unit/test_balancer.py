"""The HAProxy configuration for replicas: what it says, and that haproxy itself accepts it."""

from __future__ import annotations

import http.server
import subprocess
import threading
import time

import pytest

from switchboard.ops.balancer import (
    SLOTS,
    Balancer,
    BalancerError,
    Replica,
    add,
    haproxy_binary,
    haproxy_config,
    remove,
)
from switchboard.ops.launch import free_ports
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


def test_free_slots_are_disabled_servers_and_too_many_replicas_are_refused(tmp_path):
    cfg = haproxy_config(8001, REPLICAS, admin_socket=tmp_path / "a.sock", slots=4)
    assert f"stats socket {tmp_path / 'a.sock'} mode 600 level admin" in cfg
    assert "server replica-2 127.0.0.1:1 proto h2 check port 1 check-proto h1 disabled" in cfg
    assert "server replica-3 " in cfg and "server replica-4 " not in cfg
    with pytest.raises(ValueError, match="3 replicas, but the balancer holds 2"):
        haproxy_config(8001, [*REPLICAS, Replica("x", 1, 2)], slots=2)


class _Ready(http.server.BaseHTTPRequestHandler):
    """A replica's readiness endpoint, as HAProxy's check asks it."""

    def do_GET(self):
        self.send_response(200 if self.path == "/v2/health/ready" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def balancer(tmp_path):
    """Debian's HAProxy with one replica whose readiness endpoint answers; slots for more."""
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ready) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    ports = [s.server_address[1] for s in servers]
    b = Balancer(free_ports(1)[0], [Replica("replica-0", free_ports(1)[0], ports[0])], tmp_path).start()
    yield b, ports
    b.stop()
    for s in servers:
        s.shutdown()


def _status(b, name, want, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while (status := b.admin.servers()[name]["status"]) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return status


def test_a_replica_is_added_to_a_running_balancer_and_drained_out_of_it(balancer):
    b, ports = balancer
    servers = b.admin.servers()
    assert len(servers) == SLOTS and servers["replica-1"]["status"] == "MAINT"
    assert _status(b, "replica-0", "UP") == "UP"
    add(b.admin, 1, Replica("replica-1", free_ports(1)[0], ports[1]))
    assert b.admin.servers()["replica-1"]["status"] == "UP", "add returns once the check finds it ready"
    with pytest.raises(BalancerError, match="slot replica-1 is in use"):
        add(b.admin, 1, Replica("again", 1, ports[1]))
    assert remove(b.admin, [1], timeout_s=5) == {1: True}, "no stream open: drained at once"
    assert b.admin.servers()["replica-1"]["status"] == "MAINT"
    add(b.admin, 1, Replica("replica-1", free_ports(1)[0], ports[1]))  # the slot is free again
    with pytest.raises(BalancerError, match=f"no slot replica-{SLOTS}"):
        add(b.admin, SLOTS, Replica("one too many", 1, ports[1]))


def test_a_replica_that_never_gets_ready_is_not_taken(balancer):
    b, _ = balancer
    with pytest.raises(BalancerError, match="replica-2 .* not UP after 1 s"):
        add(b.admin, 2, Replica("replica-2", free_ports(1)[0], free_ports(1)[0]), timeout_s=1)
    assert b.admin.servers()["replica-2"]["status"] == "MAINT", "its slot is left free"

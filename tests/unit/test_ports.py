"""Free ports for a test stack: four distinct ones, even from a kernel that hands a released port
straight back out (CI once started Triton's HTTP endpoint on the port it had given Redis)."""

import socket

from switchboard.ops import launch


class _ReusingSocket:
    """bind(port 0) takes the lowest port no open socket holds, as a kernel may."""

    held: set[int] = set()

    def __init__(self):
        self.port = None

    def bind(self, address):
        self.port = next(p for p in range(40000, 41000) if p not in self.held)
        self.held.add(self.port)

    def getsockname(self):
        return ("127.0.0.1", self.port)

    def close(self):
        self.held.discard(self.port)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def test_ports_are_distinct_when_the_kernel_reuses_a_released_port(monkeypatch):
    monkeypatch.setattr(launch.socket, "socket", _ReusingSocket)
    ports = launch.Ports.free()
    assert len({ports.http, ports.grpc, ports.metrics, ports.redis}) == 4


def test_free_ports_are_bindable():
    for port in launch.free_ports(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))

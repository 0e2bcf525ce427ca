"""After a server restart the SDK's clients reach the new server within about a second, and a
private connection (the supervisor's probe) at once, whatever this process's other channels
went through while it was down. Against a gRPC server in this process that answers readiness
(the real tritonserver restart is covered by test_supervised_stack)."""

from __future__ import annotations

import socket
import time
from concurrent import futures

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from switchboard.client import ChatClient
from switchboard.wire import channel_args


class Ready(service_pb2_grpc.GRPCInferenceServiceServicer):
    def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=True)


def ready_now(channel) -> bool:
    try:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerReady(service_pb2.ServerReadyRequest(), timeout=0.5)
        return True
    except grpc.RpcError:
        return False


def test_clients_reach_a_server_that_came_back_within_a_second():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"127.0.0.1:{s.getsockname()[1]}"
    old = grpc.insecure_channel(url, options=channel_args())  # the load this process sent meanwhile
    t0 = time.monotonic()
    while time.monotonic() - t0 < 6:
        assert not ready_now(old)
        time.sleep(0.2)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Ready(), server)
    server.add_insecure_port(url)
    server.start()
    try:
        back = time.monotonic()
        assert ChatClient(url, private_connection=True).ready(), "a probe sees the server at once"
        shared = ChatClient(url)
        while not shared.ready():
            assert time.monotonic() - back < 1.8, "the reconnect backoff is capped at 1 s (gRPC would wait 2-4 s now)"
            time.sleep(0.05)
    finally:
        old.close()
        server.stop(0)

import time
from concurrent import futures

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from switchboard.codec import build_request
from switchboard.serving.engine_client import EngineClient, EngineStream, EngineStreamError, parse_response


def _echo(request: service_pb2.ModelInferRequest) -> service_pb2.ModelStreamInferResponse:
    """What the server would stream back if each input came back as an output of that name."""
    message = service_pb2.ModelStreamInferResponse()
    for tensor, raw in zip(request.inputs, request.raw_input_contents):
        message.infer_response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        message.infer_response.raw_output_contents.append(raw)
    return message


def test_an_error_response_raises():
    message = service_pb2.ModelStreamInferResponse(error_message="Request timeout expired")
    with pytest.raises(EngineStreamError, match="timeout expired"):
        parse_response(message)


class _BrokenCall:
    """A stream that yields one response, then breaks the way grpc reports it."""

    def __init__(self, first):
        self.first, self.cancelled = first, False

    def __iter__(self):
        yield self.first
        error = grpc.RpcError()
        error.code = lambda: grpc.StatusCode.UNAVAILABLE
        error.details = lambda: "Socket closed"
        raise error

    def cancel(self):
        self.cancelled = True


def test_a_broken_stream_raises_after_what_arrived():
    first = _echo(build_request("m", {"token_ids": np.asarray([[1, 2]], np.int32)}, []))
    call = _BrokenCall(first)
    stream = EngineStream(call)
    it = iter(stream)
    assert next(it)["token_ids"].tolist() == [[1, 2]]
    with pytest.raises(EngineStreamError, match="UNAVAILABLE: Socket closed"):
        next(it)
    stream.cancel()
    assert call.cancelled


class _Pong(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers each request with one response, as a pool answers a ping; records each stream
    that ended because the client half-closed it (not cancelled it)."""

    def __init__(self, answer: bool = True):
        self.answer, self.ended = answer, []

    def ModelStreamInfer(self, requests, context):
        for _ in requests:
            if self.answer:
                yield service_pb2.ModelStreamInferResponse(infer_response=service_pb2.ModelInferResponse())
            else:
                yield service_pb2.ModelStreamInferResponse(error_message="Stub process 'x' is not healthy.")
            time.sleep(0.2)  # the stream's end comes after the answer: a client that cancels has by then
        self.ended.append(True)


def _serve(servicer):
    server = grpc.server(futures.ThreadPoolExecutor(2))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_a_ping_reads_its_stream_to_the_end_instead_of_cancelling_it():
    pong = _Pong()
    server, url = _serve(pong)
    client = EngineClient(url)
    try:
        assert client.ping("engine_short", 5) is True
        assert client.ping("engine_short", 5) is True
    finally:
        client.close()
        server.stop(None)
    assert pong.ended == [True, True]  # the server ended both streams after the answer


def test_a_ping_to_a_dead_stub_is_false():
    server, url = _serve(_Pong(answer=False))
    client = EngineClient(url)
    try:
        assert client.ping("engine_short", 5) is False
    finally:
        client.close()
        server.stop(None)

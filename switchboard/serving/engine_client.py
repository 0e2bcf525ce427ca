"""How ``chat`` reaches its pools: one gRPC stream per generation, to the server chat runs in.

Why not BLS: in Triton 2.51's Python backend a thread that iterates a decoupled BLS stream
wakes holding the iterator's mutex and then takes the GIL, the stub's receive thread holds the
iterator map's mutex while it waits for that iterator's mutex, and ``exec(decoupled=True)``
takes the map's mutex while holding the GIL. With many streams read at once that cycle closes:
under `make soak` it froze the chat stub (docs/architecture.md; docs/reliability.md).

A gRPC stream has none of those locks, reaches the pool through Triton's own queue (request
priority and timeout apply as for any client), and ``cancel()`` cancels the pool's request,
which BLS in 2.51 cannot. Imports no Triton module: unit-tested on its own. The messages are
switchboard.codec's, which the SDK speaks too.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from switchboard.codec import build_request, decode_response
from switchboard.wire import Pool, channel_args


class EngineStreamError(RuntimeError):
    """The pool answered with an error, or the stream broke."""


def parse_response(message: service_pb2.ModelStreamInferResponse) -> dict[str, np.ndarray]:
    """The outputs of one streamed response, by name; raises ``EngineStreamError`` for an error."""
    if message.error_message:
        raise EngineStreamError(message.error_message)
    return decode_response(message.infer_response)


@dataclass
class EngineStream:
    """The responses of one generation; ``cancel()`` ends it and cancels the pool's request."""

    call: grpc.Future

    def __iter__(self):
        try:
            for message in self.call:
                yield parse_response(message)
        except grpc.RpcError as e:  # also after cancel(): whoever cancelled is no longer reading
            raise EngineStreamError(f"{e.code().name}: {e.details()}") from None

    def cancel(self) -> None:
        self.call.cancel()


class EngineClient:
    """One channel to the server, shared by every chat; each generation is its own stream."""

    def __init__(self, url: str):
        self._channel = grpc.insecure_channel(url, options=channel_args())
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def stream(self, request: service_pb2.ModelInferRequest, timeout_s: float | None = None) -> EngineStream:
        """``timeout_s``: the whole stream's deadline (None: none)."""
        # One request, then the client half-closes: Triton ends the stream after its last response.
        # No `triton_grpc_error` header: errors come as responses (the header can crash 2.51, docs/reliability.md).
        return EngineStream(self._stub.ModelStreamInfer(iter((request,)), timeout=timeout_s))

    def ping(self, model: str, timeout_s: float, version: int = 0) -> bool | None:
        """Whether ``model``'s stub process is alive: True when it answered a ping, False when
        Triton says the stub is dead, None when neither came within ``timeout_s`` (a stub busy
        with backpressure answers late; Triton can leave a request sent as its stub died
        unanswered)."""
        request = build_request(
            model,
            {Pool.INPUT_IDS: np.zeros((1, 1), np.int32)},
            [Pool.STATS],
            {Pool.PING: True},
            priority=1,
            version=version,
        )
        call = self._stub.ModelStreamInfer(iter((request,)), timeout=timeout_s)
        answered = None
        try:
            # Read to the stream's end, which Triton sends after the answer: a stream cancelled as
            # its answer goes out can leave Triton 2.51 holding the model (docs/voice.md).
            for message in call:
                parse_response(message)
                answered = True
        except EngineStreamError as e:
            return False if stub_dead(str(e)) else None
        except grpc.RpcError:
            return answered
        finally:
            call.cancel()  # nothing left to cancel once it ended
        return answered

    def close(self) -> None:
        self._channel.close()


def stub_dead(message: str) -> bool:
    """Triton 2.51's error for a request to a model whose Python-backend stub died."""
    return "Stub process" in message and "not healthy" in message

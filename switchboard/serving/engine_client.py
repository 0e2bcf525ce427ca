"""How ``chat`` reaches its pools: one gRPC stream per generation, to the server chat runs in.

Why not BLS: in Triton 2.51's Python backend a thread that iterates a decoupled BLS stream
wakes holding the iterator's mutex and then takes the GIL, the stub's receive thread holds the
iterator map's mutex while it waits for that iterator's mutex, and ``exec(decoupled=True)``
takes the map's mutex while holding the GIL. With many streams read at once that cycle closes:
under `make soak` it froze the chat stub (docs/architecture.md; docs/reliability.md).

A gRPC stream has none of those locks, reaches the pool through Triton's own queue (request
priority and timeout apply as for any client), and ``cancel()`` cancels the pool's request,
which BLS in 2.51 cannot. Imports no Triton module: unit-tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

from switchboard.wire import Pool, channel_args

# Keys Triton's gRPC frontend reads itself rather than passing to the model.
RESERVED = frozenset(
    {
        "priority",
        "timeout",
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "binary_data_output",
        "triton_enable_empty_final_response",
    }
)


class EngineStreamError(RuntimeError):
    """The pool answered with an error, or the stream broke."""


def build_request(
    model: str,
    inputs: dict[str, np.ndarray],
    outputs: list[str],
    parameters: dict | None = None,
    priority: int = 0,
    timeout_us: int = 0,
    version: int = 0,
) -> service_pb2.ModelInferRequest:
    """A request to ``model`` (``version``: that version; 0: the one Triton's policy picks)."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=str(version) if version else "")
    for name, value in (parameters or {}).items():
        if name in RESERVED:
            raise ValueError(f"parameter {name!r} is read by Triton itself; pass it as an argument")
        param = request.parameters[name]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        elif isinstance(value, str):
            param.string_param = value
        else:
            raise TypeError(f"parameter {name!r}: {type(value).__name__} is not bool, int, float or str")
    if priority:
        request.parameters["priority"].uint64_param = priority
    if timeout_us:
        request.parameters["timeout"].int64_param = timeout_us
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype=np_to_triton_dtype(array.dtype), shape=array.shape)
        if array.dtype == np.object_:
            request.raw_input_contents.append(serialize_byte_tensor(array).item())
        else:
            request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    for name in outputs:
        request.outputs.add(name=name)
    return request


def parse_response(message: service_pb2.ModelStreamInferResponse) -> dict[str, np.ndarray]:
    """The outputs of one streamed response, by name; raises ``EngineStreamError`` for an error."""
    if message.error_message:
        raise EngineStreamError(message.error_message)
    response = message.infer_response
    out = {}
    for meta, raw in zip(response.outputs, response.raw_output_contents):
        shape = tuple(meta.shape)
        if meta.datatype == "BYTES":
            out[meta.name] = deserialize_bytes_tensor(raw).reshape(shape)
        else:
            out[meta.name] = np.frombuffer(raw, dtype=triton_to_np_dtype(meta.datatype)).reshape(shape)
    return out


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

"""Triton's gRPC messages to and from numpy: the one encoder of a ``ModelInferRequest`` and the
one decoder of a response's tensors, for every client of the server (the SDK's transports and
``chat``'s own streams to its pools, ``switchboard.serving.engine_client``).

Imports the protobufs and tensor helpers of ``tritonclient`` (the SDK's dependency) and no
Triton server module, so it runs in a client install and inside a model alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

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


def build_request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Iterable[str],
    parameters: Mapping | None = None,
    priority: int = 0,
    timeout_us: int = 0,
    version: int = 0,
    request_id: str = "",
) -> service_pb2.ModelInferRequest:
    """A request to ``model`` (``version``: that version; 0: the one Triton's policy picks), each
    input in ``raw_input_contents`` (BYTES elements: 4 bytes of length, little-endian, then the
    bytes). ``priority`` and ``timeout_us`` are Triton's queue order and timeout (0: the model's
    default), not model parameters."""
    request = service_pb2.ModelInferRequest(
        model_name=model, model_version=str(version) if version else "", id=request_id
    )
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


def _elements(raw: bytes) -> list[bytes]:
    """The elements of a BYTES tensor's raw contents (each: 4 bytes of length, then the bytes)."""
    out, i = [], 0
    while i < len(raw):
        size = int.from_bytes(raw[i : i + 4], "little")
        out.append(raw[i + 4 : i + 4 + size])
        i += 4 + size
    return out


def decode_response(response: service_pb2.ModelInferResponse) -> dict[str, np.ndarray]:
    """The output tensors of one response, by name (BYTES: an object array of ``bytes``)."""
    out = {}
    for meta, raw in zip(response.outputs, response.raw_output_contents):
        shape = tuple(meta.shape)
        if meta.datatype == "BYTES":
            elements = _elements(raw)
            array = np.empty(len(elements), dtype=np.object_)
            array[:] = elements  # not np.array(elements): that would make a 2-D array of bytes
            out[meta.name] = array.reshape(shape)
        else:
            out[meta.name] = np.frombuffer(raw, dtype=triton_to_np_dtype(meta.datatype)).reshape(shape)
    return out


def first_elements(response: service_pb2.ModelInferResponse) -> dict:
    """Each output's first element, by name (BYTES: ``bytes``, b"" when empty; else a numpy
    scalar): what a client of ``[1, 1]`` outputs reads, without building arrays. The SDK reads
    every response of a stream this way (a few microseconds each, on the gateway's hot path)."""
    out = {}
    for meta, raw in zip(response.outputs, response.raw_output_contents):
        if meta.datatype == "BYTES":
            out[meta.name] = raw[4 : 4 + int.from_bytes(raw[:4], "little")]
        else:
            out[meta.name] = np.frombuffer(raw, dtype=triton_to_np_dtype(meta.datatype), count=1)[0]
    return out

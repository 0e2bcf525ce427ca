"""Triton's gRPC messages to and from numpy (switchboard.codec), as every client of the server
sends them."""

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from switchboard.codec import build_request, decode_response, first_elements


def _echo(request: service_pb2.ModelInferRequest) -> service_pb2.ModelStreamInferResponse:
    """What the server would stream back if each input came back as an output of that name."""
    message = service_pb2.ModelStreamInferResponse()
    for tensor, raw in zip(request.inputs, request.raw_input_contents):
        message.infer_response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        message.infer_response.raw_output_contents.append(raw)
    return message


def test_tensors_survive_the_round_trip():
    kv = np.arange(2 * 3 * 2 * 4 * 5, dtype=np.float32).reshape(1, 2, 3, 2, 4, 5)
    inputs = {
        "input_ids": np.asarray([[5, 7, 11]], np.int32),
        "past_kv": kv,
        "stats": np.asarray([['{"reason": "stop"}'.encode()]], np.object_),
    }
    request = build_request("engine_short", inputs, ["token_ids", "kv", "stats"])
    assert request.model_name == "engine_short"
    assert [o.name for o in request.outputs] == ["token_ids", "kv", "stats"]
    out = decode_response(_echo(request).infer_response)
    assert out["input_ids"].dtype == np.int32 and out["input_ids"].tolist() == [[5, 7, 11]]
    assert out["past_kv"].shape == kv.shape and np.array_equal(out["past_kv"], kv)
    assert out["stats"].reshape(-1)[0] == b'{"reason": "stop"}'


def test_parameters_priority_and_timeout():
    request = build_request(
        "engine_long",
        {},
        [],
        {"chat_priority": 1, "return_kv": True, "fingerprint": "ab", "top": 0.5},
        priority=1,
        timeout_us=10_000_000,
    )
    p = request.parameters
    assert p["chat_priority"].int64_param == 1 and p["return_kv"].bool_param is True
    assert p["fingerprint"].string_param == "ab" and p["top"].double_param == 0.5
    # Triton's own queue reads these two.
    assert p["priority"].uint64_param == 1 and p["timeout"].int64_param == 10_000_000
    assert "priority" not in build_request("m", {}, []).parameters


@pytest.mark.parametrize("name", ["priority", "timeout", "sequence_id"])
def test_keys_triton_reads_itself_are_refused_as_model_parameters(name):
    with pytest.raises(ValueError, match=name):
        build_request("m", {}, [], {name: 1})


def test_unsupported_parameter_type():
    with pytest.raises(TypeError, match="seed"):
        build_request("m", {}, [], {"seed": [1]})


def test_the_request_id_and_version_are_set_when_given():
    request = build_request("asr", {}, [], version=3, request_id="42-7")
    assert (request.id, request.model_version) == ("42-7", "3")
    assert (build_request("asr", {}, []).id, build_request("asr", {}, []).model_version) == ("", "")


def test_bytes_tensors_of_any_length_and_first_elements():
    words = np.asarray([[b"", "订单".encode(), b"x" * 300]], np.object_)
    request = build_request("m", {"text": words, "ids": np.asarray([[7, 8]], np.int32)}, [])
    response = _echo(request).infer_response
    out = decode_response(response)
    assert out["text"].shape == (1, 3) and out["text"].tolist() == words.tolist()
    assert first_elements(response) == {"text": b"", "ids": 7}
    empty = service_pb2.ModelInferResponse()
    empty.outputs.add(name="text", datatype="BYTES", shape=(1, 0))
    empty.raw_output_contents.append(b"")
    assert first_elements(empty) == {"text": b""} and decode_response(empty)["text"].shape == (1, 0)

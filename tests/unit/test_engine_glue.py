"""A pool's Triton glue with a stubbed ``triton_python_backend_utils`` and a scripted decoder:
requests in, token responses and a final response with stats out, every error final."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest

from switchboard.engine.scheduler import Engine
from switchboard.wire import EngineStats, FinishReason
from tests.unit.pb_stub import FINAL, Tensor, forget, stub_glue
from tests.unit.test_scheduler import ScriptedDecoder


@pytest.fixture
def glue(monkeypatch):
    yield stub_glue(monkeypatch, "switchboard.triton.engine_model")
    forget("switchboard.triton.engine_model")


class Sender:
    def __init__(self):
        self.sent = []

    def send(self, response, flags=0):
        self.sent.append((response, flags))

    def finished(self):
        return any(flags == FINAL for _, flags in self.sent)


class Request:
    def __init__(self, inputs: dict, parameters: dict):
        self.inputs = {k: Tensor(k, np.asarray(v)) for k, v in inputs.items()}
        self.params, self.sender = json.dumps(parameters), Sender()

    def get_response_sender(self):
        return self.sender

    def parameters(self):
        return self.params

    def is_cancelled(self):
        return False


@pytest.fixture
def pool(glue):
    model = glue.TritonPythonModel()
    model.name, model.fingerprint = "engine_short", "fp-1"
    model.manifest = SimpleNamespace(vocab_size=64)
    model.engine = Engine(ScriptedDecoder(), max_batch=4, max_waiting=8, stop_ids={63})
    model.stream_interval_s = 0.0
    model.watch = glue._CancelWatch("engine_short", 0.01)
    model.sender = glue._Sender("engine_short", model.watch)
    model.engine.start()
    yield model
    model.engine.stop()
    model.sender.close()
    model.watch.close()


def _wait(*senders):
    deadline = time.monotonic() + 10
    while not all(s.finished() for s in senders):
        assert time.monotonic() < deadline
        time.sleep(0.005)


def _error(sender):
    [(response, flags)] = sender.sent
    assert flags == FINAL and response.error is not None
    return response.error


def test_a_generation_streams_its_tokens_then_the_kv_and_stats(pool):
    past = np.zeros((1, 2, 2, 1, 2, 2), np.float32)  # [1, layers, 2, heads, reused, dim]
    request = Request(
        {"input_ids": [[1, 2, 3, 10]], "past_kv": past, "max_new_tokens": [[3]]},
        {"chat_priority": 1, "fingerprint": "fp-1", "return_kv": True},
    )
    pool.execute([request])
    _wait(request.sender)
    *streamed, (final, flags) = request.sender.sent
    tokens = [t for r, _ in streamed for t in r.outputs["token_ids"].reshape(-1)]
    tokens += final.outputs.get("token_ids", np.zeros((1, 0))).reshape(-1).tolist()
    assert tokens == [11, 12, 13] and flags == FINAL
    stats = EngineStats.from_json(final.outputs["stats"][0][0])
    assert stats.reason is FinishReason.LENGTH and stats.generated == 3 and stats.batch_size == 1
    assert final.outputs["kv"].shape == (1, 2, 2, 1, 6, 2), "prompt + generated but the last"


@pytest.mark.parametrize(
    "inputs,parameters,message",
    [
        ({}, {}, "input_ids is required"),
        ({"input_ids": [[1, 99]]}, {}, "token id out of range"),
        ({"input_ids": [[1, 2]], "past_kv": np.zeros((1, 2, 2, 1, 1, 2))}, {"fingerprint": "other"}, "another model"),
        ({"input_ids": [[1, 2]], "past_kv": np.zeros((1, 2, 2, 1, 2, 2))}, {"fingerprint": "fp-1"}, "reused=2"),
    ],
)
def test_bad_requests_are_invalid_arg_naming_what_is_wrong(pool, inputs, parameters, message):
    request = Request(inputs, parameters)
    pool.execute([request])
    error = _error(request.sender)
    assert error.code == "INVALID_ARG" and message in error.message and error.message.startswith("[INVALID_ARG]")


def test_a_ping_is_answered_before_the_engine(pool):
    request = Request({}, {"ping": True})
    pool.execute([request])
    [(response, flags)] = request.sender.sent
    assert flags == FINAL and json.loads(response.outputs["stats"][0][0]) == {"ping": True}

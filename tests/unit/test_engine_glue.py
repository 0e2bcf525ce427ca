"""A pool's Triton glue with a stubbed ``triton_python_backend_utils`` and a scripted decoder:
requests in, token responses and a final response with stats out, every error final."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest

from switchboard.engine.scheduler import Engine
from switchboard.kv.blocks import BlockFormat, model_root
from switchboard.kv.local import LocalBlocks
from switchboard.kv.tiers import BlockCache
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
    fmt = BlockFormat(layers=2, kv_heads=1, head_dim=2, tokens=2)
    model.blocks = BlockCache(fmt, model_root("fp-1", "", 2, "native"), LocalBlocks(1 << 20))
    model.stream_interval_s = 0.0
    model.watch = glue.CancelWatch("engine_short", 0.01)
    model.sender = glue.ResponseSender("engine_short", model.watch)
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


def _generate(pool, prompt, parameters):
    request = Request({"input_ids": [prompt], "max_new_tokens": [[3]]}, parameters)
    pool.execute([request])
    _wait(request.sender)
    *streamed, (final, flags) = request.sender.sent
    tokens = [t for r, _ in streamed for t in r.outputs["token_ids"].reshape(-1)]
    tokens += final.outputs.get("token_ids", np.zeros((1, 0))).reshape(-1).tolist()
    assert flags == FINAL and set(final.outputs) <= {"token_ids", "stats"}  # no KV leaves the pool
    return tokens, EngineStats.from_json(final.outputs["stats"][0][0])


def test_a_generation_streams_its_tokens_then_its_stats(pool):
    tokens, stats = _generate(pool, [1, 2, 3, 10], {"chat_priority": 1})
    assert tokens == [11, 12, 13]
    assert stats.reason is FinishReason.LENGTH and stats.generated == 3 and stats.batch_size == 1
    assert stats.reused == 0 and pool.blocks.snapshot().get("lookups", 0) == 0  # not asked to reuse


def test_the_next_turn_reuses_the_blocks_the_first_stored(pool):
    reuse = {"fingerprint": "fp-1", "kv_reuse": True}
    tokens, stats = _generate(pool, [1, 2, 3, 10], reuse)
    assert tokens == [11, 12, 13] and stats.reused == 0
    assert pool.blocks.flush()
    # prompt + generated but the last (6 tokens) = 3 blocks of 2; the next prompt extends them
    tokens, stats = _generate(pool, [1, 2, 3, 10, 11, 12, 13, 20], {**reuse, "expected_reuse": 6})
    assert tokens == [21, 22, 23]
    assert stats.reused == 6 and stats.kv_local_blocks == 3 and stats.cache_miss is None
    _, stats = _generate(pool, [1, 2, 3, 10, 11, 12, 13, 20], {"fingerprint": "fp-other", "kv_reuse": True})
    assert stats.reused == 0  # a prompt built for another model variant reuses nothing


def test_a_shortfall_against_what_the_session_stored_has_a_reason(pool):
    _, stats = _generate(pool, [5, 6, 7, 8, 9], {"fingerprint": "fp-1", "kv_reuse": True, "expected_reuse": 4})
    assert stats.reused == 0 and stats.cache_miss == "evicted"


@pytest.mark.parametrize(
    "inputs,parameters,message",
    [
        ({}, {}, "input_ids is required"),
        ({"input_ids": [[1, 99]]}, {}, "token id out of range"),
        ({"input_ids": [[]]}, {}, "empty prompt"),
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

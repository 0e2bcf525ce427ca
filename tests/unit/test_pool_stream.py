"""A generation's stream from a pool: deadlines, merged responses, cancellation, a dead pool."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from switchboard.serving.pool_health import PoolHealth
from switchboard.serving.pool_stream import EngineError, EngineTimeout, Generation, PoolStreams
from switchboard.wire import CacheMiss, EngineStats, FinishReason


class Stream:
    """Yields the scripted responses; waits on ``release`` where the script says ``"wait"``."""

    def __init__(self, script):
        self.script, self.cancelled, self.release = script, False, threading.Event()

    def __iter__(self):
        for item in self.script:
            if item == "wait":
                self.release.wait(5)
                continue
            if isinstance(item, Exception):
                raise item
            yield item

    def cancel(self):
        self.cancelled = True
        self.release.set()


class Engines:
    def __init__(self, stream):
        self.stream_, self.requests = stream, []

    def stream(self, request):
        self.requests.append(request)
        return self.stream_


def _tokens(*ids):
    return {"token_ids": np.asarray([list(ids)], np.int32)}


GEN = Generation([1, 2, 3], 8, 0.0, 1.0, priority=1, seed=7, kv_reuse=True, expected_reuse=2)


def _streams(stream, first_token_s=2.0, stall_s=2.0, health=None):
    return PoolStreams(Engines(stream), health or PoolHealth(), "fp-1", first_token_s, stall_s)


def test_the_request_carries_priority_fingerprint_seed_reuse_and_the_first_token_deadline():
    streams = _streams(Stream([_tokens(5)]))
    assert list(streams.generate("engine_short", GEN)) == [{"token_ids": [5]}]
    [request] = streams.engines.requests
    params = request.parameters
    assert request.model_name == "engine_short" and params["priority"].uint64_param == 1
    assert params["chat_priority"].int64_param == 1 and params["fingerprint"].string_param == "fp-1"
    assert params["seed"].int64_param == 7 and params["kv_reuse"].bool_param is True
    assert params["expected_reuse"].int64_param == 2 and [i.name for i in request.inputs] == [
        "input_ids",
        "max_new_tokens",
        "temperature",
        "top_p",
    ]
    assert params["timeout"].int64_param == 2_000_000


def test_responses_are_parsed_into_tokens_and_stats():
    stats = {"reason": "stop", "batch_size": 2, "reused": 16, "cache_miss": "evicted", "new_in_a_later_version": 1}
    final = {"stats": np.asarray([json.dumps(stats).encode()], np.object_), **_tokens(9)}
    out = list(_streams(Stream([_tokens(5, 6), final])).generate("engine_short", GEN))
    tokens = [t for o in out for t in o.get("token_ids", [])]
    assert tokens == [5, 6, 9] and out[-1]["stats"] == EngineStats(
        FinishReason.STOP, batch_size=2, reused=16, cache_miss=CacheMiss.EVICTED
    )


def test_no_first_response_in_time_is_a_timeout_and_cancels_the_pools_request():
    stream = Stream(["wait", _tokens(5)])
    with pytest.raises(EngineTimeout, match="no first response within 0.2 s"):
        list(_streams(stream, first_token_s=0.2).generate("engine_short", GEN))
    assert stream.cancelled


def test_a_stalled_stream_is_a_timeout():
    stream = Stream([_tokens(5), "wait", _tokens(6)])
    got = []
    with pytest.raises(EngineTimeout, match="stream stalled within 0.2 s"):
        for response in _streams(stream, stall_s=0.2).generate("engine_short", GEN):
            got.append(response)
    assert got == [{"token_ids": [5]}] and stream.cancelled


def test_a_pool_error_names_the_pool_without_its_status_tag():
    stream = Stream([RuntimeError("[UNAVAILABLE] queue full")])
    with pytest.raises(EngineError, match=r"^engine_long: queue full$"):
        list(_streams(stream).generate("engine_long", GEN))


def test_a_pool_reported_dead_ends_its_streams_at_once():
    health = PoolHealth()
    stream = Stream([_tokens(5), "wait"])
    streams = _streams(stream, stall_s=30, health=health)
    it = streams.generate("engine_short", GEN)
    assert next(it) == {"token_ids": [5]}
    threading.Timer(0.1, health.failed, args=("engine_short",)).start()
    with pytest.raises(EngineError, match="stub process died"):
        next(it)
    assert stream.cancelled


def test_a_stream_that_ends_is_not_cancelled():
    stream = Stream([_tokens(5)])
    list(_streams(stream).generate("engine_short", GEN))
    assert not stream.cancelled

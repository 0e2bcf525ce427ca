"""A pool's metrics publisher against a stand-in for Triton's metric families: the engine's
counters go out as increments since the last copy, the gauges as they are."""

from __future__ import annotations

import pytest

from switchboard.engine.scheduler import STAT_KEYS, Engine, GenerationRequest
from switchboard.kv.blocks import BlockFormat, model_root
from switchboard.kv.local import LocalBlocks
from switchboard.kv.tiers import BlockCache
from tests.unit.pb_stub import forget, stub_glue
from tests.unit.test_scheduler import ScriptedDecoder, Sink, drain


class Family:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    made: dict[str, Family] = {}

    def __init__(self, name, description, kind):
        self.name, self.kind, self.series = name, kind, {}
        Family.made[name] = self

    def Metric(self, labels, **kwargs):  # noqa: N802 (pb_utils' name); buckets for a histogram
        metric = Metric()
        self.series[tuple(sorted(labels.items()))] = metric
        return metric


class Metric:
    def __init__(self):
        self.value = 0.0

    def increment(self, n):
        self.value += n

    def set(self, v):
        self.value = v

    def observe(self, v):
        self.value += 1


@pytest.fixture
def metrics(monkeypatch):
    module = stub_glue(monkeypatch, "switchboard.triton.engine_metrics")
    monkeypatch.setattr(module.pb_utils, "MetricFamily", Family, raising=False)
    Family.made = {}
    yield module
    forget("switchboard.triton.engine_metrics")


def value(name, **labels):
    [(key, metric)] = [(k, m) for k, m in Family.made[name].series.items() if set(labels.items()) <= set(k)]
    return metric.value


def test_every_engine_counter_is_published_as_what_it_grew_by(metrics):
    engine = Engine(ScriptedDecoder(), max_batch=4, max_waiting=8, stop_ids={63})
    publisher = metrics.EngineMetricsPublisher("engine_short", 2, engine, interval=3600)
    try:
        assert {f"switchboard_engine_{k}_total" for k in STAT_KEYS} <= set(Family.made)
        sinks = [Sink() for _ in range(3)]
        for s in sinks:
            engine.submit(GenerationRequest([1, 2, 10], 3), s)
        drain(engine, sinks)
        engine.submit(GenerationRequest([1, 2, 10], 3), Sink())  # waiting when published
        publisher.publish()
        publisher.publish()  # nothing new: nothing added
        assert value("switchboard_engine_decode_steps_total", model="engine_short", version="2") == 2
        assert value("switchboard_engine_finished_length_total") == 3
        assert value("switchboard_engine_batch_steps_total", batch_size="3") == 2
        assert (value("switchboard_engine_waiting"), value("switchboard_engine_running")) == (1, 0)
    finally:
        publisher.close()
    assert publisher._families == {}, "metrics and their families released at close"


def test_the_kv_block_caches_counters_are_published_with_their_labels(metrics):
    fmt = BlockFormat(layers=2, kv_heads=1, head_dim=2, tokens=2)
    blocks = BlockCache(fmt, model_root("fp-1", "", 2, "native"), LocalBlocks(1 << 20))
    engine = Engine(ScriptedDecoder(), max_batch=4, max_waiting=8, stop_ids={63})
    publisher = metrics.EngineMetricsPublisher("engine_short", 2, engine, blocks, interval=3600)
    try:
        blocks.lookup([1, 2, 3, 4, 5], 2, 4)
        publisher.publish()
        assert value("switchboard_kv_lookups_total") == 1
        assert value("switchboard_kv_misses_total", reason="evicted") == 1
        assert value("switchboard_kv_local_bytes") == 0
    finally:
        publisher.close()
        blocks.close()

"""``asr``'s metrics publisher against a stand-in for Triton's metric families, wired to a real
``AsrService`` as the glue wires it: the counters go out as what they grew by, and the pending
audio gauge reads the pool."""

from __future__ import annotations

import sys

import pytest

from switchboard.asr.batcher import make_batcher
from switchboard.asr.metrics import AsrMetrics
from switchboard.asr.service import AsrJob, AsrService
from tests.unit.pb_stub import forget, stub_glue
from tests.unit.test_asr_service import Held, Sink, speech, wait_pending
from tests.unit.test_engine_metrics import Family, value


@pytest.fixture
def publishing(monkeypatch):
    module = stub_glue(monkeypatch, "switchboard.triton.asr_metrics")
    monkeypatch.setattr(sys.modules["triton_python_backend_utils"], "MetricFamily", Family, raising=False)
    Family.made = {}
    yield module
    forget("switchboard.triton.asr_metrics")


def test_the_pending_gauge_reads_the_audio_the_pool_holds(publishing):
    held = Held()
    batcher = make_batcher("length", budget_s=60.0, max_batch=8, max_ratio=2.0, max_wait_s=0.02)
    service = AsrService(held, batcher)
    metrics = AsrMetrics()
    publisher = publishing.AsrMetricsPublisher(metrics, service, interval=3600)
    try:
        sink = Sink()
        service.submit(AsrJob(audio=speech(3.0), sink=sink))
        wait_pending(service)
        publisher.publish()
        assert value("switchboard_asr_pending_audio_seconds") == pytest.approx(service.pending_s)
        assert value("switchboard_asr_pending_audio_seconds") > 2.9
        held.gate.set()
        assert sink.finished.wait(10) and sink.failure is None
        metrics.transcribed(2, sink.result)
        publisher.publish()
        assert value("switchboard_asr_pending_audio_seconds") == 0.0
        assert value("switchboard_asr_requests_total", outcome="transcribed") == 1
    finally:
        held.gate.set()
        publisher.close()
        service.close()

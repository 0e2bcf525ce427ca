"""switchboard/common/tracing.py: W3C context in and out, sampling, the bounded export and its
drop count, a pool's phases placed from its stats. Spans go to the SDK's in-memory exporter,
or over OTLP to a port nothing listens on."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from switchboard.common.tracing import TraceSettings, Tracing, extract, inject
from switchboard.wire import EngineStats

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def memory():
    return InMemorySpanExporter()


@contextlib.contextmanager
def request(t: Tracing, name: str, parent=None):
    """A request's span as a process starts it (``Tracing.start``), current inside the block."""
    span = t.start(name, parent)
    with t.current(span):
        yield span
    span.end()


def traced(memory, sampling=1.0, edge=True) -> Tracing:
    return Tracing(TraceSettings(sampling=sampling, delay_s=0.01), exporter=memory, edge=edge)


def test_off_without_an_endpoint():
    t = Tracing(TraceSettings.from_env("chat", {}))
    assert not t.enabled
    with t.span("chat") as s:
        assert not s.is_recording()
        assert inject() is None
    assert t.dropped == 0


def test_work_outside_a_traced_request_starts_no_trace(memory):
    t = traced(memory)
    with t.span("kv lookup") as s:  # e.g. a pool's request that came without a traceparent
        assert not s.is_recording()
    with request(t, "chat"), t.span("redis session.load") as s:
        assert s.is_recording()
    t.force_flush()
    assert sorted(s.name for s in memory.get_finished_spans()) == ["chat", "redis session.load"]


def test_settings_from_the_environment():
    s = TraceSettings.from_env(
        "gateway", {"SWITCHBOARD_TRACE_ENDPOINT": "http://127.0.0.1:6006", "SWITCHBOARD_TRACE_SAMPLING": "0.25"}
    )
    assert (s.traces_url, s.sampling, s.service) == ("http://127.0.0.1:6006/v1/traces", 0.25, "gateway")
    assert TraceSettings(endpoint="http://h:4318/v1/traces").traces_url == "http://h:4318/v1/traces"


@pytest.mark.parametrize(
    "env, named",
    [
        ({"SWITCHBOARD_TRACE_SAMPLING": "1.5"}, "SWITCHBOARD_TRACE_SAMPLING"),
        ({"SWITCHBOARD_TRACE_SAMPLING": "all"}, "SWITCHBOARD_TRACE_SAMPLING"),
        ({"SWITCHBOARD_TRACE_ENDPOINT": "127.0.0.1:6006"}, "SWITCHBOARD_TRACE_ENDPOINT"),
    ],
)
def test_bad_settings_name_the_variable(env, named):
    with pytest.raises(ValueError, match=named):
        TraceSettings.from_env("chat", env)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        b"00-" + TRACE_ID.encode() + b"-00f067aa0ba902b7-01",
        17,
        "garbage",
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # all-zero trace id
        f"00-{TRACE_ID}-" + "0" * 16 + "-01",  # all-zero span id
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",  # version ff is invalid
        f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01",
        f"00-{TRACE_ID}-00f067aa0ba902b7-01" + "-x" * 200,  # too long
        "00-\u00e9\u00e9\u00e9-00f067aa0ba902b7-01",
        "00-" + TRACE_ID + "-00f067aa0ba902b7-01\r\nX-Evil: 1",
    ],
)
def test_a_malformed_traceparent_is_ignored(memory, value):
    assert extract(value) is None
    t = traced(memory)
    with request(t, "gateway", extract(value)) as s:
        pass
    t.force_flush()
    (span,) = memory.get_finished_spans()
    assert span.parent is None and span.context.trace_id == s.get_span_context().trace_id


def test_a_traceparent_is_honoured_and_passed_on(memory):
    t = traced(memory)
    with request(t, "gateway", extract(SENT)):
        sent_on = inject()
    with request(t, "chat", extract(sent_on)):
        pass
    t.force_flush()
    gateway, chat = sorted(memory.get_finished_spans(), key=lambda s: s.name, reverse=True)
    assert f"{gateway.context.trace_id:032x}" == TRACE_ID == f"{chat.context.trace_id:032x}"
    assert gateway.parent.span_id == 0x00F067AA0BA902B7
    assert chat.parent.span_id == gateway.context.span_id


def test_sampling_zero_records_nothing_even_for_a_sampled_caller(memory):
    t = traced(memory, sampling=0.0)
    for _ in range(20):
        with request(t, "gateway", extract(SENT)) as s:
            assert not s.is_recording()
            with t.span("inner"):
                pass
        with request(t, "gateway"):
            pass
    t.force_flush()
    assert memory.get_finished_spans() == ()


def test_behind_the_edge_the_parent_decides(memory):
    t = traced(memory, sampling=0.0, edge=False)  # chat or a pool: the gateway sampled it
    with request(t, "chat", extract(SENT)):
        pass
    with request(t, "chat", extract(SENT[:-2] + "00")):  # the gateway did not sample it
        pass
    t.force_flush()
    assert [s.name for s in memory.get_finished_spans()] == ["chat"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_receiver_counts_its_spans_as_dropped():
    settings = TraceSettings(endpoint=f"http://127.0.0.1:{_closed_port()}", export_timeout_s=0.2, delay_s=0.01)
    t = Tracing(settings, edge=True)
    for _ in range(10):
        with request(t, "gateway"):
            pass
    assert t.force_flush(timeout_s=10)
    assert t.dropped == 10 and t.processor.exported == 0
    t.shutdown()


class _Stuck(InMemorySpanExporter):
    """An exporter that holds its first export until released: a receiver that hangs."""

    def __init__(self):
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def export(self, spans):
        self.entered.set()
        self.release.wait(10)
        return SpanExportResult.SUCCESS


def test_a_hanging_receiver_never_holds_a_request_and_the_overflow_is_counted():
    stuck = _Stuck()
    t = Tracing(TraceSettings(queue_size=4, batch_size=1, delay_s=0.01), exporter=stuck, edge=True)
    with request(t, "first"):
        pass
    assert stuck.entered.wait(5)  # the export thread now hangs on the first span
    for _ in range(10):  # each returns although nothing is being exported
        with request(t, "request"):
            pass
    assert t.dropped == 6  # 4 wait in the queue, 6 had no room
    stuck.release.set()
    assert t.force_flush()
    assert (t.dropped, t.processor.exported) == (6, 5)
    t.shutdown()


def test_a_pools_phases_are_placed_from_its_stats(memory):
    t = traced(memory, edge=False)
    with request(t, "root", extract(SENT)):
        pool = t.child("engine_short", start_ns=1_000_000_000)
    stats = EngineStats(generated=5, queue_ms=2.0, prefill_ms=3.0, engine_ms=10.0, batch_size=4)
    t.engine_phases(pool, 1_000_000_000, 1_012_000_000, stats)
    pool.end(end_time=1_012_000_000)
    t.force_flush()
    spans = {s.name: s for s in memory.get_finished_spans()}
    times = {n: (spans[n].start_time - 1_000_000_000, spans[n].end_time - 1_000_000_000) for n in spans}
    assert times["queue"] == (0, 2_000_000)
    assert times["prefill"] == (2_000_000, 5_000_000)
    assert times["decode"] == (5_000_000, 10_000_000)
    for name in ("queue", "prefill", "decode"):
        assert spans[name].parent.span_id == spans["engine_short"].context.span_id
    assert spans["decode"].attributes["generated_tokens"] == 5


def test_phases_never_outlast_the_pool_span(memory):
    t = traced(memory, edge=False)
    with request(t, "root", extract(SENT)):
        pool = t.child("engine_long", start_ns=0)
    t.engine_phases(pool, 0, 4_000_000, EngineStats(queue_ms=3.0, prefill_ms=3.0, engine_ms=9.0))
    pool.end(end_time=4_000_000)
    t.force_flush()
    ends = {s.name: s.end_time for s in memory.get_finished_spans() if s.name != "root"}
    assert set(ends) == {"engine_long", "queue", "prefill", "decode"}
    assert all(end <= 4_000_000 for end in ends.values())

"""OpenTelemetry traces: one trace per request, from the gateway through ``chat``, a pool's queue,
prefill and decode, and Redis (docs/tracing.md).

Each process (the gateway, a model's stub) calls ``configure`` once with ``TraceSettings``
(``from_env``: ``SWITCHBOARD_TRACE_ENDPOINT``, ``SWITCHBOARD_TRACE_SAMPLING``); without an
endpoint tracing is off and every call here is a cheap no-op. A request's context crosses
processes as a W3C ``traceparent`` string (``inject`` / ``extract``): an HTTP header at the
gateway, the request parameter ``wire.TRACE_PARAMETER`` over gRPC. A malformed or hostile
``traceparent`` is ignored: the request gets a trace of its own, never an error.

Spans leave through ``BoundedExport``: ``on_end`` only puts the span in a bounded queue (a full
queue drops it), a thread of its own exports batches over OTLP/HTTP with a short timeout, and
every span that was not delivered (queue full, receiver missing or failing) is counted in
``dropped``, which the metrics publishers show. A missing receiver never slows a request.

Sampling is decided once, at the edge: the gateway samples ``sampling`` of its requests by
trace id, whatever flag a client's ``traceparent`` carries (a client cannot make the server
trace everything); the models behind it follow the decision their parent's flag carries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from switchboard.wire import AsrResult, EngineStats

log = logging.getLogger("switchboard.tracing")

ENDPOINT_ENV = "SWITCHBOARD_TRACE_ENDPOINT"
SAMPLING_ENV = "SWITCHBOARD_TRACE_SAMPLING"
# Longer than any valid traceparent (55 characters): a longer one is not parsed at all.
_MAX_TRACEPARENT = 128
_PROPAGATOR = TraceContextTextMapPropagator()
NO_SPAN: Span = trace.INVALID_SPAN  # what a request not traced holds: every call on it is a no-op


@dataclass(frozen=True)
class TraceSettings:
    """Where spans go and how many requests are traced. ``endpoint``: an OTLP/HTTP receiver
    (``http://host:4318``, or the full ``.../v1/traces`` URL); None: tracing off."""

    endpoint: str | None = None
    sampling: float = 1.0  # the share of requests traced, 0..1 (the edge decides: module doc)
    service: str = "switchboard"
    queue_size: int = 2048  # spans waiting for export; more are dropped (and counted)
    batch_size: int = 256
    export_timeout_s: float = 1.0  # one export, retries included
    delay_s: float = 0.5  # the longest a span waits for its batch

    def __post_init__(self):
        if not 0.0 <= self.sampling <= 1.0:
            raise ValueError(f"{SAMPLING_ENV}: expected a share between 0 and 1, got {self.sampling}")
        if self.endpoint is not None and not re.match(r"https?://[^/\s]+", self.endpoint):
            raise ValueError(f"{ENDPOINT_ENV}: expected an http:// or https:// URL, got {self.endpoint!r}")

    @classmethod
    def from_env(cls, service: str, env: Mapping[str, str] | None = None) -> TraceSettings:
        env = os.environ if env is None else env
        endpoint = env.get(ENDPOINT_ENV, "").strip() or None
        raw = env.get(SAMPLING_ENV, "").strip() or "1"
        try:
            sampling = float(raw)
        except ValueError:
            raise ValueError(f"{SAMPLING_ENV}: expected a share between 0 and 1, got {raw!r}") from None
        return cls(endpoint=endpoint, sampling=sampling, service=service)

    @property
    def traces_url(self) -> str | None:
        if self.endpoint is None:
            return None
        base = self.endpoint.rstrip("/")
        return base if base.endswith("/v1/traces") else base + "/v1/traces"


class BoundedExport(SpanProcessor):
    """Spans to ``exporter`` off the request's thread, through a buffer of at most ``queue_size``;
    what cannot be delivered is counted in ``dropped`` (the module doc says why). Ending a span
    only appends it under a lock: the export thread wakes every ``delay_s`` (or when a batch is
    full), not per span; a wake-up per span cost a thread switch each, which under load showed
    as a fifth of the gateway's samples."""

    def __init__(self, exporter: SpanExporter, queue_size: int, batch_size: int, delay_s: float):
        self.exporter, self.queue_size, self.batch_size, self.delay_s = exporter, queue_size, batch_size, delay_s
        self._lock = threading.Lock()  # guards the buffer and the counts (request threads, export thread)
        self._spans: list[ReadableSpan] = []
        self._exporting = False
        self._dropped = self._exported = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trace-export", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        with self._lock:
            return self._dropped

    @property
    def exported(self) -> int:
        with self._lock:
            return self._exported

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled or self._stop.is_set():
            return
        with self._lock:
            if len(self._spans) >= self.queue_size:
                self._dropped += 1
                return
            self._spans.append(span)
            full = len(self._spans) == self.batch_size
        if full:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            with self._lock:
                spans, self._spans = self._spans, []
                self._exporting = bool(spans)
            for i in range(0, len(spans), self.batch_size):
                self._export(spans[i : i + self.batch_size])
            with self._lock:
                self._exporting = False
                done = self._stop.is_set() and not self._spans
            if done:
                return

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
        except Exception as e:  # an exporter must never take the thread down
            log.debug("span export failed: %s", e)
            ok = False
        with self._lock:
            if ok:
                self._exported += len(batch)
            else:
                self._dropped += len(batch)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Waits (at most ``timeout_millis``) until every buffered span was exported or dropped."""
        deadline = time.monotonic() + timeout_millis / 1000
        while time.monotonic() < deadline:
            with self._lock:
                if not self._spans and not self._exporting:
                    return True
            self._wake.set()
            time.sleep(0.01)
        return False

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5.0)
        self.exporter.shutdown()


class Tracing:
    """A process's tracer (or none: tracing off) and what crosses processes."""

    def __init__(self, settings: TraceSettings, exporter: SpanExporter | None = None, edge: bool = False):
        """``exporter``: instead of OTLP to ``settings.endpoint`` (tests). ``edge``: this process
        decides sampling for every request (the gateway); otherwise a request with a parent
        follows its parent's decision."""
        self.settings = settings
        self.processor: BoundedExport | None = None
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer = trace.NoOpTracer()
        if exporter is None and settings.endpoint is None:
            return
        if exporter is None:
            exporter = _otlp_exporter(settings)
        ratio = TraceIdRatioBased(settings.sampling)
        sampler: Sampler = ratio if edge else ParentBased(ratio)
        self._provider = TracerProvider(sampler=sampler, resource=Resource.create({"service.name": settings.service}))
        self.processor = BoundedExport(exporter, settings.queue_size, settings.batch_size, settings.delay_s)
        self._provider.add_span_processor(self.processor)
        self._tracer = self._provider.get_tracer("switchboard")

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    @property
    def dropped(self) -> int:
        """Spans not delivered to the receiver since the start."""
        return self.processor.dropped if self.processor else 0

    def start(
        self,
        name: str,
        parent: otel_context.Context | None,
        *,
        start_ns: int | None = None,
        kind: SpanKind = SpanKind.SERVER,
        attributes: Mapping | None = None,
    ) -> Span:
        """A request's span in this process, not made current: in the trace ``parent`` names
        (``extract``'s context), or, None, a trace of its own (sampling decides). End it with
        ``end`` (``end_ns`` for a recorded time)."""
        return self._tracer.start_span(
            name, context=parent or otel_context.Context(), kind=kind, attributes=attributes, start_time=start_ns
        )

    def child(
        self,
        name: str,
        parent: Span | None = None,
        *,
        start_ns: int | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping | None = None,
    ) -> Span:
        """A span under ``parent`` (None: the current span), not made current; ``NO_SPAN`` when
        that is in no trace, so work outside a traced request never starts a trace of its own."""
        parent = trace.get_current_span() if parent is None else parent
        if not parent.get_span_context().is_valid:
            return NO_SPAN
        context = trace.set_span_in_context(parent)
        return self._tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=start_ns)

    @contextlib.contextmanager
    def span(self, name: str, parent: Span | None = None, **kwargs) -> Iterator[Span]:
        """``child`` around a block, current inside it (spans started there are its children)."""
        s = self.child(name, parent, **kwargs)
        with trace.use_span(s, end_on_exit=True, record_exception=False, set_status_on_exception=True):
            yield s

    @contextlib.contextmanager
    def current(self, span: Span) -> Iterator[None]:
        """``span`` as the current one inside the block (not ended on exit)."""
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield

    def engine_phases(self, parent: Span, submitted_ns: int, end_ns: int, stats: EngineStats) -> None:
        """A pool's ``queue``, ``prefill`` and ``decode`` as children of ``parent``, placed after
        the fact from the durations the engine reports (``EngineStats``) from ``submitted_ns``,
        when the pool handed the request to its engine; clamped to end by ``end_ns``."""
        if not parent.is_recording():
            return

        def at(ms: float | None, after: int) -> int:
            return min(end_ns, after + int((ms or 0.0) * 1e6))

        queued = at(stats.queue_ms, submitted_ns)
        prefilled = at(stats.prefill_ms, queued)
        done = at(stats.engine_ms, submitted_ns) if stats.engine_ms else end_ns
        phases = (
            ("queue", submitted_ns, queued, {"batch_size": stats.batch_size or 0}),
            ("prefill", queued, prefilled, {"reused_tokens": stats.reused}),
            ("decode", prefilled, max(prefilled, done), {"generated_tokens": stats.generated}),
        )
        for name, start, end, attributes in phases:
            self.child(name, parent, start_ns=start, attributes=attributes).end(end_time=end)

    def asr_phases(self, parent: Span, submitted_ns: int, end_ns: int, result: AsrResult) -> None:
        """The recognizer's ``queue`` (arrival to its first batch) and ``transcribe`` (to the
        last text) as children of ``parent``, from the times ``AsrResult`` reports."""
        if not parent.is_recording():
            return
        queued = min(end_ns, submitted_ns + int((result.queue_ms or 0.0) * 1e6))
        done = min(end_ns, submitted_ns + int(result.asr_ms * 1e6)) if result.asr_ms else end_ns
        self.child("queue", parent, start_ns=submitted_ns, attributes={"batch_size": result.batch_size or 0}).end(
            end_time=queued
        )
        attributes = {"audio_s": result.duration, "chunks": result.chunks}
        self.child("transcribe", parent, start_ns=queued, attributes=attributes).end(end_time=max(queued, done))

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
            dropped = self.processor.dropped
            level = logging.WARNING if dropped else logging.INFO  # the gateway logs warnings only
            log.log(level, "traces: %d spans exported, %d dropped", self.processor.exported, dropped)

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        return self.processor.force_flush(int(timeout_s * 1000)) if self.processor else True


def extract(traceparent: object) -> otel_context.Context | None:
    """The context a W3C ``traceparent`` names, or None when there is none or it is malformed,
    too long or not a string (ignored, never an error)."""
    if not isinstance(traceparent, str) or not traceparent or len(traceparent) > _MAX_TRACEPARENT:
        return None
    try:
        ctx = _PROPAGATOR.extract({"traceparent": traceparent.strip()})
    except Exception:  # the propagator validates; anything it raises is still a bad header
        return None
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def inject(span: Span | None = None) -> str | None:
    """``span``'s (default: the current span's) W3C ``traceparent``, or None when it has no
    valid context (tracing off)."""
    ctx = trace.set_span_in_context(span) if span is not None else otel_context.get_current()
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier.get("traceparent")


def end(span: Span, error: str | None = None, end_ns: int | None = None) -> None:
    """Ends ``span``, marked failed with ``error`` (a message for the trace view) when given."""
    if error is not None and span.is_recording():
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=end_ns)


def _otlp_exporter(settings: TraceSettings) -> SpanExporter:
    # The OTLP exporter built on a pure-Python protobuf (PyPI's dash0-opentelemetry-exporter-otlp-
    # pyproto-http): OpenTelemetry's own needs protobuf >= 5, tritonclient 2.51 caps it below 5.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.traces_url, timeout=settings.export_timeout_s)


# -- the process's tracing -----------------------------------------------------------------------
_active = Tracing(TraceSettings())
_active_lock = threading.Lock()


def configure(settings: TraceSettings, exporter: SpanExporter | None = None, edge: bool = False) -> Tracing:
    """This process's tracing from now on (the one before is shut down)."""
    global _active
    with _active_lock:
        before, _active = _active, Tracing(settings, exporter, edge)
    before.shutdown()
    if _active.enabled:
        log.info(
            "traces: %s of requests to %s as %s",
            f"{settings.sampling:.0%}",
            settings.traces_url or "a test exporter",
            settings.service,
        )
    return _active


def active() -> Tracing:
    """This process's tracing (off until ``configure``)."""
    return _active

"""Helpers shared by the Python-backend models (imported only inside tritonserver)."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import triton_python_backend_utils as pb_utils

from switchboard.common import tracing
from switchboard.repository.params import ConfigError
from switchboard.wire import tag


def load_config(args: dict) -> tuple[dict, Path]:
    """The model config and the version folder that holds the installed artifacts."""
    config = json.loads(args["model_config"])
    version = Path(args["model_repository"]) / args["model_version"]
    return config, version


class DroppedSpans:
    """The spans this process could not deliver to the trace receiver (switchboard/common/
    tracing.py: queue full, receiver missing or failing), as
    ``switchboard_trace_spans_dropped_total{model, pid}``; ``publish`` copies the count."""

    def __init__(self, model: str):
        F = pb_utils.MetricFamily
        self._family = F(
            name="switchboard_trace_spans_dropped_total",
            description="trace spans not delivered to the OTLP receiver (queue full, receiver missing or failing)",
            kind=F.COUNTER,
        )
        self._metric = self._family.Metric(labels={"model": model, "pid": str(os.getpid())})
        self._last = 0

    def publish(self) -> None:
        dropped = tracing.active().dropped
        if dropped > self._last and self._metric is not None:
            self._metric.increment(float(dropped - self._last))
            self._last = dropped

    def close(self) -> None:
        self._metric = None  # the metric before its family (the backend requires this order)
        self._family = None


def one_blas_thread() -> None:
    """numpy's BLAS (OpenBLAS) on one thread for this process. With more, every small product
    (asr's mel filter bank, per request) wakes a worker thread that then spins in sched_yield
    waiting for the next, taking cores from the stub's own threads under load (docs/benchmarks.md).
    The models' arithmetic runs on their runtime's own threads."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def require_decoupled(config: dict) -> None:
    if not pb_utils.using_decoupled_model_transaction_policy(config):
        raise ConfigError(f"{config['name']}/config.pbtxt: model_transaction_policy {{ decoupled: true }} is required")


def request_parameters(request) -> dict:
    raw = request.parameters()
    try:
        params = json.loads(raw) if raw else {}
    except ValueError:
        params = {}
    return params if isinstance(params, dict) else {}


def input_array(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def send_error(sender, message: str, code: str = "INTERNAL") -> None:
    """A final error response; ``code`` is a TritonError code name, also written at the head of
    the message (switchboard.wire) because 2.51 streams drop codes without the error header."""
    error = pb_utils.TritonError(tag(code, message), getattr(pb_utils.TritonError, code))
    sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class Periodic:
    """``fn()`` every ``interval`` seconds on a daemon thread of its own until ``stop``: how the
    metrics publishers copy what they counted to the server. An exception is logged with
    ``what`` and the next round goes on (metrics must never take the model down)."""

    def __init__(self, fn: Callable[[], None], interval: float, name: str, log: logging.Logger, what: str):
        self.fn, self.interval, self.log, self.what = fn, interval, log, what
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.fn()
            except Exception:
                self.log.exception("%s failed", self.what)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.interval)


def metric_families(prefix: str, metrics: dict, gauges: dict | None = None) -> dict:
    """Triton metric families for a tally's ``metrics`` (name -> (kind, help, labels, buckets):
    counters and histograms) and ``gauges`` (name -> help), each named ``prefix + name``."""
    F = pb_utils.MetricFamily
    families = {
        name: F(name=prefix + name, description=doc, kind=F.HISTOGRAM if kind == "histogram" else F.COUNTER)
        for name, (kind, doc, _, _) in metrics.items()
    }
    for name, doc in (gauges or {}).items():
        families[name] = F(name=prefix + name, description=doc, kind=F.GAUGE)
    return families

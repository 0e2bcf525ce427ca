"""Triton glue for ``asr``, the speech recognizer pool: audio files in, transcript deltas out.

``execute`` reads each request (the audio file's bytes, a language, the priority) and hands it
to ``AsrService`` (switchboard/asr/service.py), which decodes it, cuts it at silences, batches
its chunks by length with other requests' and streams the text; every request ends with one
final response (``result``: AsrResult as JSON) or an error. Refused audio is INVALID_ARG with
the reason's code in brackets (``[too_long] ...``: switchboard.wire.AsrError).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard import paths
from switchboard.asr.batcher import audio_budget, length_batcher, make_batcher
from switchboard.asr.features import SAMPLE_RATE
from switchboard.asr.metrics import AsrMetrics
from switchboard.asr.model import AsrModel
from switchboard.asr.runtime import MANY_THREADS_FROM_FLOPS, AsrManifest, encoder_flops
from switchboard.asr.service import AsrJob, AsrRequestError, AsrService
from switchboard.common import tracing
from switchboard.common.breaker import LatencyBreaker
from switchboard.common.stream import CancelWatch, Outbox, ResponseSender
from switchboard.repository.config import AsrConfig
from switchboard.repository.params import ConfigError
from switchboard.runtime.choice import ONNXRUNTIME, TORCH, RuntimeChoice
from switchboard.runtime.onnx import auto_threads
from switchboard.triton.asr_metrics import AsrMetricsPublisher
from switchboard.triton.common import (
    input_array,
    load_config,
    one_blas_thread,
    request_parameters,
    require_decoupled,
    send_error,
)
from switchboard.wire import PRIORITY_DEFAULT, PRIORITY_PARAMETER, TRACE_PARAMETER, Asr, AsrResult

log = logging.getLogger("switchboard.asr")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _text(name: str, value: str) -> pb_utils.Tensor:
    return pb_utils.Tensor(name, np.asarray([[value.encode("utf-8")]], np.object_))


class TritonSink:
    """One request's way back: text deltas, then the final result or an error.

    The batch worker only queues them (``delta``, ``done``, ``error``); the pool's sender thread
    sends them (``deliver``), all of a request's queued deltas in one response, and its cancel
    watch asks whether the client left. Every send and every ``is_cancelled`` is a round trip to
    the server: a send per character per row, made on the decoding loop, had every row of the
    batch wait on each (switchboard/common/stream.py; docs/benchmarks.md has the figures).
    """

    def __init__(
        self, request, priority: int, outbox: Outbox, watch: CancelWatch, metrics: AsrMetrics, deltas: bool = True
    ):
        """``deltas`` False: the request asked for the result alone (``Asr.DELTAS``)."""
        self.request, self.sender, self.deltas = request, request.get_response_sender(), deltas
        self.priority, self.outbox, self.watch, self.metrics = priority, outbox, watch, metrics
        self.lock = threading.Lock()  # guards final_sent (stream.Sink says why)
        self.final_sent = self.cancel_seen = self.broken = self.watched = False
        # The request's span (docs/tracing.md), ended with its last response, its queue and
        # transcription placed in it from the result's times; when it was submitted.
        self.span, self.submitted_ns = tracing.NO_SPAN, time.time_ns()

    def cancelled(self) -> bool:
        if not self.watched:  # watched from its first batch on, not while it only waits
            self.watched = True
            self.watch.add(self)
        return self.cancel_seen or self.broken

    def emit(self, text: str) -> None:
        if self.deltas:
            self.outbox.put(self, self.priority, [text])

    def finish(self, result: AsrResult) -> None:
        self.outbox.put(self, self.priority, (), result, end=True)

    def fail(self, error: Exception) -> None:
        self.outbox.put(self, self.priority, (), error, end=True)

    def deliver(self, texts: list[str], final, end: bool) -> None:
        """The sender thread: the queued text in one response, then the end if it came."""
        if texts:
            out = [_text(Asr.TEXT, "".join(texts)), _text(Asr.RESULT, "")]
            self.sender.send(pb_utils.InferenceResponse(output_tensors=out))
        if not end:
            return
        answered = time.time_ns()  # the span ends as the last response leaves
        try:
            self._end(final)
        finally:
            if isinstance(final, AsrResult) and not self.cancel_seen:
                tracing.active().asr_phases(self.span, self.submitted_ns, answered, final)
                tracing.end(self.span, end_ns=answered)
            else:
                tracing.end(self.span, "cancelled" if self.cancel_seen else str(final), answered)

    def _end(self, final) -> None:
        if self.cancel_seen:
            self.metrics.failed("cancelled")
            send_error(self.sender, "cancelled by the client", "CANCELLED")
        elif isinstance(final, AsrRequestError):
            if final.code in ("unavailable", "shed_breaker"):
                self.metrics.failed(final.code)
                send_error(self.sender, str(final), "UNAVAILABLE")
            else:
                self.metrics.failed("invalid")
                send_error(self.sender, f"[{final.code}] {final}", "INVALID_ARG")
        elif isinstance(final, Exception):
            self.metrics.failed("error")
            send_error(self.sender, "internal error")
        else:
            self.metrics.transcribed(self.priority, final)
            out = [_text(Asr.TEXT, ""), _text(Asr.RESULT, final.to_json())]
            self.sender.send(pb_utils.InferenceResponse(output_tensors=out), flags=FINAL)


def _language(request) -> str | None:
    value = input_array(request, Asr.LANGUAGE)
    if value is None or value.size == 0:
        return None
    raw = value.reshape(-1)[0]
    text = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)).strip().lower()
    return text or None


def _priority(params: dict) -> int:
    value = params.get(PRIORITY_PARAMETER, PRIORITY_DEFAULT)
    return value if value in (1, 2) else PRIORITY_DEFAULT


class TritonPythonModel:
    def initialize(self, args):
        config, version = load_config(args)
        require_decoupled(config)
        one_blas_thread()
        tracing.configure(tracing.TraceSettings.from_env("asr"))
        cfg = AsrConfig.load(config, "asr/config.pbtxt")
        self.cfg = cfg
        self.watch = CancelWatch("asr", cfg.cancel_poll_ms / 1000)
        self.sender = ResponseSender("asr", self.watch)
        self.metrics = AsrMetrics()
        self.runtime = self._runtime(cfg)
        self.model = self._load_model(version, cfg)
        if self.runtime.kind == TORCH:  # buffers and CUDA graphs made now, not by the first callers
            self.model.runtime.warm(cfg.workers)
        self.window_s = self.model.max_seconds if self.model.window_frames is not None else None
        # what a chunk costs the batch budget: the window, fitted to it or whole (None: itself)
        self.padding = self.model.padded_s if self.window_s is not None else None
        self.budget_s = audio_budget(cfg.batch_audio_s, self.window_s, cfg.max_batch, gpu=self.runtime.on_gpu)
        self.service = AsrService(
            self.model,
            self._batcher(cfg),
            max_audio_s=cfg.max_audio_s,
            # a model with a short window (the embedded default's 5 s) takes shorter chunks
            chunk_s=min(cfg.chunk_s, self.model.max_seconds),
            max_pending_s=cfg.max_pending_s,
            workers=cfg.workers,
            breaker=LatencyBreaker(cfg.breaker_p99_s, cfg.breaker_window_s, cfg.breaker_min_samples)
            if cfg.breaker_p99_s > 0
            else None,
            short_s=cfg.long_audio_s,
            join=cfg.join_running,
        )
        self.publisher = AsrMetricsPublisher(self.metrics, self.service)
        hop, windows = self.model.manifest.hop_length, self.model.manifest.windows
        log.info(
            "asr ready: %s %s, %s batching (at most %d chunks, %.0f s of audio), %d worker(s), %s",
            self.model.manifest.name,
            cfg.precision
            if self.runtime.kind == ONNXRUNTIME
            else f"in PyTorch on {self.runtime.target} ({self.model.runtime.steps_mode} steps)",
            cfg.batching,
            cfg.max_batch,
            self.budget_s,
            cfg.workers,
            "inputs of any length"
            if not windows
            else f"windows of {', '.join(f'{w * hop / SAMPLE_RATE:g}' for w in windows)} s",
        )

    @staticmethod
    def _runtime(cfg: AsrConfig) -> RuntimeChoice:
        """The config's runtime parameters in the runtime layer's vocabulary (switchboard/runtime/choice.py)."""
        try:
            return RuntimeChoice.recognizer(
                cfg.runtime, cfg.device, cfg.threads, dtype=cfg.torch_dtype, steps=cfg.torch_steps
            )
        except ValueError as e:
            raise ConfigError(f"asr/config.pbtxt: {e}") from None

    def _load_model(self, version, cfg: AsrConfig) -> AsrModel:
        if not (version / "asr.json").is_file():
            raise FileNotFoundError(
                f"asr/config.pbtxt: no recognizer is installed in {version} (`make serve` builds and installs the "
                "default one; `python -m switchboard.export.asr --install` installs any Whisper checkpoint)"
            )
        runtime = self._runtime(cfg)
        if runtime.kind == TORCH:
            return self._load_checkpoint(version, cfg, runtime)
        manifest = AsrManifest.load(version)
        threads = runtime.threads or auto_threads(encoder_flops(version, manifest), MANY_THREADS_FROM_FLOPS)
        return AsrModel.load(version, precision=cfg.precision, threads=threads, fitted_windows=cfg.fitted_windows())

    def _load_checkpoint(self, version, cfg: AsrConfig, runtime: RuntimeChoice) -> AsrModel:
        """runtime torch: the checkpoint the installed graphs came from, on its device."""
        installed = AsrManifest.load(version)
        source = Path(installed.source)
        checkpoint = source if source.is_absolute() else paths.ROOT / source
        if not (checkpoint / "config.json").is_file():
            raise FileNotFoundError(
                f"asr/config.pbtxt: runtime torch runs the checkpoint the recognizer was exported from, "
                f"{checkpoint} (asr.json's source), and it is not there"
            )
        model = AsrModel.from_checkpoint(
            checkpoint,
            device=runtime.target,
            dtype=runtime.torch_dtype(),
            fitted_windows=cfg.fitted_windows(),
            steps=runtime.steps,
            max_batch=cfg.max_batch,
        )
        # the installed manifest's transcript budget, where it is the smaller (a random-weight
        # checkpoint never ends a transcript: asr_bench installs it with a cap, as ONNX serves it)
        if installed.max_target_positions < model.manifest.max_target_positions:
            model.manifest = dataclasses.replace(model.manifest, max_target_positions=installed.max_target_positions)
        return model

    def _batcher(self, cfg: AsrConfig):
        wait_s = cfg.max_wait_ms / 1000
        if cfg.batching == "length":
            if cfg.max_length_ratio and cfg.max_length_ratio < 1:
                raise ConfigError(
                    f"asr/config.pbtxt: parameter 'max_length_ratio' = {cfg.max_length_ratio:g}: expected 0 "
                    "(automatic) or at least 1"
                )
            if 0 < cfg.batch_audio_s < 1:
                raise ConfigError(
                    f"asr/config.pbtxt: parameter 'batch_audio_s' = {cfg.batch_audio_s:g}: expected 0 "
                    "(automatic) or at least 1"
                )
            return length_batcher(
                self.padding,
                budget_s=self.budget_s,
                max_batch=cfg.max_batch,
                max_length_ratio=cfg.max_length_ratio,
                max_wait_s=wait_s,
                long_s=cfg.long_audio_s,
                long_every=cfg.long_every,
                wait_alone=cfg.wait_alone,
            )
        if cfg.batching == "count":
            return make_batcher("count", max_batch=cfg.max_batch, max_wait_s=wait_s)
        raise ConfigError(f"asr/config.pbtxt: parameter 'batching' = {cfg.batching!r}: expected length or count")

    def execute(self, requests):
        for request in requests:
            audio = input_array(request, Asr.AUDIO)
            if audio is None or audio.size != 1 or not isinstance(audio.reshape(-1)[0], bytes):
                self.metrics.failed("invalid")
                send_error(request.get_response_sender(), "audio: expected one audio file as bytes", "INVALID_ARG")
                continue
            params = request_parameters(request)
            priority, deltas = _priority(params), params.get(Asr.DELTAS, True) is not False
            sink = TritonSink(request, priority, self.sender.outbox, self.watch, self.metrics, deltas)
            parent = tracing.extract(params.get(TRACE_PARAMETER))  # the span starts as the sink was made
            sink.span = tracing.active().start("asr", parent, start_ns=sink.submitted_ns)
            job = AsrJob(audio.reshape(-1)[0], sink, _language(request), priority)
            self.service.submit(job)
        return None

    def finalize(self):
        self.publisher.close()
        self.service.close()
        self.sender.close()
        self.watch.close()
        tracing.active().shutdown()

"""Triton glue for a generation pool (``engine_short``, ``engine_long``).

Requests come from ``chat`` over gRPC (switchboard/serving/engine_client.py): prompt ids, the cached
KV of the prompt's prefix, sampling settings, and (as request parameters) the priority and the
model fingerprint the cache was written with. ``execute`` hands them to the engine's scheduler
and returns; the engine thread queues each row's tokens and a sender thread streams them,
priority 1 first, then a final response with the KV cache and stats.
When the engine's own queue is full, ``execute`` waits, so the overflow stays in Triton's
queue where the pool's queue policy (timeouts, maximum size) applies.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard.artifact.manifest import Manifest
from switchboard.engine.runtime import OnnxDecoder, auto_threads, weights_cache
from switchboard.engine.scheduler import STAT_KEYS, Engine, GenerationRequest, GenerationResult
from switchboard.engine.stream import Outbox, TokenStream
from switchboard.triton.common import input_array, load_config, request_parameters, require_decoupled, send_error
from switchboard.triton.config import EngineConfig
from switchboard.wire import PRIORITY_DEFAULT, PRIORITY_PARAMETER, EngineStats, FinishReason, Pool

log = logging.getLogger("switchboard.engine")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _Sink:
    """One sequence's way back to ``chat``. The engine loop calls ``on_*`` (they only queue);
    the sender thread calls ``deliver``."""

    def __init__(self, request, sender, priority: int, outbox: Outbox, stream: TokenStream, watch: _CancelWatch):
        self.request, self.sender, self.priority, self.outbox, self.stream = request, sender, priority, outbox, stream
        self.watch, self.watched = watch, False
        self.broken = False  # a send failed (sender thread)
        self.cancel_seen = False  # the client cancelled (CancelWatch)
        # Guards `done`: Triton 2.51 segfaults in is_cancelled() on a request whose final
        # response was sent, so CancelWatch asks only while holding this and not done.
        self.lock = threading.Lock()
        self.done = False

    def cancelled(self) -> bool:
        # Watched from the engine's first question on (admission), so the round trips scale
        # with the running batch, not with every request waiting behind it.
        if not self.watched:
            self.watched = True
            self.watch.add(self)
        return self.broken or self.cancel_seen

    def on_tokens(self, ids: list[int]) -> None:
        ids = self.stream.add(ids)
        if ids:
            self.outbox.put(self, self.priority, ids)

    def on_finish(self, result: GenerationResult) -> None:
        self.outbox.put(self, self.priority, self.stream.rest(), result, end=True)

    def on_error(self, error: Exception) -> None:
        self.outbox.put(self, self.priority, (), error, end=True)

    def deliver(self, ids: list[int], final, end: bool) -> None:
        if not end:
            out = pb_utils.Tensor(Pool.TOKEN_IDS, np.asarray([ids], np.int32))
            self.sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        elif isinstance(final, Exception):
            send_error(self.sender, f"generation failed: {final.__class__.__name__}")
        else:
            self.sender.send(self._final(final, ids), flags=FINAL)

    @staticmethod
    def _final(result: GenerationResult, ids: list[int]):
        stats = EngineStats(
            reason=result.reason,
            generated=len(result.tokens),
            queue_ms=round(result.queue_ms, 2),
            prefill_ms=round(result.prefill_ms, 2),
            batch_size=result.batch_size_at_admission,
            engine_ms=round(result.engine_ms, 2),
        )
        outputs = [pb_utils.Tensor(Pool.STATS, np.asarray([[stats.to_json().encode()]], np.object_))]
        if ids and result.reason != FinishReason.CANCELLED:
            outputs.append(pb_utils.Tensor(Pool.TOKEN_IDS, np.asarray([ids], np.int32)))
        if result.cache is not None:
            outputs.append(pb_utils.Tensor(Pool.KV, result.cache[None]))
        return pb_utils.InferenceResponse(output_tensors=outputs)


class _CancelWatch:
    """Asks Triton every ``interval_s`` whether each live request was cancelled, on its own
    thread: ``is_cancelled`` is a round trip to the server that the engine loop must not wait on."""

    def __init__(self, name: str, interval_s: float):
        self.interval_s = max(interval_s, 0.001)
        self._live: set[_Sink] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{name}-cancel-watch", daemon=True)
        self._thread.start()

    def add(self, sink: _Sink) -> None:
        with self._lock:
            self._live.add(sink)

    def discard(self, sink: _Sink) -> None:
        with self._lock:
            self._live.discard(sink)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                live = list(self._live)
            for sink in live:
                with sink.lock:
                    if sink.done:
                        continue
                    try:
                        if sink.request.is_cancelled():
                            sink.cancel_seen = True
                    except Exception:  # the request is gone: nobody to answer
                        sink.cancel_seen = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5 * self.interval_s + 1)


class _Sender:
    """The one thread that sends the engine's responses, priority 1 first (Outbox says why)."""

    def __init__(self, name: str, watch: _CancelWatch):
        self.outbox, self.watch = Outbox(), watch
        self._thread = threading.Thread(target=self._loop, name=f"{name}-sender", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (item := self.outbox.take()) is not None:
            sink, ids, final, end = item
            if end:
                self.watch.discard(sink)
                with sink.lock:
                    sink.done = True
            try:
                sink.deliver(ids, final, end)
            except Exception:  # the client is gone: the engine drops the sequence at its next step
                log.exception("send failed; dropping the sequence")
                sink.broken = True

    def close(self, timeout: float = 5.0) -> None:
        self.outbox.close()
        self._thread.join(timeout)


_DESCRIPTIONS = {
    "prefill_batches": "prefill calls (one per admission round)",
    "prefill_tokens": "prompt tokens prefilled (cached prefixes excluded)",
    "prefill_padded_tokens": "prefill input positions including left padding",
    "decode_steps": "decode steps",
    "decode_columns": "attention-mask positions over all decode steps and rows",
    "decode_padded_columns": "masked (wasted) attention-mask positions over all decode steps and rows",
    "finished_stop": "sequences that ended at an end-of-turn token",
    "finished_length": "sequences that ended at max_new_tokens or the context window",
    "finished_cancelled": "sequences cancelled by the client",
    "prefill_chunks": "prefill forward passes (a prompt over prefill_budget takes several)",
    "prefill_s": "seconds in prefill forward passes",
    "decode_s": "seconds in decode forward passes",
    "busy_s": "seconds the engine spent in steps (with lane_threads 2, both lanes' threads: up to 2 a second)",
    "held_back_s": "seconds priority 2's lane waited for priority 1's work (hold_back_ms)",
}


class EngineMetrics:
    """The engine's counters as Triton custom metrics on the metrics port (Prometheus text),
    next to Triton's own: ``switchboard_engine_<counter>_total{model=...}``, decode steps per
    batch size and the waiting/running gauges. A thread copies them once per ``interval``."""

    def __init__(self, model: str, engine: Engine, interval: float = 1.0):
        F = pb_utils.MetricFamily
        self.model, self.engine, self.interval = model, engine, interval
        self._families = {
            k: F(name=f"switchboard_engine_{k}_total", description=d, kind=F.COUNTER) for k, d in _DESCRIPTIONS.items()
        }
        self._counters = {k: f.Metric(labels={"model": model}) for k, f in self._families.items()}
        self._families["batch"] = F(
            name="switchboard_engine_batch_steps_total", description="decode steps by batch size", kind=F.COUNTER
        )
        self._families["waiting"] = F(
            name="switchboard_engine_waiting", description="sequences waiting for a batch slot", kind=F.GAUGE
        )
        self._families["running"] = F(
            name="switchboard_engine_running", description="sequences in the running batch", kind=F.GAUGE
        )
        self._waiting = self._families["waiting"].Metric(labels={"model": model})
        self._running = self._families["running"].Metric(labels={"model": model})
        self._batch: dict[int, object] = {}
        self._last: dict = {}
        self._last_sizes: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="switchboard-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.publish()
            except Exception:  # metrics must never take the model down
                log.exception("publishing engine metrics failed")

    def publish(self) -> None:
        stats, sizes, waiting, running = self.engine.snapshot()
        for key in STAT_KEYS:
            delta = stats.get(key, 0) - self._last.get(key, 0)
            if delta > 0:
                self._counters[key].increment(float(delta))
        for size, steps in sizes.items():
            delta = steps - self._last_sizes.get(size, 0)
            if delta > 0:
                if size not in self._batch:
                    self._batch[size] = self._families["batch"].Metric(
                        labels={"model": self.model, "batch_size": str(size)}
                    )
                self._batch[size].increment(float(delta))
        self._last, self._last_sizes = stats, sizes
        self._waiting.set(float(waiting))
        self._running.set(float(running))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.interval)
        # Metrics before their families (the backend requires this order).
        self._counters.clear()
        self._batch.clear()
        self._waiting = self._running = None
        self._families.clear()


class TritonPythonModel:
    def initialize(self, args):
        config, version = load_config(args)
        require_decoupled(config)
        self.name = config["name"]
        cfg = EngineConfig.load(config, f"{self.name}/config.pbtxt")
        self.manifest = Manifest.load(version)
        precision, runtime = cfg.precision, cfg.runtime
        self.fingerprint = self.manifest.variant(precision)["fingerprint"]
        threads = cfg.threads or auto_threads(self.manifest.variant(precision).get("bytes", 0))
        if runtime == "onnxruntime":
            decoder = OnnxDecoder(
                version, self.manifest, precision, threads=threads, weights_cache=weights_cache(cfg.weights_cache)
            )
        elif runtime.startswith("triton:"):  # NVIDIA's container: native backend on the GPU
            from switchboard.triton.bls_decoder import BlsDecoder

            decoder = BlsDecoder(runtime.split(":", 1)[1], self.manifest)
        elif runtime.split(":", 1)[0] == "torch":  # a GPU without TensorRT: the checkpoint in PyTorch
            from switchboard.engine.torch_runtime import TorchDecoder

            checkpoint = cfg.checkpoint
            if not checkpoint:
                raise ValueError(
                    f"{self.name}/config.pbtxt: runtime {runtime!r} needs parameter 'checkpoint' "
                    "(the Hugging Face checkpoint the repository was exported from)"
                )
            device = runtime.split(":", 1)[1] if ":" in runtime else "cpu"
            if device == "cuda" and args.get("model_instance_kind") == "GPU":
                device = f"cuda:{args['model_instance_device_id']}"
            decoder = TorchDecoder(checkpoint, self.manifest, device, threads=threads)
        else:
            raise ValueError(
                f"{self.name}/config.pbtxt: parameter 'runtime' = {runtime!r}: "
                "expected onnxruntime, torch[:cpu|cuda] or triton:<model>"
            )
        self.engine = Engine(
            decoder,
            max_batch=cfg.max_batch,
            max_waiting=cfg.max_waiting,
            priority_slots=cfg.priority_slots,
            preempt_steps=cfg.preempt_steps,
            lane_threads=cfg.lane_threads,
            normal_nice=cfg.normal_nice,
            hold_back_ms=cfg.hold_back_ms,
            prefill_budget=cfg.prefill_budget,
            stop_ids=set(self.manifest.eos_token_ids),
        )
        # Priority 2 streams its tokens in sends at most stream_interval_ms apart, priority 1
        # one send per token (switchboard/engine/stream.py says why).
        self.stream_interval_s = cfg.stream_interval_ms / 1000
        self.cancel_poll_s = cfg.cancel_poll_ms / 1000
        self.watch = _CancelWatch(self.name, self.cancel_poll_s)
        self.sender = _Sender(self.name, self.watch)
        self.engine.start()
        self.metrics = EngineMetrics(self.name, self.engine)
        log.info(
            "%s ready: %s %s, max batch %d, %d threads",
            self.name,
            self.manifest.name,
            precision,
            cfg.max_batch,
            threads,
        )

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            params = request_parameters(request)
            if params.get(Pool.PING) is True:
                # chat asks whether this stub is alive when a stream from it has gone quiet
                # (PoolHealth): answered here, before the engine and its backpressure.
                pong = pb_utils.Tensor(Pool.STATS, np.asarray([[b'{"ping": true}']], np.object_))
                sender.send(
                    pb_utils.InferenceResponse(output_tensors=[pong]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            try:
                req = self._parse(request, params)
                self.engine.validate(req)
            except ValueError as e:
                send_error(sender, f"{self.name}: {e}", "INVALID_ARG")
                continue
            while not self.engine.wait_for_room(timeout=1.0):
                if request.is_cancelled():
                    break
            if request.is_cancelled():
                send_error(sender, "cancelled", "CANCELLED")
                continue
            stream = TokenStream(0.0 if req.priority <= 1 else self.stream_interval_s)
            self.engine.submit(req, _Sink(request, sender, req.priority, self.sender.outbox, stream, self.watch))
        return None

    def _parse(self, request, params: dict) -> GenerationRequest:
        ids = input_array(request, Pool.INPUT_IDS)
        if ids is None:
            raise ValueError("input_ids is required")
        prompt = ids.reshape(-1).astype(np.int64).tolist()
        if any(t < 0 or t >= self.manifest.vocab_size for t in prompt):
            raise ValueError("input_ids: token id out of range")
        reused, past = 0, input_array(request, Pool.PAST_KV)
        if past is not None and past.size:
            if params.get(Pool.FINGERPRINT) != self.fingerprint:
                raise ValueError("past_kv was written by another model variant")
            past = past.reshape(past.shape[-5:])
            reused = int(past.shape[3])

        def scalar(name, default, kind):
            a = input_array(request, name)
            return default if a is None else kind(a.reshape(-1)[0])

        return GenerationRequest(
            prompt=prompt,
            reused=reused,
            past=past,
            max_new_tokens=scalar(Pool.MAX_NEW_TOKENS, 64, int),
            temperature=scalar(Pool.TEMPERATURE, 0.0, float),
            top_p=scalar(Pool.TOP_P, 1.0, float),
            # chat_priority: from chat over gRPC, where Triton keeps `priority` for its own queue.
            priority=int(params.get(PRIORITY_PARAMETER, params.get("priority", PRIORITY_DEFAULT))),
            seed=params.get(Pool.SEED),
            return_cache=bool(params.get(Pool.RETURN_KV, False)) and params.get(Pool.FINGERPRINT) == self.fingerprint,
        )

    def finalize(self):
        self.metrics.close()
        self.engine.stop()
        self.sender.close()
        self.watch.close()

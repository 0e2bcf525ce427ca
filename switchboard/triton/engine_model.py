"""Triton glue for a generation pool (``engine_short``, ``engine_long``).

Requests come from ``chat`` over gRPC (switchboard/serving/engine_client.py): prompt ids,
sampling settings, and (as request parameters) the priority and whether to reuse KV. The pool
owns the KV: ``execute`` finds the prompt's stored prefix in its block cache (its own memory,
then Redis; switchboard/kv), hands the request to the engine's scheduler and returns; the
engine thread queues each row's tokens and a sender thread streams them, priority 1 first, then
a final response with stats, after which the sequence's new KV blocks are stored.
When the engine's own queue is full, ``execute`` waits, so the overflow stays in Triton's
queue where the pool's queue policy (timeouts, maximum size) applies.
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard.artifact.version import ModelVersion
from switchboard.engine.runtime import OnnxDecoder, auto_threads, weights_cache
from switchboard.engine.scheduler import STAT_KEYS, Engine, GenerationRequest, GenerationResult
from switchboard.engine.sizing import compute_bound
from switchboard.engine.stream import Outbox, TokenStream
from switchboard.kv.model import block_cache
from switchboard.kv.tiers import BlockCache, Reuse
from switchboard.triton.common import input_array, load_config, request_parameters, require_decoupled, send_error
from switchboard.triton.config import EngineConfig
from switchboard.wire import PRIORITY_DEFAULT, PRIORITY_PARAMETER, CacheMiss, EngineStats, FinishReason, Pool

log = logging.getLogger("switchboard.engine")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _Sink:
    """One sequence's way back to ``chat``. The engine loop calls ``on_*`` (they only queue);
    the sender thread calls ``deliver``."""

    def __init__(self, request, sender, priority: int, outbox: Outbox, stream: TokenStream, watch: _CancelWatch):
        self.request, self.sender, self.priority, self.outbox, self.stream = request, sender, priority, outbox, stream
        self.watch, self.watched = watch, False
        # With KV reuse: where the new blocks go once the final response is out, and what was reused.
        self.blocks: BlockCache | None = None
        self.prompt: list[int] = []
        self.reuse = Reuse()
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
            if self.blocks is not None and final.cache is not None:  # after the answer, never before
                self.blocks.store(self.prompt + final.tokens[:-1], final.cache, self.priority)

    def _final(self, result: GenerationResult, ids: list[int]):
        stats = EngineStats(
            reason=result.reason,
            generated=len(result.tokens),
            queue_ms=round(result.queue_ms, 2),
            prefill_ms=round(result.prefill_ms, 2),
            batch_size=result.batch_size_at_admission,
            engine_ms=round(result.engine_ms, 2),
            reused=self.reuse.tokens,
            kv_local_blocks=self.reuse.local_blocks,
            kv_redis_blocks=self.reuse.remote_blocks,
            cache_miss=self.reuse.miss,
        )
        outputs = [pb_utils.Tensor(Pool.STATS, np.asarray([[stats.to_json().encode()]], np.object_))]
        if ids and result.reason != FinishReason.CANCELLED:
            outputs.append(pb_utils.Tensor(Pool.TOKEN_IDS, np.asarray([ids], np.int32)))
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


# KV block counters (BlockCache.snapshot keys) -> (metric family, its labels).
_KV_COUNTERS = {
    "lookups": ("lookups", {}),
    "local_hit_blocks": ("hit_blocks", {"tier": "local"}),
    "remote_hit_blocks": ("hit_blocks", {"tier": "redis"}),
    "reused_tokens": ("reused_tokens", {}),
    "stored_blocks": ("stored_blocks", {}),
    "writes_ok": ("writes", {"outcome": "ok"}),
    "writes_failed": ("writes", {"outcome": "failed"}),
    "writes_dropped": ("writes", {"outcome": "dropped"}),
    "stores_dropped": ("writes", {"outcome": "dropped_before_local"}),
    "local_evicted": ("evicted_blocks", {"tier": "priority2"}),
    "local_evicted_vip": ("evicted_blocks", {"tier": "priority1"}),
    "redis_bytes_read": ("redis_bytes", {"direction": "read"}),
    "redis_bytes_written": ("redis_bytes", {"direction": "written"}),
    "redis_failures": ("redis_failures", {}),
    **{f"miss_{m.value}": ("misses", {"reason": m.value}) for m in CacheMiss},
}
_KV_DESCRIPTIONS = {
    "lookups": "prompts looked up in the KV block cache",
    "hit_blocks": "KV blocks reused, by the tier they came from",
    "reused_tokens": "prompt tokens whose KV came from stored blocks",
    "stored_blocks": "new KV blocks stored",
    "writes": "block writes to Redis, by outcome",
    "evicted_blocks": "blocks evicted from the pool's own cache, by the priority they were kept for",
    "redis_bytes": "KV block bytes moved to and from Redis",
    "redis_failures": "Redis calls that failed (the pool then goes on without Redis for a while)",
    "misses": "prompts that reused fewer tokens than their session stored, by reason",
}


class EngineMetrics:
    """The engine's counters as Triton custom metrics on the metrics port (Prometheus text),
    next to Triton's own: ``switchboard_engine_<counter>_total{model=...}``, decode steps per
    batch size and the waiting/running gauges; the KV block cache's as ``switchboard_kv_*``.
    A thread copies them once per ``interval``."""

    def __init__(
        self, model: str, version: int, engine: Engine, blocks: BlockCache | None = None, interval: float = 1.0
    ):
        F = pb_utils.MetricFamily
        self.model, self.engine, self.blocks, self.interval = model, engine, blocks, interval
        # Two versions of a pool serve side by side during a rollout, and a reload starts a new
        # instance beside the old one: each has its own series (Triton 2.51 shares a series
        # between processes that use the same labels and drops it when the first one unloads).
        self.labels = {"model": model, "version": str(version), "pid": str(os.getpid())}
        self._families = {
            k: F(name=f"switchboard_engine_{k}_total", description=d, kind=F.COUNTER) for k, d in _DESCRIPTIONS.items()
        }
        self._counters = {k: f.Metric(labels=self.labels) for k, f in self._families.items()}
        self._families["batch"] = F(
            name="switchboard_engine_batch_steps_total", description="decode steps by batch size", kind=F.COUNTER
        )
        self._families["waiting"] = F(
            name="switchboard_engine_waiting", description="sequences waiting for a batch slot", kind=F.GAUGE
        )
        self._families["running"] = F(
            name="switchboard_engine_running", description="sequences in the running batch", kind=F.GAUGE
        )
        self._waiting = self._families["waiting"].Metric(labels=self.labels)
        self._running = self._families["running"].Metric(labels=self.labels)
        self._families.update(
            {
                f"kv_{k}": F(name=f"switchboard_kv_{k}_total", description=d, kind=F.COUNTER)
                for k, d in _KV_DESCRIPTIONS.items()
            }
        )
        self._families["kv_local_bytes"] = F(
            name="switchboard_kv_local_bytes", description="bytes of KV blocks in the pool's own cache", kind=F.GAUGE
        )
        self._kv = {
            key: self._families[f"kv_{family}"].Metric(labels={**self.labels, **labels})
            for key, (family, labels) in _KV_COUNTERS.items()
        }
        self._kv_bytes = self._families["kv_local_bytes"].Metric(labels=self.labels)
        self._kv_last: dict = {}
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
                    self._batch[size] = self._families["batch"].Metric(labels={**self.labels, "batch_size": str(size)})
                self._batch[size].increment(float(delta))
        self._last, self._last_sizes = stats, sizes
        self._waiting.set(float(waiting))
        self._running.set(float(running))
        if self.blocks is not None:
            kv = self.blocks.snapshot()
            for key, metric in self._kv.items():
                delta = kv.get(key, 0) - self._kv_last.get(key, 0)
                if delta > 0:
                    metric.increment(float(delta))
            self._kv_last = kv
            self._kv_bytes.set(float(kv.get("local_bytes", 0)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.interval)
        # Metrics before their families (the backend requires this order).
        self._counters.clear()
        self._batch.clear()
        self._kv.clear()
        self._waiting = self._running = self._kv_bytes = None
        self._families.clear()


class TritonPythonModel:
    def initialize(self, args):
        config, version = load_config(args)
        require_decoupled(config)
        self.name = config["name"]
        cfg = EngineConfig.load(config, f"{self.name}/config.pbtxt")
        # The version's weights are checked against its manifest before it serves: a modified
        # file fails this load, and the version already serving goes on (switchboard/ops/rollout.py).
        self.version = ModelVersion.load(version, cfg.precision)
        self.version.verify()
        self.manifest, precision, runtime = self.version.manifest, self.version.precision, cfg.runtime
        self.fingerprint = self.version.fingerprint
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
        self.blocks = self._block_cache(cfg, version)
        try:
            lane = cfg.own_priority_lane(compute_bound(self.manifest.variant(precision).get("bytes", 0), runtime))
        except ValueError as e:
            raise ValueError(f"{self.name}/config.pbtxt: {e}") from None
        self.engine = Engine(
            decoder,
            max_batch=cfg.max_batch,
            max_waiting=cfg.max_waiting,
            priority_slots=cfg.priority_slots,
            preempt_steps=cfg.preempt_steps if lane else 0,
            priority_overflow=cfg.priority_overflow_rows,
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
        self.metrics = EngineMetrics(self.name, self.version.number, self.engine, self.blocks)
        log.info(
            "%s version %d ready: %s %s, max batch %d, priority 1 %s, %d threads",
            self.name,
            self.version.number,
            self.manifest.name,
            precision,
            cfg.max_batch,
            "in a batch of its own" if self.engine.policy.priority_lane else "in the shared batch",
            threads,
        )

    def _block_cache(self, cfg: EngineConfig, version) -> BlockCache:
        """The pool's KV blocks: its own memory first, then Redis shared by every replica."""
        try:
            return block_cache(
                self.manifest,
                version,
                self.fingerprint,
                tokens=cfg.kv_block_tokens,
                local_mb=cfg.kv_local_mb,
                storage=cfg.kv_storage,
                zstd=cfg.kv_zstd,
                secret=cfg.session_secret.encode(),
                redis_url=cfg.redis_url if cfg.kv_redis else None,
                redis_cluster=cfg.redis_cluster,
                redis_timeout_s=cfg.redis_timeout_s,
                redis_tls=cfg.redis_tls(),
                ttl_s=cfg.kv_block_ttl_s,
                name=self.name,
            )
        except ValueError as e:
            raise ValueError(f"{self.name}/config.pbtxt: {e}") from None

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
            reuse = self._reuse(req, params)
            while not self.engine.wait_for_room(timeout=1.0):
                if request.is_cancelled():
                    break
            if request.is_cancelled():
                send_error(sender, "cancelled", "CANCELLED")
                continue
            stream = TokenStream(0.0 if req.priority <= 1 else self.stream_interval_s)
            sink = _Sink(request, sender, req.priority, self.sender.outbox, stream, self.watch)
            if reuse is not None:
                sink.blocks, sink.prompt, sink.reuse = self.blocks, req.prompt, reuse
            self.engine.submit(req, sink)
        return None

    def _reuse(self, req: GenerationRequest, params: dict) -> Reuse | None:
        """With ``kv_reuse`` (and chat's prompt built for this pool's model): the stored prefix of
        the prompt into ``req``, and the sequence's KV kept for its blocks when it finishes."""
        if not params.get(Pool.KV_REUSE) or params.get(Pool.FINGERPRINT) != self.fingerprint:
            return None
        expected = params.get(Pool.EXPECTED_REUSE, 0)
        reuse = self.blocks.lookup(req.prompt, req.priority, expected if isinstance(expected, int) else 0)
        if reuse.tokens:
            req.reused, req.past = reuse.tokens, reuse.past
        req.return_cache = True
        return reuse

    def _parse(self, request, params: dict) -> GenerationRequest:
        ids = input_array(request, Pool.INPUT_IDS)
        if ids is None:
            raise ValueError("input_ids is required")
        prompt = ids.reshape(-1).astype(np.int64).tolist()
        if any(t < 0 or t >= self.manifest.vocab_size for t in prompt):
            raise ValueError("input_ids: token id out of range")

        def scalar(name, default, kind):
            a = input_array(request, name)
            return default if a is None else kind(a.reshape(-1)[0])

        return GenerationRequest(
            prompt=prompt,
            max_new_tokens=scalar(Pool.MAX_NEW_TOKENS, 64, int),
            temperature=scalar(Pool.TEMPERATURE, 0.0, float),
            top_p=scalar(Pool.TOP_P, 1.0, float),
            # chat_priority: from chat over gRPC, where Triton keeps `priority` for its own queue.
            priority=int(params.get(PRIORITY_PARAMETER, params.get("priority", PRIORITY_DEFAULT))),
            seed=params.get(Pool.SEED),
        )

    def finalize(self):
        self.metrics.close()
        self.engine.stop()
        self.sender.close()
        self.watch.close()
        self.blocks.close()

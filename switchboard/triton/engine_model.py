"""Triton glue for a generation pool (``engine_short``, ``engine_long``).

Requests come from ``chat`` over gRPC (switchboard/serving/engine_client.py): prompt ids,
sampling settings, and (as request parameters) the priority and whether to reuse KV. The pool
owns the KV: ``execute`` finds the prompt's stored prefix in its block cache (its own memory,
then Redis; switchboard/kv), hands the request to the engine's scheduler and returns; the
engine thread queues each row's tokens and a sender thread streams them, priority 1 first, then
a final response with stats, after which the sequence's new KV blocks are stored.
When the engine's own queue is full, ``execute`` waits, so the overflow stays in Triton's
queue where the pool's queue policy (timeouts, maximum size) applies.

This file only wires: the runtime a pool's settings choose is switchboard/engine/loader.py's,
the scheduling switchboard/engine/'s, the responses and cancellation
switchboard/triton/engine_responses.py's, the metrics switchboard/triton/engine_metrics.py's.
"""

from __future__ import annotations

import functools
import logging
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard.artifact.grammar import Grammars, parse_spec
from switchboard.artifact.tokenizer import control_token_ids
from switchboard.common import tracing
from switchboard.common.stream import CancelWatch, ResponseSender, TokenStream
from switchboard.engine import draft
from switchboard.engine.decoder import Decoder
from switchboard.engine.draft import DEFAULT_COST, Speculation
from switchboard.engine.loader import load_decoder, pool_runtime
from switchboard.engine.scheduler import Engine, GenerationRequest
from switchboard.engine.sizing import compute_bound
from switchboard.kv.model import block_cache
from switchboard.kv.tiers import BlockCache, Reuse
from switchboard.repository.config import EngineConfig
from switchboard.repository.versions import ModelVersion
from switchboard.runtime.choice import RuntimeChoice
from switchboard.triton.common import (
    input_array,
    load_config,
    one_blas_thread,
    request_parameters,
    require_decoupled,
    send_error,
)
from switchboard.triton.engine_metrics import EngineMetricsPublisher
from switchboard.triton.engine_responses import FINAL, ResponseSink
from switchboard.wire import MAX_TOP_LOGPROBS, PRIORITY_DEFAULT, PRIORITY_PARAMETER, TRACE_PARAMETER, Pool

log = logging.getLogger("switchboard.engine")


def _native_decoder(model: str, manifest) -> Decoder:
    """``runtime: triton:<model>``: the graph on a native Triton model, over BLS."""
    from switchboard.triton.bls_decoder import BlsDecoder  # NVIDIA's container only

    return BlsDecoder(model, manifest)


class TritonPythonModel:
    def initialize(self, args):
        config, version = load_config(args)
        require_decoupled(config)
        one_blas_thread()
        self.name = config["name"]
        tracing.configure(tracing.TraceSettings.from_env(self.name))
        cfg = EngineConfig.load(config, f"{self.name}/config.pbtxt")
        self._load_version(version, cfg)
        decoder, runtime = self._load_decoder(version, cfg, args)
        self.blocks = self._block_cache(cfg, version)
        self._setup_engine(decoder, cfg)
        self._setup_responses(cfg)
        self.engine.start()
        self.metrics = EngineMetricsPublisher(self.name, self.version.number, self.engine, self.blocks)
        log.info(
            "%s version %d ready: %s %s, max batch %d, priority 1 %s, %d threads",
            self.name,
            self.version.number,
            self.manifest.name,
            self.version.precision,
            cfg.max_batch,
            "in a batch of its own" if self.engine.policy.priority_lane else "in the shared batch",
            runtime.threads,
        )

    # -- initialize, step by step -----------------------------------------------------------
    def _load_version(self, version, cfg: EngineConfig) -> None:
        self.version = ModelVersion.load(version, cfg.precision)
        self.manifest, self.fingerprint = self.version.manifest, self.version.fingerprint

    def _load_decoder(self, version, cfg: EngineConfig, args) -> tuple[Decoder, RuntimeChoice]:
        """The decoder the pool's ``runtime`` names (switchboard/engine/loader.py)."""
        try:
            runtime = pool_runtime(
                cfg.runtime, cfg.threads, cfg.weights_cache, cfg.checkpoint, self.version.variant.get("bytes", 0)
            )
        except ValueError as e:
            raise ValueError(f"{self.name}/config.pbtxt: {e}") from None
        if runtime.reads_graph:
            # The graph's weights are checked against the manifest before it serves: a modified
            # file fails this load, and the version already serving goes on (switchboard/ops/rollout.py).
            self.version.verify()
        gpu = args["model_instance_device_id"] if args.get("model_instance_kind") == "GPU" else None
        decoder = load_decoder(
            runtime, version, self.manifest, self.version.precision, gpu, native=_native_decoder, pack=cfg.packed_passes
        )
        return decoder, runtime

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

    def _setup_engine(self, decoder: Decoder, cfg: EngineConfig) -> None:
        """The engine, priority 1 in a lane of its own or in the shared batch (``priority_lane``;
        switchboard/engine/policy.py)."""
        try:
            lane = cfg.own_priority_lane(compute_bound(self.version.variant.get("bytes", 0), cfg.runtime))
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
            banned_ids=self._control_tokens(),
            speculation=self._speculation(decoder, cfg),
            pack=cfg.packed_passes,
        )

    def _speculation(self, decoder: Decoder, cfg: EngineConfig) -> Speculation | None:
        """Drafts verified in the decode steps, where ``speculation`` and the export's measurement
        say so (switchboard/engine/draft.py)."""
        measured = self.manifest.speculation
        try:
            if not cfg.speculates(getattr(decoder, "verifies", False), measured):
                return None
        except ValueError as e:
            raise ValueError(f"{self.name}/config.pbtxt: {e}") from None
        cost = float(measured.get("cost_per_token", DEFAULT_COST))
        one = measured.get("cost_per_token_batch_1")
        return draft.build(
            self.version.directory, cost, cfg.draft_tokens, cfg.draft_answers, None if one is None else float(one)
        )

    @functools.cached_property
    def grammars(self) -> Grammars:
        """The version's grammar compiler, made at the first constrained request."""
        m = self.manifest
        return Grammars(self.version.directory / "tokenizer.json", m.vocab_size, m.end_of_turn_id)

    def _control_tokens(self) -> list[int]:
        """Tokens of control characters (but tab and newline): never sampled, so no answer
        carries one back to a client that may refuse it."""
        path = self.version.directory / "tokenizer.json"
        return control_token_ids(path) if path.is_file() else []

    def _setup_responses(self, cfg: EngineConfig) -> None:
        # Priority 2 streams its tokens in sends at most stream_interval_ms apart, priority 1
        # one send per token (switchboard/common/stream.py says why).
        self.stream_interval_s = cfg.stream_interval_ms / 1000
        self.cancel_poll_s = cfg.cancel_poll_ms / 1000
        self.watch = CancelWatch(self.name, self.cancel_poll_s)
        self.sender = ResponseSender(self.name, self.watch)

    # -- requests -------------------------------------------------------------------------
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
                    flags=FINAL,
                )
                continue
            # The request's span in chat's trace (docs/tracing.md); the engine's own work is placed
            # in it after the fact, from its stats (engine_responses.py).
            parent = tracing.extract(params.get(TRACE_PARAMETER))
            span = tracing.active().start(self.name, parent) if parent else tracing.NO_SPAN
            try:
                req = self._parse(request, params)
                self.engine.validate(req)
            except ValueError as e:
                send_error(sender, f"{self.name}: {e}", "INVALID_ARG")
                tracing.end(span, str(e))
                continue
            with tracing.active().current(span):
                reuse = self._reuse(req, params)
            while not self.engine.wait_for_room(timeout=1.0):
                if request.is_cancelled():
                    break
            if request.is_cancelled():
                send_error(sender, "cancelled", "CANCELLED")
                tracing.end(span, "cancelled")
                continue
            stream = TokenStream(0.0 if req.priority <= 1 else self.stream_interval_s)
            sink = ResponseSink(request, sender, req.priority, self.sender.outbox, stream, self.watch)
            if reuse is not None:
                sink.blocks, sink.prompt, sink.reuse = self.blocks, req.prompt, reuse
            sink.span, sink.submitted_ns = span, time.time_ns()
            self.engine.submit(req, sink)
        return None

    def _reuse(self, req: GenerationRequest, params: dict) -> Reuse | None:
        """With ``kv_reuse`` (and chat's prompt built for this pool's model): the stored prefix of
        the prompt into ``req``, and the sequence's KV kept for its blocks when it finishes."""
        if not params.get(Pool.KV_REUSE) or params.get(Pool.FINGERPRINT) != self.fingerprint:
            return None
        expected = params.get(Pool.EXPECTED_REUSE, 0)
        with tracing.active().span(
            "kv lookup", kind=tracing.SpanKind.CLIENT, attributes={"db.system": "redis"}
        ) as span:
            reuse = self.blocks.lookup(req.prompt, req.priority, expected if isinstance(expected, int) else 0)
            span.set_attributes({"local_blocks": reuse.local_blocks, "redis_blocks": reuse.remote_blocks})
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

        logprobs = params.get(Pool.LOGPROBS, -1)
        if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not -1 <= logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"parameter logprobs: expected an integer in [-1, {MAX_TOP_LOGPROBS}]")
        constraint = None
        spec = params.get(Pool.RESPONSE_FORMAT)
        if spec is not None:
            constraint = self.grammars.matcher(parse_spec(str(spec)))  # GrammarError is a ValueError
        return GenerationRequest(
            constraint=constraint,
            logprobs=logprobs,
            prompt=prompt,
            max_new_tokens=scalar(Pool.MAX_NEW_TOKENS, 64, int),
            temperature=scalar(Pool.TEMPERATURE, 0.0, float),
            top_p=scalar(Pool.TOP_P, 1.0, float),
            presence_penalty=scalar(Pool.PRESENCE_PENALTY, 0.0, float),  # range: Engine.validate
            frequency_penalty=scalar(Pool.FREQUENCY_PENALTY, 0.0, float),
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
        tracing.active().shutdown()

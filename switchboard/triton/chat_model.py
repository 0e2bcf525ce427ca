"""Triton glue for ``chat``, the public, streaming entry model: requests in, responses out.
The turn itself (session, prompt, KV prefix, route, stream, FAQ, stats) is
``switchboard.serving.turn.ChatTurn``.

``execute`` validates and hands each request to ``Admission`` (switchboard/serving/admission.py): at
most ``max_inflight`` chats generate at once, the rest wait by priority for at most
``max_queue_wait_s`` (a priority-2 chat that would wait longer is answered at once). A chat
that cannot get a slot in time, or whose pool rejects, times out or fails before the first text
was sent, is answered from the FAQ (``"fallback": true``).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard.artifact.grammar import GrammarError, Grammars
from switchboard.artifact.manifest import MANIFEST
from switchboard.artifact.tokenizer import TextTokenizer
from switchboard.artifact.tools import ToolFormat, ToolFormatError
from switchboard.common import tracing
from switchboard.common.breaker import LatencyBreaker
from switchboard.common.stream import CancelPoll
from switchboard.engine.sizing import compute_bound
from switchboard.repository.config import ChatConfig, admission_slots, pool_config
from switchboard.repository.versions import ModelVersion
from switchboard.serving.admission import Admission
from switchboard.serving.canary import VersionPicker, conversation_key
from switchboard.serving.engine_client import EngineClient
from switchboard.serving.fallback import FaqFallback
from switchboard.serving.gate import PriorityGate, send_rank
from switchboard.serving.metrics import ChatMetrics, called_tools, starts_conversation
from switchboard.serving.pool_health import PoolHealth
from switchboard.serving.pool_stream import EngineError, PoolStreams
from switchboard.serving.prompt import PromptBuilder
from switchboard.serving.request import ChatRequest, Limits, RequestError, parse_chat_request
from switchboard.serving.router import Router
from switchboard.serving.session import SessionStore, StoreConfig
from switchboard.serving.turn import Cancelled, ChatTurn
from switchboard.triton.chat_metrics import ChatMetricsPublisher
from switchboard.triton.common import (
    input_array,
    load_config,
    one_blas_thread,
    request_parameters,
    require_decoupled,
    send_error,
)
from switchboard.wire import TRACE_PARAMETER, Chat, ChatStats, FallbackReason, SessionStatus

log = logging.getLogger("switchboard.chat")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@dataclass
class _Job:
    request: object
    sender: object
    chat: ChatRequest
    t0: float
    version: int  # the pools' model version that serves it (VersionPicker)
    span: tracing.Span = tracing.NO_SPAN  # the chat's, ended with its final response (tracing.py)
    queued_ns: int = 0  # when it joined the admission queue (the ``admission`` span's start)


class TritonSink:
    """A turn's responses through the decoupled response sender, each through the send gate;
    the final one's stats handed to ``finished`` (metrics, the latency breaker)."""

    def __init__(self, sender, gate: PriorityGate, finished):
        self.sender, self.gate, self.finished = sender, gate, finished
        self._scored: list[dict] = []  # logprobs for the next response
        self.final_ns: int | None = None  # when the final response left (the chat's span ends then)
        self._tools: list[str] = []  # the names of the answer's calls, for the metrics

    def logprobs(self, entries: list[dict], priority: int) -> None:
        self._scored += entries

    def _logprobs_output(self) -> list:
        if not self._scored:
            return []
        blob = json.dumps(self._scored, ensure_ascii=False).encode("utf-8")
        self._scored = []
        return [pb_utils.Tensor(Chat.LOGPROBS_OUTPUT, np.asarray([[blob]], np.object_))]

    def text(self, delta: str, priority: int) -> None:
        out = pb_utils.Tensor(Chat.TEXT_OUTPUT, np.asarray([[delta.encode("utf-8")]], np.object_))
        with self.gate(send_rank(priority, final=False)):
            self.sender.send(pb_utils.InferenceResponse(output_tensors=[out, *self._logprobs_output()]))

    def tool_calls(self, deltas: list[dict], priority: int) -> None:
        self._tools += called_tools(deltas)
        blob = json.dumps(deltas, ensure_ascii=False).encode("utf-8")
        out = [
            pb_utils.Tensor(Chat.TEXT_OUTPUT, np.asarray([[b""]], np.object_)),
            pb_utils.Tensor(Chat.TOOL_CALLS, np.asarray([[blob]], np.object_)),
            *self._logprobs_output(),
        ]
        with self.gate(send_rank(priority, final=False)):
            self.sender.send(pb_utils.InferenceResponse(output_tensors=out))

    def final(self, stats: ChatStats, text: str, priority: int) -> None:
        """The last response: the rest of the text (if any) and ``stats``."""
        final = [
            pb_utils.Tensor(Chat.TEXT_OUTPUT, np.asarray([[text.encode("utf-8")]], np.object_)),
            pb_utils.Tensor(Chat.STATS, np.asarray([[stats.to_json().encode()]], np.object_)),
            *self._logprobs_output(),
        ]
        with self.gate(send_rank(priority, final=True)):
            self.final_ns = time.time_ns()
            self.sender.send(pb_utils.InferenceResponse(output_tensors=final), flags=FINAL)
        self.finished(stats, self._tools)


class TritonPythonModel:
    queue_timeout_s = ChatConfig.queue_timeout_s  # initialize sets the configured one

    def initialize(self, args):
        config, version = load_config(args)
        require_decoupled(config)
        one_blas_thread()
        tracing.configure(tracing.TraceSettings.from_env("chat"))
        cfg = ChatConfig.load(config, "chat/config.pbtxt")
        self.queue_timeout_s = cfg.queue_timeout_s
        self._load_model(version, cfg)
        self._setup_sessions(cfg)
        self._setup_pools(cfg)
        self._setup_fallback(cfg, version)
        self._setup_turn(cfg)
        self._setup_admission(cfg)
        self.publisher = ChatMetricsPublisher(
            self.metrics, self.admission, self.pool_health, (cfg.short_pool, cfg.long_pool), self.picker.versions
        )

    # -- initialize, step by step -----------------------------------------------------------
    def _load_model(self, version, cfg: ChatConfig) -> None:
        """The pools' model versions chat routes to (the stable one, and a canary during a
        rollout: switchboard/ops/rollout.py), each read from the short pool's version folder:
        prompts are built with that version's tokenizer and keyed by its fingerprint."""
        try:
            self.picker = VersionPicker(cfg.stable_version, cfg.canary_version, cfg.canary_share)
        except ValueError as e:
            raise ValueError(f"chat/config.pbtxt: {e}") from None
        repository = Path(version).parent.parent
        self.versions: dict[int, ModelVersion] = {}
        for n in self.picker.versions:
            folder = repository / cfg.short_pool / str(n)
            if not (folder / MANIFEST).is_file():
                raise FileNotFoundError(f"chat/config.pbtxt: model version {n} is not installed ({folder})")
            self.versions[n] = ModelVersion.load(folder, cfg.precision)
        self.limits = Limits(default_max_new_tokens=cfg.default_max_new_tokens, max_new_tokens=cfg.max_new_tokens_limit)

    def _setup_sessions(self, cfg: ChatConfig) -> None:
        store = StoreConfig(
            url=cfg.redis_url,
            ttl_s=cfg.session_ttl_s,
            timeout_s=cfg.redis_timeout_s,
            secret=cfg.session_secret.encode(),
            cluster=cfg.redis_cluster,
            tls_ca_file=cfg.redis_tls_ca_file,
            tls_cert_file=cfg.redis_tls_cert_file,
            tls_key_file=cfg.redis_tls_key_file,
        )
        self.sessions = SessionStore(store, self.versions[self.picker.stable].fingerprint)

    def _setup_pools(self, cfg: ChatConfig) -> None:
        # The pools are reached over gRPC on this server (switchboard/serving/engine_client.py says why).
        self.engines = EngineClient(cfg.engine_url)
        self.router = Router(cfg.long_prompt_tokens, cfg.short_pool, cfg.long_pool)
        # Per version: a canary whose stub died is routed around without touching the stable one.
        # A stream quiet for pool_probe_after_s makes chat ping its pool (PoolHealth says why).
        self.health: dict[int, PoolHealth] = {}
        self.pools: dict[int, PoolStreams] = {}
        for n, model in self.versions.items():
            self.health[n] = PoolHealth(
                cfg.pool_retry_after_s,
                ping=lambda pool, n=n: self.engines.ping(pool, max(2.0, cfg.pool_probe_after_s), version=n),
                probe_after_s=cfg.pool_probe_after_s,
            )
            self.pools[n] = PoolStreams(
                self.engines, self.health[n], model.fingerprint, cfg.engine_first_token_s, cfg.engine_stall_s, n
            )
        self.pool_health = self.health[self.picker.stable]
        self.cancel_poll_s = cfg.cancel_poll_ms / 1000

    def _setup_fallback(self, cfg: ChatConfig, version) -> None:
        self.faq = None
        if cfg.fallback:
            path = version / cfg.fallback_faq
            if not path.is_file():
                raise FileNotFoundError(
                    f"chat/config.pbtxt: parameter 'fallback_faq': {path} is missing "
                    "(make export installs corpus/faq.jsonl there; or set fallback=false)"
                )
            self.faq = FaqFallback.from_file(path)

    def _setup_turn(self, cfg: ChatConfig) -> None:
        self.turns: dict[int, ChatTurn] = {}
        for n, model in self.versions.items():
            tokenizer, manifest = TextTokenizer(model.directory), model.manifest
            system_prompt = cfg.system_prompt or manifest.system_prompt
            self.turns[n] = ChatTurn(
                prompts=PromptBuilder(tokenizer, system_prompt, cfg.max_turns, manifest.context_window),
                sessions=self.sessions.for_model(model.fingerprint),
                router=self.router,
                pools=self.pools[n],
                health=self.health[n],
                faq=self.faq,
                decode=tokenizer.decode,
                token_bytes=tokenizer.token_bytes,
                grammars=self._grammars(model.directory, manifest),
                tool_format=self._tool_format(tokenizer),
                stop_ids=set(manifest.eos_token_ids),
                end_of_turn_id=manifest.end_of_turn_id,
                kv_reuse=cfg.kv_reuse,
                version=n,
            )

    @staticmethod
    def _grammars(directory, manifest) -> Grammars | None:
        """JSON answers for this model (None: its tokenizer cannot drive them; such chats are refused)."""
        try:
            return Grammars(directory / "tokenizer.json", manifest.vocab_size, manifest.end_of_turn_id)
        except GrammarError as e:
            log.warning("%s", e)
            return None

    @staticmethod
    def _tool_format(tokenizer: TextTokenizer) -> ToolFormat | None:
        """How this model's template writes tool calls (None: it has no tool format; chats with
        tools are refused naming that)."""
        try:
            return ToolFormat.of(tokenizer.template)
        except ToolFormatError as e:
            log.info("tools: %s", e)
            return None

    def _setup_admission(self, cfg: ChatConfig) -> None:
        # Every response goes out through the gate, priority 1 first (PriorityGate, send_rank say why).
        self.gate = PriorityGate()
        self.metrics = ChatMetrics()
        self.breaker = None
        if cfg.breaker_ttft_p99_s > 0:
            self.breaker = LatencyBreaker(cfg.breaker_ttft_p99_s, cfg.breaker_window_s, cfg.breaker_min_samples)
        inflight, reserved = self._admission_slots(cfg)
        self.admission = Admission(
            max_inflight=inflight,
            reserved=reserved,
            max_pending=cfg.max_pending,
            max_wait_s=cfg.max_queue_wait_s,
            run=self._serve,
            shed=self._shed,
            shed_workers=cfg.shed_workers,
            forecast=cfg.shed_on_forecast,
            shed_nice=cfg.shed_nice,
            breaker=self.breaker.is_open if self.breaker else None,
        )

    def _admission_slots(self, cfg: ChatConfig) -> tuple[int, int]:
        """max_inflight and its reserved slots; automatic ones from the model's size and the
        pools' rows (their config.pbtxt beside this model's)."""
        stable = self.versions[self.picker.stable]
        pools = {}
        if not cfg.max_inflight:
            repository = Path(stable.directory).parent.parent
            pools = {name: pool_config(repository, name) for name in (cfg.short_pool, cfg.long_pool)}
        runtime = next(iter(pools.values())).runtime if pools else "onnxruntime"
        heavy = compute_bound(stable.variant.get("bytes", 0), runtime)
        inflight, reserved = admission_slots(cfg, heavy, sum(p.max_batch for p in pools.values()))
        log.info("admission: %d chats generating at once, %d of them for priority 1 only", inflight, reserved)
        return inflight, reserved

    # -- requests -------------------------------------------------------------------------
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            params = request_parameters(request)
            span = tracing.active().start("chat", tracing.extract(params.get(TRACE_PARAMETER)))
            try:
                inputs = {name: input_array(request, name) for name in Chat.INPUTS}
                chat = parse_chat_request(inputs, params, self.limits)
            except RequestError as e:
                send_error(sender, str(e), "INVALID_ARG")
                self.metrics.failed("invalid")
                tracing.end(span, str(e))
                continue
            held = self._wait_for_room(request) if chat.priority > 1 else None
            if held == "cancelled":
                send_error(sender, "cancelled by the client", "CANCELLED")
                self.metrics.abandoned("waiting")
                tracing.end(span, "cancelled")
                continue
            if held == "timeout":
                send_error(sender, "chat is overloaded; try again later", "UNAVAILABLE")
                self.metrics.failed("unavailable")
                tracing.end(span, "overloaded")
                continue
            version = self.picker.pick(conversation_key(chat.session_id, chat.history, chat.text))
            span.set_attribute("priority", chat.priority)
            job = _Job(request, sender, chat, time.perf_counter(), version, span, time.time_ns())
            self.admission.submit(job, chat.priority)
        return None

    def _wait_for_room(self, request) -> str | None:
        """Backpressure (``Admission.wait_for_room``): a priority-2 chat waits here, and the chats
        behind it in Triton's queue, at most ``queue_timeout_s``. None: room; "cancelled": the
        client left meanwhile; "timeout": still no room."""
        deadline = time.monotonic() + self.queue_timeout_s
        while not self.admission.wait_for_room(timeout=min(1.0, max(0.0, deadline - time.monotonic()))):
            if request.is_cancelled():
                return "cancelled"
            if time.monotonic() >= deadline:
                return "timeout"
        return None

    def _serve(self, job: _Job) -> None:
        request, sender = job.request, job.sender
        self._admitted(job, "admitted")
        if request.is_cancelled():
            send_error(sender, "cancelled by the client", "CANCELLED")
            self.metrics.abandoned("waiting", job.version)
            tracing.end(job.span, "cancelled")
            return
        error, sink = None, self._sink(job)
        try:
            cancelled = CancelPoll(request.is_cancelled, self.cancel_poll_s)
            with tracing.active().current(job.span):  # the turn's spans (Redis, the pool) are its children
                self.turns[job.version].run(job.chat, sink, cancelled, job.t0)
        except RequestError as e:
            send_error(sender, str(e), "INVALID_ARG")
            self.metrics.failed("invalid", job.version)
            error = str(e)
        except EngineError as e:
            send_error(sender, str(e), "UNAVAILABLE")
            self.metrics.failed("unavailable", job.version)
            error = str(e)
        except Cancelled:
            send_error(sender, "cancelled by the client", "CANCELLED")
            self.metrics.abandoned("answering", job.version)
            error = "cancelled"
        except Exception:
            log.exception("chat failed")
            send_error(sender, "internal error")
            self.metrics.failed("error", job.version)
            error = "internal error"
        finally:
            tracing.end(job.span, error, sink.final_ns)

    def _admitted(self, job: _Job, outcome: str) -> None:
        """The chat's wait in the admission queue, as a span ending now."""
        tracing.active().child("admission", job.span, start_ns=job.queued_ns, attributes={"outcome": outcome}).end()

    def _shed(self, job: _Job, reason: str) -> None:
        """No generation slot in time: answer from the FAQ. Not asked whether the client left
        (a round trip per answer, the FAQ's rate under a burst): a gone client drops the answer."""
        self._admitted(job, f"shed: {reason}")
        if self.faq is None or job.chat.must_generate:  # the FAQ's text would not match
            send_error(job.sender, f"overloaded ({reason}); try again later", "UNAVAILABLE")
            self.metrics.failed("unavailable", job.version)
            tracing.end(job.span, f"overloaded ({reason})")
        else:
            turn, sink = self.turns[job.version], self._sink(job)
            turn.answer_from_faq(job.chat, sink, job.t0, FallbackReason(reason), SessionStatus.SKIPPED)
            job.span.set_attribute("fallback", reason)
            tracing.end(job.span, end_ns=sink.final_ns)

    def _sink(self, job: _Job) -> TritonSink:
        return TritonSink(job.sender, self.gate, lambda stats, tools: self._finished(job.chat, stats, tools))

    def _finished(self, chat: ChatRequest, stats: ChatStats, tools: list[str]) -> None:
        """A chat's final response went out: count it; a generated answer's wait feeds the breaker."""
        self.metrics.chat(stats, tools, starts_conversation(chat.session_id, chat.history, stats.session))
        if self.breaker is not None and not stats.fallback and stats.ttft_ms is not None:
            self.breaker.observe(stats.ttft_ms / 1000)

    def finalize(self):
        self.admission.close()
        self.publisher.close()
        self.sessions.close()
        self.engines.close()
        tracing.active().shutdown()

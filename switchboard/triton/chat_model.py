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

import logging
import time
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard.artifact.manifest import Manifest
from switchboard.artifact.tokenizer import TextTokenizer
from switchboard.engine.stream import CancelPoll
from switchboard.serving.admission import Admission
from switchboard.serving.engine_client import EngineClient
from switchboard.serving.fallback import FaqFallback
from switchboard.serving.gate import PriorityGate, send_rank
from switchboard.serving.pool_health import PoolHealth
from switchboard.serving.pool_stream import EngineError, PoolStreams
from switchboard.serving.prompt import PromptBuilder
from switchboard.serving.request import ChatRequest, Limits, RequestError, parse_chat_request
from switchboard.serving.router import Router
from switchboard.serving.session import SessionStore, StoreConfig
from switchboard.serving.turn import Cancelled, ChatTurn
from switchboard.triton.common import input_array, load_config, request_parameters, require_decoupled, send_error
from switchboard.triton.params import Params
from switchboard.wire import ChatStats, FallbackReason, SessionStatus

log = logging.getLogger("switchboard.chat")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
INPUTS = ("text", "session_id", "max_new_tokens", "temperature", "top_p")


@dataclass
class _Job:
    request: object
    sender: object
    chat: ChatRequest
    t0: float


class TritonSink:
    """A turn's responses through the decoupled response sender, each through the send gate."""

    def __init__(self, sender, gate: PriorityGate):
        self.sender, self.gate = sender, gate

    def text(self, delta: str, priority: int) -> None:
        out = pb_utils.Tensor("text_output", np.asarray([[delta.encode("utf-8")]], np.object_))
        with self.gate(send_rank(priority, final=False)):
            self.sender.send(pb_utils.InferenceResponse(output_tensors=[out]))

    def final(self, stats: ChatStats, text: str, priority: int) -> None:
        """The last response: the rest of the text (if any) and ``stats``."""
        final = [
            pb_utils.Tensor("text_output", np.asarray([[text.encode("utf-8")]], np.object_)),
            pb_utils.Tensor("stats", np.asarray([[stats.to_json().encode()]], np.object_)),
        ]
        with self.gate(send_rank(priority, final=True)):
            self.sender.send(pb_utils.InferenceResponse(output_tensors=final), flags=FINAL)


class TritonPythonModel:
    def initialize(self, args):
        config, version = load_config(args)
        require_decoupled(config)
        params = Params(config, "chat/config.pbtxt")
        self._load_model(version, params)
        self._setup_sessions(params)
        self._setup_pools(params)
        self._setup_fallback(params, version)
        self._setup_turn(params)
        self._setup_admission(params)

    # -- initialize, step by step -----------------------------------------------------------
    def _load_model(self, version, params: Params) -> None:
        self.manifest = Manifest.load(version)
        self.fingerprint = self.manifest.variant(params.str("precision", "fp32"))["fingerprint"]
        self.tokenizer = TextTokenizer(version)
        system_prompt = params.str("system_prompt", self.manifest.system_prompt)
        self.prompts = PromptBuilder(
            self.tokenizer, system_prompt, params.int("max_turns", 6, 1, 64), self.manifest.context_window
        )
        self.limits = Limits(
            default_max_new_tokens=params.int("default_max_new_tokens", 96, 1, 4096),
            max_new_tokens=params.int("max_new_tokens_limit", 512, 1, 8192),
        )

    def _setup_sessions(self, params: Params) -> None:
        store = StoreConfig(
            url=params.str("redis_url", StoreConfig.url),
            ttl_s=params.int("session_ttl_s", 3600, 1),
            timeout_s=params.float("redis_timeout_s", 0.25, 0.001, 30),
            secret=(params.str("session_secret", "") or "").encode(),
            tls_ca_file=params.str("redis_tls_ca_file", ""),
            tls_cert_file=params.str("redis_tls_cert_file", ""),
            tls_key_file=params.str("redis_tls_key_file", ""),
        )
        self.sessions = SessionStore(store, self.fingerprint, self.manifest.kv_shape, np.dtype(self.manifest.kv_dtype))

    def _setup_pools(self, params: Params) -> None:
        # The pools are reached over gRPC on this server (switchboard/serving/engine_client.py says why).
        self.engines = EngineClient(params.str("engine_url", "127.0.0.1:8001"))
        self.router = Router(
            params.int("long_prompt_tokens", 160, 1),
            params.str("short_pool", "engine_short"),
            params.str("long_pool", "engine_long"),
        )
        # A stream quiet for pool_probe_after_s makes chat ping its pool (PoolHealth says why).
        probe_after_s = params.float("pool_probe_after_s", 1.0, 0.0, 600)
        self.pool_health = PoolHealth(
            params.float("pool_retry_after_s", 30.0, 0.1, 3600),
            ping=lambda pool: self.engines.ping(pool, max(2.0, probe_after_s)),
            probe_after_s=probe_after_s,
        )
        # How long a chat waits for its pool (queue + prefill, then between tokens).
        self.pools = PoolStreams(
            self.engines,
            self.pool_health,
            self.fingerprint,
            first_token_s=params.float("engine_first_token_s", 10.0, 0.1, 600),
            stall_s=params.float("engine_stall_s", 10.0, 0.1, 600),
        )
        self.cancel_poll_s = params.float("cancel_poll_ms", 50.0, 0.0, 10000) / 1000

    def _setup_fallback(self, params: Params, version) -> None:
        self.faq = None
        if params.bool("fallback", True):
            path = version / params.str("fallback_faq", "faq.jsonl")
            if not path.is_file():
                raise FileNotFoundError(
                    f"chat/config.pbtxt: parameter 'fallback_faq': {path} is missing "
                    "(make export installs corpus/faq.jsonl there; or set fallback=false)"
                )
            self.faq = FaqFallback.from_file(path)

    def _setup_turn(self, params: Params) -> None:
        self.turn = ChatTurn(
            prompts=self.prompts,
            sessions=self.sessions,
            router=self.router,
            pools=self.pools,
            health=self.pool_health,
            faq=self.faq,
            decode=self.tokenizer.decode,
            stop_ids=set(self.manifest.eos_token_ids),
            end_of_turn_id=self.manifest.end_of_turn_id,
            kv_reuse=params.bool("kv_reuse", True),
        )

    def _setup_admission(self, params: Params) -> None:
        # Every response goes out through the gate, priority 1 first (PriorityGate, send_rank say why).
        self.gate = PriorityGate()
        self.admission = Admission(
            max_inflight=params.int("max_inflight", 64, 1, 1024),
            reserved=params.int("max_inflight_reserved", 16, 0, 1024),
            max_pending=params.int("max_pending", 1024, 0, 1 << 20),
            max_wait_s=params.float("max_queue_wait_s", 5.0, 0.0, 600),
            run=self._serve,
            shed=self._shed,
            shed_workers=params.int("shed_workers", 8, 1, 256),
            forecast=params.bool("shed_on_forecast", True),
            shed_nice=params.int("shed_nice", 19, 0, 19),
        )

    # -- requests -------------------------------------------------------------------------
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs = {name: input_array(request, name) for name in INPUTS}
                chat = parse_chat_request(inputs, request_parameters(request), self.limits)
            except RequestError as e:
                send_error(sender, str(e), "INVALID_ARG")
                continue
            if chat.priority > 1 and not self._wait_for_room(request):
                send_error(sender, "cancelled by the client", "CANCELLED")
                continue
            self.admission.submit(_Job(request, sender, chat, time.perf_counter()), chat.priority)
        return None

    def _wait_for_room(self, request) -> bool:
        """Backpressure (``Admission.wait_for_room``): a priority-2 chat waits here, and the chats
        behind it in Triton's queue, which refuses them when full or timed out without costing this
        stub a round trip. False: the client left meanwhile."""
        while not self.admission.wait_for_room(timeout=1.0):
            if request.is_cancelled():
                return False
        return True

    def _serve(self, job: _Job) -> None:
        request, sender = job.request, job.sender
        try:
            if request.is_cancelled():
                raise Cancelled()
            cancelled = CancelPoll(request.is_cancelled, self.cancel_poll_s)
            self.turn.run(job.chat, TritonSink(sender, self.gate), cancelled, job.t0)
        except RequestError as e:
            send_error(sender, str(e), "INVALID_ARG")
        except EngineError as e:
            send_error(sender, str(e), "UNAVAILABLE")
        except Cancelled:
            send_error(sender, "cancelled by the client", "CANCELLED")
        except Exception:
            log.exception("chat failed")
            send_error(sender, "internal error")

    def _shed(self, job: _Job, reason: str) -> None:
        """No generation slot in time: answer from the FAQ. Not asked whether the client left
        (a round trip per answer, the FAQ's rate under a burst): a gone client drops the answer."""
        if self.faq is None:
            send_error(job.sender, f"overloaded ({reason}); try again later", "UNAVAILABLE")
        else:
            sink = TritonSink(job.sender, self.gate)
            self.turn.answer_from_faq(job.chat, sink, job.t0, FallbackReason(reason), SessionStatus.SKIPPED)

    def finalize(self):
        self.admission.close()
        self.sessions.close()
        self.engines.close()

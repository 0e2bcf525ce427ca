"""Triton glue for ``chat``, the public, streaming entry model.

Per request: validate; load the session from Redis; build the prompt (chat template, sliding
window, append-only tokens); reuse the cached KV of the longest common prefix; route by length
to a pool; stream the pool's tokens back as UTF-8 text deltas; store the session with a TTL;
end with a response carrying ``stats``.

``execute`` validates and hands each request to ``Admission`` (switchboard/admission.py): at
most ``max_inflight`` chats generate at once, the rest wait by priority for at most
``max_queue_wait_s`` (a priority-2 chat that would wait longer is answered at once). A chat
that cannot get a slot in time, or whose pool rejects, times out or fails before the first text
was sent, is answered from the FAQ (``"fallback": true``).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard.admission import Admission, PoolHealth, PriorityGate, send_rank
from switchboard.detok import IncrementalDetokenizer
from switchboard.engine.stream import CancelPoll
from switchboard.engine_client import EngineClient, EngineStream, build_request, stub_dead
from switchboard.fallback import FaqFallback
from switchboard.kvcodec import KVEntry
from switchboard.manifest import Manifest
from switchboard.params import Params
from switchboard.prompt import PromptBuilder, PromptTooLong
from switchboard.request import Limits, RequestError, Router, longest_common_prefix, parse_chat_request
from switchboard.session import Lookup, SessionStore, StoreConfig
from switchboard.status import untag
from switchboard.tokenizer import TextTokenizer
from switchboard.triton.common import input_array, load_config, request_parameters, require_decoupled, send_error

log = logging.getLogger("switchboard.chat")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
INPUTS = ("text", "session_id", "max_new_tokens", "temperature", "top_p")


class EngineError(RuntimeError):
    pass


class EngineTimeout(EngineError):
    pass


class Cancelled(RuntimeError):
    pass


@dataclass
class _Job:
    request: object
    sender: object
    chat: object
    t0: float


class TritonPythonModel:
    def initialize(self, args):
        config, version = load_config(args)
        require_decoupled(config)
        params = Params(config, "chat/config.pbtxt")
        self._load_model(version, params)
        self._setup_sessions(params)
        self._setup_routing(params)
        self._setup_fallback(params, version)
        self._setup_admission(params)

    # -- initialize, step by step -----------------------------------------------------------
    def _load_model(self, version, params: Params) -> None:
        self.manifest = Manifest.load(version)
        self.precision = params.str("precision", "fp32")
        self.fingerprint = self.manifest.variant(self.precision)["fingerprint"]
        self.tokenizer = TextTokenizer(version)
        system_prompt = params.str("system_prompt", self.manifest.system_prompt)
        self.prompts = PromptBuilder(self.tokenizer, system_prompt, params.int("max_turns", 6, 1, 64),
                                     self.manifest.context_window)
        self.limits = Limits(default_max_new_tokens=params.int("default_max_new_tokens", 96, 1, 4096),
                             max_new_tokens=params.int("max_new_tokens_limit", 512, 1, 8192))
        self.stop_ids = set(self.manifest.eos_token_ids)

    def _setup_sessions(self, params: Params) -> None:
        self.kv_reuse = params.bool("kv_reuse", True)
        store = StoreConfig(url=params.str("redis_url", StoreConfig.url), ttl_s=params.int("session_ttl_s", 3600, 1),
                            timeout_s=params.float("redis_timeout_s", 0.25, 0.001, 30),
                            secret=(params.str("session_secret", "") or "").encode(),
                            tls_ca_file=params.str("redis_tls_ca_file", ""),
                            tls_cert_file=params.str("redis_tls_cert_file", ""),
                            tls_key_file=params.str("redis_tls_key_file", ""))
        self.sessions = SessionStore(store, self.fingerprint, self.manifest.kv_shape, np.dtype(self.manifest.kv_dtype))

    def _setup_routing(self, params: Params) -> None:
        # The pools are reached over gRPC on this server (switchboard/engine_client.py says why).
        self.engines = EngineClient(params.str("engine_url", "127.0.0.1:8001"))
        self.router = Router(params.int("long_prompt_tokens", 160, 1),
                             params.str("short_pool", "engine_short"), params.str("long_pool", "engine_long"))

    def _setup_fallback(self, params: Params, version) -> None:
        self.fallback_enabled = params.bool("fallback", True)
        self.faq = None
        if self.fallback_enabled:
            path = version / params.str("fallback_faq", "faq.jsonl")
            if not path.is_file():
                raise FileNotFoundError(f"chat/config.pbtxt: parameter 'fallback_faq': {path} is missing "
                                        "(make export installs corpus/faq.jsonl there; or set fallback=false)")
            self.faq = FaqFallback.from_file(path)
        # How long a chat waits for its pool (queue + prefill, then between tokens).
        self.first_token_s = params.float("engine_first_token_s", 10.0, 0.1, 600)
        self.stall_s = params.float("engine_stall_s", 10.0, 0.1, 600)
        self.cancel_poll_s = params.float("cancel_poll_ms", 50.0, 0.0, 10000) / 1000
        # A stream quiet for pool_probe_after_s makes chat ping its pool (PoolHealth says why).
        probe_after_s = params.float("pool_probe_after_s", 1.0, 0.0, 600)
        self.pool_health = PoolHealth(params.float("pool_retry_after_s", 30.0, 0.1, 3600),
                                      ping=lambda pool: self.engines.ping(pool, max(2.0, probe_after_s)),
                                      probe_after_s=probe_after_s)

    def _setup_admission(self, params: Params) -> None:
        # Every response goes out through the gate, priority 1 first (PriorityGate, send_rank say why).
        self.gate = PriorityGate()
        self.admission = Admission(max_inflight=params.int("max_inflight", 64, 1, 1024),
                                   reserved=params.int("max_inflight_reserved", 16, 0, 1024),
                                   max_pending=params.int("max_pending", 1024, 0, 1 << 20),
                                   max_wait_s=params.float("max_queue_wait_s", 5.0, 0.0, 600),
                                   run=self._serve, shed=self._shed,
                                   shed_workers=params.int("shed_workers", 8, 1, 256),
                                   forecast=params.bool("shed_on_forecast", True),
                                   shed_nice=params.int("shed_nice", 19, 0, 19))

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
        request, sender, chat = job.request, job.sender, job.chat
        try:
            if request.is_cancelled():
                raise Cancelled()
            self._chat(request, sender, chat, job.t0)
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
            self._answer_from_faq(job.sender, job.chat, job.t0, reason, {"session": "skipped"})

    def _answer_from_faq(self, sender, chat, t0: float, reason: str, extra: dict) -> None:
        answer = self.faq.answer(chat.text)
        stats = {"prompt_tokens": 0, "reused_tokens": 0, "generated_tokens": 0, "route": None, "ttft_ms": None,
                 "total_ms": None, "fallback": True, "fallback_reason": reason, "faq_id": answer.entry_id,
                 "session": "none", "dropped_turns": 0, "finish_reason": "fallback", "engine_queue_ms": None,
                 "engine_ms": None, "batch_size": None, "priority": chat.priority, **extra}
        stats["total_ms"] = round((time.perf_counter() - t0) * 1000, 2)
        self._send_final(sender, stats, answer.text)

    def _chat(self, request, sender, chat, t0: float) -> None:
        lookup = self.sessions.load(chat.session_id, want_kv=self.kv_reuse) if chat.session_id else Lookup()
        try:
            prompt = self.prompts.build(lookup.conversation, chat.text, chat.max_new_tokens)
        except PromptTooLong as e:
            raise RequestError(str(e)) from None
        reused, past = 0, None
        if lookup.kv is not None:
            reused = min(longest_common_prefix(lookup.kv.tokens, prompt.ids), len(prompt.ids) - 1)
            if reused:
                past = np.ascontiguousarray(lookup.kv.kv[:, :, :, :reused])
        route, pool = self.router.route(len(prompt.ids))
        other = self.router.long_pool if pool == self.router.short_pool else self.router.short_pool

        detok = IncrementalDetokenizer(self.tokenizer.decode)
        generated: list[int] = []
        ttft_ms, cache, engine_stats = None, None, {}
        cancelled = CancelPoll(request.is_cancelled, self.cancel_poll_s)
        # A pool that fails before anything was sent is retried on the other pool (both serve
        # every length); when both fail or time out, the customer gets the FAQ answer.
        for attempt, pool in enumerate(self.pool_health.order(pool, other)):
            try:
                for response in self._generate(pool, prompt, past, chat):
                    if cancelled():
                        raise Cancelled()  # nothing is stored for a turn the customer never saw
                    ids = response.get("token_ids")
                    if ids is not None:
                        generated.extend(ids)
                        delta = detok.add([t for t in ids if t not in self.stop_ids])
                        if delta:
                            ttft_ms = ttft_ms if ttft_ms is not None else (time.perf_counter() - t0) * 1000
                            self._send_text(sender, delta, chat.priority)
                    cache = response.get("kv", cache)
                    engine_stats = response.get("stats", engine_stats)
                break
            except EngineError as e:
                if generated:
                    raise  # text already streamed: an error, not a second answer
                log.warning("%s", e)
                timed_out = isinstance(e, EngineTimeout)
                if not timed_out and stub_dead(str(e)):
                    self.pool_health.failed(pool)  # the stub died; Triton 2.51 does not restart it
                if timed_out or attempt == 1:
                    if self.faq is None:
                        raise
                    reason = "engine_timeout" if timed_out else "engine_error"
                    return self._answer_from_faq(sender, chat, t0, reason, {
                        "session": lookup.status if chat.session_id else "none", "prompt_tokens": len(prompt.ids)})
        route = "short" if pool == self.router.short_pool else "long"
        tail = detok.flush()

        if chat.session_id:
            conversation = self.prompts.after_answer(prompt, generated, detok.text, self.manifest.end_of_turn_id)
            entry = None
            if cache is not None:
                covered = prompt.ids + generated[:-1]
                if cache.shape[3] == len(covered):
                    entry = KVEntry(covered, cache)
            self.sessions.save(chat.session_id, conversation, entry)
        stats = {
            "prompt_tokens": len(prompt.ids), "reused_tokens": reused, "generated_tokens": len(generated),
            "route": route, "ttft_ms": round(ttft_ms, 2) if ttft_ms is not None else None,
            "total_ms": round((time.perf_counter() - t0) * 1000, 2), "fallback": False,
            "session": lookup.status if chat.session_id else "none", "dropped_turns": prompt.dropped_turns,
            "finish_reason": engine_stats.get("reason"), "engine_queue_ms": engine_stats.get("queue_ms"),
            "engine_ms": engine_stats.get("engine_ms"), "batch_size": engine_stats.get("batch_size"),
            "priority": chat.priority,
        }
        self._send_final(sender, stats, tail)

    def _send_final(self, sender, stats: dict, text: str = "") -> None:
        """The last response: the rest of the text (if any) and ``stats``."""
        final = [pb_utils.Tensor("text_output", np.asarray([[text.encode("utf-8")]], np.object_)),
                 pb_utils.Tensor("stats", np.asarray([[json.dumps(stats).encode()]], np.object_))]
        with self.gate(send_rank(stats["priority"], final=True)):
            sender.send(pb_utils.InferenceResponse(output_tensors=final), flags=FINAL)

    def _generate(self, pool: str, prompt, past, chat):
        """Stream the pool's responses as dicts of outputs, each within its deadline."""
        inputs = {"input_ids": np.asarray([prompt.ids], np.int32),
                  "max_new_tokens": np.asarray([[prompt.max_new_tokens]], np.int32),
                  "temperature": np.asarray([[chat.temperature]], np.float32),
                  "top_p": np.asarray([[chat.top_p]], np.float32)}
        if past is not None:
            inputs["past_kv"] = past[None]
        parameters = {"chat_priority": chat.priority, "fingerprint": self.fingerprint,
                      "return_kv": bool(chat.session_id and self.kv_reuse)}
        if chat.seed is not None:
            parameters["seed"] = chat.seed
        # Triton's queue orders the pool's requests by `priority` and rejects one it could not
        # start within `timeout`; the engine orders its batch by `chat_priority`.
        request = build_request(pool, inputs, ["token_ids", "kv", "stats"], parameters, priority=chat.priority,
                                timeout_us=int(self.first_token_s * 1e6))
        # Responses that queued while this chat waited for its turn to send go out as one.
        for responses in self._bounded(pool, self.engines.stream(request)):
            merged: dict = {}
            for response in responses:
                for name, array in response.items():
                    if name == "token_ids":
                        merged.setdefault(name, []).extend(array.reshape(-1).tolist())
                    elif name == "kv":
                        merged[name] = array.reshape(array.shape[-5:])
                    elif name == "stats":
                        merged[name] = json.loads(array.reshape(-1)[0])
            yield merged

    def _bounded(self, pool: str, stream: EngineStream):
        """The stream in batches: every response that has arrived (at least one). Read on a
        helper thread so that a pool that never answers (its stub died mid-request: Triton 2.51
        then never completes the request) costs a timeout, not a hung chat. A stream this chat
        leaves (timeout, error, its client gone) is cancelled, and with it the pool's request.
        Once another chat finds the pool's stub dead, this stream ends at once (``PoolHealth``)."""
        responses: queue.Queue = queue.Queue()

        def pump():
            try:
                for response in stream:
                    responses.put(response)
            except Exception as e:  # surfaced to the chat as an engine error
                responses.put(e)
            responses.put(None)

        def dead():
            responses.put(RuntimeError("its stub process died while this chat streamed from it"))

        threading.Thread(target=pump, name=f"engine-{pool}", daemon=True).start()
        first, finished = True, False
        with self.pool_health.watching(pool, dead):
            try:
                while True:
                    wait = self.first_token_s if first else self.stall_s
                    try:
                        batch = [self._next(responses, pool, wait)]
                    except queue.Empty:
                        what = "no first response" if first else "stream stalled"
                        raise EngineTimeout(f"{pool}: {what} within {wait:g} s") from None
                    while batch[-1] is not None and not isinstance(batch[-1], Exception) and not responses.empty():
                        batch.append(responses.get_nowait())
                    end = batch[-1] is None
                    if end:
                        batch.pop()
                    if batch and isinstance(batch[-1], Exception):
                        raise EngineError(f"{pool}: {untag(str(batch[-1]))[1]}")
                    if batch:
                        yield batch
                    if end:
                        finished = True
                        return
                    first = False
            finally:
                if not finished:
                    stream.cancel()

    def _next(self, responses: queue.Queue, pool: str, wait: float):
        """``responses.get(timeout=wait)``, telling ``pool_health`` each time the stream has been
        quiet for ``pool_probe_after_s`` (it may ping the pool)."""
        deadline = time.monotonic() + wait
        step = self.pool_health.probe_after_s or wait
        while (left := deadline - time.monotonic()) > step:
            try:
                return responses.get(timeout=step)
            except queue.Empty:
                self.pool_health.quiet(pool)
        return responses.get(timeout=max(0.0, left))

    def _send_text(self, sender, text: str, priority: int) -> None:
        out = pb_utils.Tensor("text_output", np.asarray([[text.encode("utf-8")]], np.object_))
        with self.gate(send_rank(priority, final=False)):
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))

    def finalize(self):
        self.admission.close()
        self.sessions.close()
        self.engines.close()

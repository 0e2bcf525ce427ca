"""Triton glue for ``chat``, the public, streaming entry model.

Per request: validate; load the session from Redis; build the prompt (chat template, sliding
window, append-only tokens); reuse the cached KV of the longest common prefix; route by length
to a pool; stream the pool's tokens back as UTF-8 text deltas; store the session with a TTL;
end with a response carrying ``stats``.

``execute`` admits at most ``max_inflight`` requests at a time and waits for a free slot
otherwise, so excess load queues in front of this model, where Triton orders it by request
priority and applies the queue policy.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard.detok import IncrementalDetokenizer
from switchboard.kvcodec import KVEntry
from switchboard.manifest import Manifest
from switchboard.params import Params
from switchboard.prompt import PromptBuilder, PromptTooLong
from switchboard.request import Limits, RequestError, Router, longest_common_prefix, parse_chat_request
from switchboard.session import Lookup, SessionStore, StoreConfig
from switchboard.tokenizer import TextTokenizer
from switchboard.triton.common import input_array, load_config, request_parameters, require_decoupled, send_error

log = logging.getLogger("switchboard.chat")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
INPUTS = ("text", "session_id", "max_new_tokens", "temperature", "top_p")


class EngineError(RuntimeError):
    pass


class Cancelled(RuntimeError):
    pass


class TritonPythonModel:
    def initialize(self, args):
        config, version = load_config(args)
        require_decoupled(config)
        params = Params(config, "chat/config.pbtxt")
        self._load_model(version, params)
        self._setup_sessions(params)
        self._setup_routing(params)
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
                            secret=(params.str("session_secret", "") or "").encode())
        self.sessions = SessionStore(store, self.fingerprint, self.manifest.kv_shape, np.dtype(self.manifest.kv_dtype))

    def _setup_routing(self, params: Params) -> None:
        self.router = Router(params.int("long_prompt_tokens", 160, 1),
                             params.str("short_pool", "engine_short"), params.str("long_pool", "engine_long"))

    def _setup_admission(self, params: Params) -> None:
        inflight = params.int("max_inflight", 64, 1, 1024)
        self._slots = threading.BoundedSemaphore(inflight)
        self._pool = ThreadPoolExecutor(max_workers=inflight, thread_name_prefix="chat")

    # -- requests -------------------------------------------------------------------------
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs = {name: input_array(request, name) for name in INPUTS}
                chat = parse_chat_request(inputs, request_parameters(request), self.limits)
            except RequestError as e:
                send_error(sender, str(e), pb_utils.TritonError.INVALID_ARG)
                continue
            self._slots.acquire()
            self._pool.submit(self._serve, request, sender, chat)
        return None

    def _serve(self, request, sender, chat) -> None:
        try:
            self._chat(request, sender, chat)
        except RequestError as e:
            send_error(sender, str(e), pb_utils.TritonError.INVALID_ARG)
        except EngineError as e:
            send_error(sender, str(e), pb_utils.TritonError.UNAVAILABLE)
        except Cancelled:
            send_error(sender, "cancelled by the client", pb_utils.TritonError.CANCELLED)
        except Exception:
            log.exception("chat failed")
            send_error(sender, "internal error")
        finally:
            self._slots.release()

    def _chat(self, request, sender, chat) -> None:
        t0 = time.perf_counter()
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

        detok = IncrementalDetokenizer(self.tokenizer.decode)
        generated: list[int] = []
        ttft_ms, cache, engine_stats = None, None, {}
        for response in self._generate(pool, prompt, past, chat):
            if request.is_cancelled():
                raise Cancelled()  # nothing is stored for a turn the customer never saw
            ids = response.get("token_ids")
            if ids is not None:
                generated.extend(ids)
                delta = detok.add([t for t in ids if t not in self.stop_ids])
                if delta:
                    ttft_ms = ttft_ms if ttft_ms is not None else (time.perf_counter() - t0) * 1000
                    self._send_text(sender, delta)
            cache = response.get("kv", cache)
            engine_stats = response.get("stats", engine_stats)
        tail = detok.flush()
        if tail:
            self._send_text(sender, tail)

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
            "batch_size": engine_stats.get("batch_size"), "priority": chat.priority,
        }
        final = [pb_utils.Tensor("text_output", np.asarray([[b""]], np.object_)),
                 pb_utils.Tensor("stats", np.asarray([[json.dumps(stats).encode()]], np.object_))]
        sender.send(pb_utils.InferenceResponse(output_tensors=final), flags=FINAL)

    def _generate(self, pool: str, prompt, past, chat):
        """Stream the pool's responses as dicts of numpy outputs."""
        inputs = [pb_utils.Tensor("input_ids", np.asarray([prompt.ids], np.int32)),
                  pb_utils.Tensor("max_new_tokens", np.asarray([[prompt.max_new_tokens]], np.int32)),
                  pb_utils.Tensor("temperature", np.asarray([[chat.temperature]], np.float32)),
                  pb_utils.Tensor("top_p", np.asarray([[chat.top_p]], np.float32))]
        if past is not None:
            inputs.append(pb_utils.Tensor("past_kv", past[None]))
        parameters = {"priority": chat.priority, "fingerprint": self.fingerprint,
                      "return_kv": bool(chat.session_id and self.kv_reuse)}
        if chat.seed is not None:
            parameters["seed"] = chat.seed
        bls = pb_utils.InferenceRequest(model_name=pool, inputs=inputs, parameters=parameters,
                                        requested_output_names=["token_ids", "kv", "stats"])
        for response in bls.exec(decoupled=True):
            if response.has_error():
                raise EngineError(f"{pool}: {response.error().message()}")
            out = {}
            for name in ("token_ids", "kv", "stats"):
                tensor = pb_utils.get_output_tensor_by_name(response, name)
                if tensor is None:
                    continue
                array = tensor.as_numpy()
                if name == "token_ids":
                    out[name] = array.reshape(-1).tolist()
                elif name == "kv":
                    out[name] = array.reshape(array.shape[-5:])
                else:
                    out[name] = json.loads(array.reshape(-1)[0])
            yield out

    @staticmethod
    def _send_text(sender, text: str) -> None:
        out = pb_utils.Tensor("text_output", np.asarray([[text.encode("utf-8")]], np.object_))
        sender.send(pb_utils.InferenceResponse(output_tensors=[out]))

    def finalize(self):
        self._pool.shutdown(wait=True, cancel_futures=False)
        self.sessions.close()

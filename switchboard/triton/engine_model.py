"""Triton glue for a generation pool (``engine_short``, ``engine_long``).

Requests come from ``chat`` over BLS: prompt ids, the cached KV of the prompt's prefix,
sampling settings, and (as request parameters) the priority and the model fingerprint the
cache was written with. ``execute`` hands them to the engine's scheduler and returns; the
engine thread streams one response per token and a final one with the KV cache and stats.
When the engine's own queue is full, ``execute`` waits, so the overflow stays in Triton's
queue where the pool's queue policy (timeouts, maximum size) applies.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard.engine.runtime import OnnxDecoder
from switchboard.engine.scheduler import Engine, GenerationRequest, GenerationResult
from switchboard.manifest import Manifest
from switchboard.params import Params
from switchboard.triton.common import input_array, load_config, request_parameters, require_decoupled, send_error

log = logging.getLogger("switchboard.engine")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _Sink:
    def __init__(self, request, sender):
        self.request = request
        self.sender = sender

    def on_tokens(self, ids: list[int]) -> None:
        out = pb_utils.Tensor("token_ids", np.asarray([ids], np.int32))
        self.sender.send(pb_utils.InferenceResponse(output_tensors=[out]))

    def on_finish(self, result: GenerationResult) -> None:
        stats = {"reason": result.reason, "generated": len(result.tokens), "queue_ms": round(result.queue_ms, 2),
                 "prefill_ms": round(result.prefill_ms, 2), "batch_size": result.batch_size_at_admission}
        outputs = [pb_utils.Tensor("stats", np.asarray([[json.dumps(stats).encode()]], np.object_))]
        if result.cache is not None:
            outputs.append(pb_utils.Tensor("kv", result.cache[None]))
        self.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL)

    def on_error(self, error: Exception) -> None:
        send_error(self.sender, f"generation failed: {error.__class__.__name__}")

    def cancelled(self) -> bool:
        return self.request.is_cancelled()


class TritonPythonModel:
    def initialize(self, args):
        config, version = load_config(args)
        require_decoupled(config)
        self.name = config["name"]
        params = Params(config, f"{self.name}/config.pbtxt")
        self.manifest = Manifest.load(version)
        precision = params.str("precision", "fp32")
        self.fingerprint = self.manifest.variant(precision)["fingerprint"]
        runtime = params.str("runtime", "onnxruntime")
        if runtime == "onnxruntime":
            decoder = OnnxDecoder(version, self.manifest, precision, threads=params.int("threads", 2, 1, 64))
        elif runtime.startswith("triton:"):  # NVIDIA's container: native backend on the GPU
            from switchboard.triton.bls_decoder import BlsDecoder

            decoder = BlsDecoder(runtime.split(":", 1)[1], self.manifest)
        else:
            raise ValueError(f"{self.name}/config.pbtxt: parameter 'runtime' = {runtime!r}: "
                             "expected onnxruntime or triton:<model>")
        self.engine = Engine(decoder, max_batch=params.int("max_batch", 8, 1, 256),
                             max_waiting=params.int("max_waiting", 32, 1, 4096),
                             stop_ids=set(self.manifest.eos_token_ids))
        self.engine.start()
        log.info("%s ready: %s %s, max batch %d", self.name, self.manifest.name, precision, self.engine.max_batch)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                req = self._parse(request)
                self.engine.validate(req)
            except ValueError as e:
                send_error(sender, f"{self.name}: {e}", pb_utils.TritonError.INVALID_ARG)
                continue
            while not self.engine.wait_for_room(timeout=1.0):
                if request.is_cancelled():
                    break
            if request.is_cancelled():
                send_error(sender, "cancelled", pb_utils.TritonError.CANCELLED)
                continue
            self.engine.submit(req, _Sink(request, sender))
        return None

    def _parse(self, request) -> GenerationRequest:
        params = request_parameters(request)
        ids = input_array(request, "input_ids")
        if ids is None:
            raise ValueError("input_ids is required")
        prompt = ids.reshape(-1).astype(np.int64).tolist()
        if any(t < 0 or t >= self.manifest.vocab_size for t in prompt):
            raise ValueError("input_ids: token id out of range")
        reused, past = 0, input_array(request, "past_kv")
        if past is not None and past.size:
            if params.get("fingerprint") != self.fingerprint:
                raise ValueError("past_kv was written by another model variant")
            past = past.reshape(past.shape[-5:])
            reused = int(past.shape[3])

        def scalar(name, default, kind):
            a = input_array(request, name)
            return default if a is None else kind(a.reshape(-1)[0])

        return GenerationRequest(
            prompt=prompt, reused=reused, past=past,
            max_new_tokens=scalar("max_new_tokens", 64, int),
            temperature=scalar("temperature", 0.0, float), top_p=scalar("top_p", 1.0, float),
            priority=int(params.get("priority", 2)), seed=params.get("seed"),
            return_cache=bool(params.get("return_kv", False)) and params.get("fingerprint") == self.fingerprint,
        )

    def finalize(self):
        self.engine.stop()

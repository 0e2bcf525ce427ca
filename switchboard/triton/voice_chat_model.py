"""Triton glue for ``voice_chat``: audio in, the chat's streamed answer out.

Each request runs on a thread of its own (``VoiceTurn``, switchboard/serving/voice.py: ``asr``
then ``chat`` over this server's gRPC); at most ``max_inflight`` at once, the rest wait in
Triton's queue under the model's queue policy. Answered voice turns are counted
(``VoiceMetrics``: ``switchboard_voice_*``, docs/metrics.md) and published once a second with the
trace spans dropped (voice_metrics.py).
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard.common import tracing
from switchboard.common.stream import CancelPoll
from switchboard.repository.config import VoiceChatConfig
from switchboard.serving.engine_client import EngineClient
from switchboard.serving.voice import VoiceError, VoiceMetrics, VoiceRequest, VoiceTurn
from switchboard.triton.common import (
    input_array,
    load_config,
    one_blas_thread,
    request_parameters,
    require_decoupled,
    send_error,
)
from switchboard.triton.voice_metrics import VoiceMetricsPublisher
from switchboard.wire import PRIORITY_DEFAULT, PRIORITY_PARAMETER, TRACE_PARAMETER, Pool, VoiceChat

log = logging.getLogger("switchboard.voice_chat")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _text(name: str, value: str) -> pb_utils.Tensor:
    return pb_utils.Tensor(name, np.asarray([[value.encode("utf-8")]], np.object_))


class TritonSink:
    def __init__(self, sender):
        self.sender = sender

    def transcript(self, asr: dict) -> None:
        out = [_text(VoiceChat.TEXT_OUTPUT, ""), _text(VoiceChat.STATS, json.dumps(asr))]
        self.sender.send(pb_utils.InferenceResponse(output_tensors=out))

    def text(self, delta: str) -> None:
        self.sender.send(pb_utils.InferenceResponse(output_tensors=[_text(VoiceChat.TEXT_OUTPUT, delta)]))

    def final(self, text: str, stats_json: str) -> None:
        out = [_text(VoiceChat.TEXT_OUTPUT, text), _text(VoiceChat.STATS, stats_json)]
        self.sender.send(pb_utils.InferenceResponse(output_tensors=out), flags=FINAL)


def _audio(request) -> bytes | None:
    value = input_array(request, VoiceChat.AUDIO)
    if value is None or value.size != 1 or not isinstance(value.reshape(-1)[0], bytes):
        return None
    return value.reshape(-1)[0]


def _language(request) -> str | None:
    value = input_array(request, VoiceChat.LANGUAGE)
    if value is None or value.size == 0:
        return None
    return value.reshape(-1)[0].decode("utf-8", "replace").strip().lower() or None


class TritonPythonModel:
    def initialize(self, args):
        config, _ = load_config(args)
        require_decoupled(config)
        one_blas_thread()
        tracing.configure(tracing.TraceSettings.from_env("voice_chat"))
        cfg = VoiceChatConfig.load(config, "voice_chat/config.pbtxt")
        self.client = EngineClient(cfg.engine_url)
        self.metrics = VoiceMetrics()
        self.turn = VoiceTurn(self.client, cfg.asr_model, cfg.chat_model, cfg.asr_timeout_s, self.metrics)
        self.publisher = VoiceMetricsPublisher(self.metrics)
        self.slots = threading.BoundedSemaphore(cfg.max_inflight)
        self.pool = ThreadPoolExecutor(cfg.max_inflight, thread_name_prefix="voice")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            audio = _audio(request)
            if audio is None:
                send_error(sender, "audio: expected one audio file as bytes", "INVALID_ARG")
                continue
            params = request_parameters(request)
            priority = params.get(PRIORITY_PARAMETER, PRIORITY_DEFAULT)
            priority = priority if priority in (1, 2) else PRIORITY_DEFAULT
            passed = {PRIORITY_PARAMETER: priority}
            if isinstance(params.get(Pool.SEED), int):
                passed[Pool.SEED] = params[Pool.SEED]
            # the turn's span (docs/tracing.md): asr's and chat's join it
            span = tracing.active().start("voice_chat", tracing.extract(params.get(TRACE_PARAMETER)))
            if traceparent := tracing.inject(span):
                passed[TRACE_PARAMETER] = traceparent
            chat_inputs = {}
            for name in VoiceChat.INPUTS[2:]:
                value = input_array(request, name)
                if value is not None:
                    chat_inputs[name] = value
            voice = VoiceRequest(audio, _language(request), chat_inputs, priority, passed)
            self.slots.acquire()  # backpressure: the rest wait in Triton's queue
            self.pool.submit(self._serve, request, sender, voice, span)
        return None

    def _serve(self, request, sender, voice: VoiceRequest, span=tracing.NO_SPAN) -> None:
        error = None
        try:
            self.turn.run(voice, TritonSink(sender), CancelPoll(request.is_cancelled, 0.05))
        except VoiceError as e:
            send_error(sender, str(e), e.code)
            error = str(e)
        except Exception:
            log.exception("voice chat failed")
            send_error(sender, "internal error")
            error = "internal error"
        finally:
            self.slots.release()
            tracing.end(span, error)

    def finalize(self):
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.publisher.close()
        self.client.close()
        tracing.active().shutdown()

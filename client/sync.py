"""``ChatClient``: the synchronous transport, on tritonclient's gRPC stream (a channel and a
receiving thread per request), for scripts, the CLI and health checks. What it sends is a
``Call`` (switchboard.client.request); what comes back, events (switchboard.client.events)."""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterator

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from switchboard.client.events import (
    ChatError,
    ChatReply,
    Heard,
    TokenLogprobs,
    ToolCallDeltas,
    VoiceReply,
    chat_decoder,
    collect_reply,
    collect_transcript,
    collect_voice,
    error_code,
)
from switchboard.client.request import Call, ChatRequest, VoiceRequest, request_id, transcribe_call
from switchboard.codec import first_elements
from switchboard.wire import AsrResult, ChatStats, channel_args, untag

RETRIES_BEFORE_ANSWER = 1
RETRY_AFTER_S = 0.5  # the balancer takes a dead replica out after two failed checks 0.5 s apart


def close_stream(client: grpcclient.InferenceServerClient, cancel: bool = False) -> None:
    """Stop a client's stream (cancelling what is still running when ``cancel``) and close it."""
    client.stop_stream(cancel_requests=cancel)
    client.close()


def error_of(e: InferenceServerException) -> tuple[str | None, str]:
    """(gRPC status name or None, message) of an error from a stream (``error_code``)."""
    return error_code(e.message() if hasattr(e, "message") else str(e), e.status())


def transport_unavailable(error) -> bool:
    """The call failed on its way (connection refused or reset, a balancer without a replica),
    not a refusal the server wrote: those carry a tag (``[UNAVAILABLE] ...``)."""
    code, _ = untag(error.message() if hasattr(error, "message") else str(error))
    return code is None and (error.status() or "").endswith("UNAVAILABLE")


def result_outputs(result) -> dict[str, bytes]:
    """The outputs of one tritonclient ``InferResult``, as the decoders read them."""
    return first_elements(result.get_response())


def parse_response(result, error) -> tuple[str, ChatStats | None]:
    """(text delta, stats if this is the last response) of one streamed response of chat; an
    error response (always the request's last) raises ``ChatError``."""
    if error is not None:
        code, message = error_of(error)
        raise ChatError(message, code)
    events, _ = chat_decoder(result_outputs(result))
    delta = next((e for e in events if isinstance(e, str)), "")
    stats = next((e for e in events if isinstance(e, ChatStats)), None)
    return delta, stats


def stream_kwargs(call: Call) -> dict:
    """Keyword arguments of tritonclient's ``async_stream_infer`` for ``call``."""

    def infer_input(name, array):
        t = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        t.set_data_from_numpy(array)
        return t

    return {
        "model_name": call.model,
        "inputs": [infer_input(name, array) for name, array in call.tensors().items()],
        "request_id": request_id(),
        "priority": int(call.priority),
        "parameters": call.parameters,
        "outputs": [grpcclient.InferRequestedOutput(name) for name in call.outputs],
    }


class ChatClient:
    def __init__(
        self,
        url: str = "127.0.0.1:8001",
        model: str = "chat",
        timeout_s: float = 120.0,
        private_connection: bool = False,
        *,
        asr_model: str = "asr",
        voice_model: str = "voice_chat",
    ):
        """``private_connection``: chats do not share this process's connection to ``url``
        (``channel_args``); for health checks. ``asr_model``, ``voice_model``: the Triton models
        ``transcribe`` and ``voice_chat`` call."""
        self.url = url
        self.model = model
        self.asr_model = asr_model
        self.voice_model = voice_model
        self.timeout_s = timeout_s
        self._channel_args = channel_args(private_connection)

    def _client(self) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(self.url, channel_args=self._channel_args)

    def ready(self, model: str | None = None) -> bool:
        """The server and ``model`` (default: the chat model) are ready."""
        with self._client() as c:
            try:
                return c.is_server_ready() and c.is_model_ready(model or self.model)
            except InferenceServerException:
                return False

    def chat(
        self, text: str | bytes | ChatRequest | None, *, stream: bool = True, **options
    ) -> Iterator[str | TokenLogprobs | ToolCallDeltas | ChatStats] | ChatReply:
        """``text`` with ``options`` (``ChatRequest``'s fields: session_id, priority, limits,
        history, response_format, logprobs, tools...), or a ``ChatRequest``. ``stream=True``: an
        iterator of text deltas (str, after their ``TokenLogprobs`` or ``ToolCallDeltas`` when
        asked) ending with one ``ChatStats``. ``stream=False``: the whole ``ChatReply``. Raises
        ``ChatError`` on refusal."""
        events = self._run(ChatRequest.of(text, **options).call(self.model))
        return events if stream else collect_reply(events)

    def transcribe(
        self, audio: bytes, language: str | None = None, priority: int = 2, stream: bool = False
    ) -> AsrResult | Iterator[str | AsrResult]:
        """The transcript of an audio file (its bytes: WAV, FLAC, OGG...). ``stream=False``: the
        whole ``AsrResult`` (text, language, duration, segments, timings). ``stream=True``: an
        iterator of text deltas (str) ending with the ``AsrResult``. Silence gives an empty
        text; audio the server refuses raises ``ChatError`` (INVALID_ARGUMENT, its message
        headed by the reason: ``[too_long] ...``; UNAVAILABLE while the recognizer is not loaded)."""
        # the result alone without stream: no delta to send or read
        events = self._run(transcribe_call(self.asr_model, audio, language, priority, deltas=stream))
        return events if stream else collect_transcript(list(events))

    def voice_chat(
        self, audio: bytes | VoiceRequest, *, stream: bool = True, **options
    ) -> Iterator[Heard | str | ChatStats] | VoiceReply:
        """A turn spoken instead of typed (``VoiceRequest``; ``options``: its fields, language
        and those of any turn): the audio is transcribed, the transcript answered as ``chat``
        answers text (the session's history, priority, limits). ``stream=True``: an iterator of
        one ``Heard`` (the transcript), then text deltas (str), then ``ChatStats`` (its ``asr``:
        transcript, language, asr_ms, audio_s). ``stream=False``: the whole ``VoiceReply``.
        Silence: ``Heard("")``, no answer, the stats."""
        events = self._run(VoiceRequest.of(audio, **options).call(self.voice_model))
        return events if stream else collect_voice(list(events))

    def _run(self, call: Call):
        """The events of ``call`` (built at the first event, as a generator does its work)."""
        # Behind a balancer (switchboard.ops.balancer) a request that got nothing from a replica
        # that died or could not be reached is sent again: the balancer has another one. Once
        # something arrived, a broken stream is the caller's error (the answer would start over).
        request = stream_kwargs(call)
        for attempt in range(1 + RETRIES_BEFORE_ANSWER):
            try:
                yield from self._attempt(request, call)
                return
            except _NothingReceived as e:
                if attempt == RETRIES_BEFORE_ANSWER:
                    raise e.error from None
                time.sleep(RETRY_AFTER_S)

    def _attempt(self, request: dict, call: Call):
        responses: queue.Queue = queue.Queue()
        done = threading.Event()
        received = False

        def callback(result, error):
            responses.put((result, error))

        client = self._client()
        try:
            # Not the `triton_grpc_error` header: streams it ends with an error status can crash
            # Triton 2.51 (docs/reliability.md); the code comes in the message instead.
            try:
                client.start_stream(callback=callback, headers=call.headers)
                client.async_stream_infer(**request)
            except InferenceServerException as e:  # no stream: the server is down or unreachable
                done.set()
                code = error_of(e)[0] or "UNAVAILABLE"
                error = ChatError(f"could not send to {self.url}: {e.message()}", code)
                raise (_NothingReceived(error) if code == "UNAVAILABLE" else error) from None
            while not done.is_set():
                try:
                    result, error = responses.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise ChatError(f"no response within {self.timeout_s:.0f} s", "DEADLINE_EXCEEDED") from None
                if error is not None:
                    done.set()  # an error response is the request's last
                    code, message = error_of(error)
                    if not received and transport_unavailable(error):
                        raise _NothingReceived(ChatError(message, code))
                    raise ChatError(message, code)
                events, last = call.decode(result_outputs(result))
                received = True
                if last:
                    done.set()
                yield from events
        finally:
            close_stream(client, cancel=not done.is_set())


class _NothingReceived(Exception):
    """A chat that failed before anything came back, in a way another replica could answer."""

    def __init__(self, error: ChatError):
        super().__init__(str(error))
        self.error = error

"""``AsyncChatClient``: the asyncio transport, on the gRPC channel's own stubs and
``switchboard.codec``'s messages, for services and load generators that hold many chats at
once (the HTTP gateway, ``perf``). What it sends is a ``Call`` (switchboard.client.request);
what comes back, events (switchboard.client.events)."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

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
from switchboard.client.request import Call, ChatRequest, VoiceRequest, transcribe_call
from switchboard.codec import first_elements
from switchboard.wire import STREAM_MAX_AGE_S, AsrResult, ChatStats, channel_args

STREAM_END_S = 5.0  # a stream half-closed after its answer is cancelled if Triton has not ended it by then


class AsyncChatClient:
    """The asyncio twin of ``ChatClient`` for services and load generators that hold many chats
    at once (the HTTP gateway, ``perf``): one gRPC channel for every chat, where ``ChatClient``
    opens a channel and a receiving thread per chat. Create and use it inside one running event loop.

        async with AsyncChatClient("127.0.0.1:8001") as client:
            async for event in client.stream("Where is my order?", priority=1):
                ...  # str deltas, then one ChatStats

    It speaks Triton's gRPC API on the channel's own stubs, and keeps up to ``idle_streams``
    streams open between chats: a chat ends with one final response (its stats, or an error),
    after which its stream carries the next chat, so a chat costs one write instead of a new
    call (setup, write, half-close: about a third of the gateway's CPU before). A chat left
    early cancels its stream, which cancels the chat in Triton; that stream is not reused. A
    chat with a ``session_id`` gets a stream of its own (its header routes it: ``session_headers``).
    A stream older than ``stream_max_age_s`` is ended instead of reused: behind a balancer, the
    chats move to replicas added or off replicas drained within that time.
    """

    def __init__(
        self,
        url: str = "127.0.0.1:8001",
        model: str = "chat",
        timeout_s: float = 120.0,
        idle_streams: int = 64,
        *,
        stream_max_age_s: float = STREAM_MAX_AGE_S,
        asr_model: str = "asr",
        voice_model: str = "voice_chat",
    ):
        self.url = url
        self.model = model
        self.asr_model = asr_model
        self.voice_model = voice_model
        self.timeout_s = timeout_s
        self.idle_streams = idle_streams
        self.stream_max_age_s = stream_max_age_s
        self._channel = grpc.aio.insecure_channel(url, options=channel_args())
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._idle: list[tuple[grpc.aio.StreamStreamCall, float]] = []  # (stream, when it was opened)
        self._ending: set[asyncio.Task] = set()  # aged streams being ended

    async def __aenter__(self) -> "AsyncChatClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        await asyncio.gather(*(self._finish(call) for call, _ in idle), *self._ending)  # answered: ended, not cancelled
        await self._channel.close()

    async def ready(self, timeout_s: float = 5.0) -> bool:
        """The server and the chat model are ready."""
        return await self.model_ready(self.model, timeout_s)

    async def model_ready(self, model: str, timeout_s: float = 5.0) -> bool | None:
        """True: the server and ``model`` are ready; False: the server answers, ``model`` is not
        ready (not loaded yet); None: the server does not answer or is not ready itself."""
        try:
            server = await self._stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=timeout_s)
            if not server.ready:
                return None
        except grpc.aio.AioRpcError:
            return None
        try:
            return (await self._stub.ModelReady(service_pb2.ModelReadyRequest(name=model), timeout=timeout_s)).ready
        except grpc.aio.AioRpcError as e:
            return False if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE) else None

    async def chat(self, text: str | bytes | ChatRequest | None, **options) -> ChatReply:
        """The whole answer (``stream``'s arguments). Raises ``ChatError`` on refusal."""
        return collect_reply([event async for event in self.stream(text, **options)])

    def stream(
        self, text: str | bytes | ChatRequest | None, **options
    ) -> AsyncIterator[str | TokenLogprobs | ToolCallDeltas | ChatStats]:
        """``text`` with ``options`` (``ChatRequest``'s fields), or a ``ChatRequest``: text deltas
        (str, after their ``TokenLogprobs`` or ``ToolCallDeltas`` when asked) ending with one
        ``ChatStats``; leaving early cancels the chat."""
        return self._exchange(ChatRequest.of(text, **options).call(self.model))

    async def transcribe(self, audio: bytes, language: str | None = None, priority: int = 2) -> AsrResult:
        """``ChatClient.transcribe``'s whole ``AsrResult``."""
        events = self.transcribe_stream(audio, language, priority, deltas=False)
        return collect_transcript([e async for e in events])

    def transcribe_stream(
        self,
        audio: bytes,
        language: str | None = None,
        priority: int = 2,
        *,
        deltas: bool = True,
        traceparent: str | None = None,
    ) -> AsyncIterator[str | AsrResult]:
        """Transcript deltas (str) ending with the ``AsrResult``; leaving early cancels the
        transcription. ``deltas`` False: the ``AsrResult`` alone (``Asr.DELTAS``)."""
        return self._exchange(transcribe_call(self.asr_model, audio, language, priority, deltas, traceparent))

    async def voice_chat(self, audio: bytes | VoiceRequest, **options) -> VoiceReply:
        """``ChatClient.voice_chat``'s whole ``VoiceReply``."""
        return collect_voice([e async for e in self.voice_stream(audio, **options)])

    def voice_stream(self, audio: bytes | VoiceRequest, **options) -> AsyncIterator[Heard | str | ChatStats]:
        """``stream`` for a spoken turn (``VoiceRequest``): one ``Heard``, then text deltas (str),
        then ``ChatStats``."""
        return self._exchange(VoiceRequest.of(audio, **options).call(self.voice_model))

    async def _exchange(self, request: Call) -> AsyncIterator:
        """The events of ``request`` (its message built at the first event: a value that does not
        fit its tensor fails there, as the chat's other refusals), ``decode`` of each response, on
        a stream of the pool (or one of its own, with headers or not ``pooled``); leaving
        early cancels it.

        Speech goes on streams of its own, closed when it is done: Triton does not finish
        unloading a model (``asr`` whose stub died and is reloaded; the recognizer replaced)
        while a stream that carried a request to it stays open, and a pooled stream stays open
        for as long as this client. A transcription costs far more than a stream's setup."""
        headers, decode = request.headers, request.decode
        message = request.message()
        pooled = request.pooled and headers is None
        call, born = self._take() if pooled else (None, 0.0)
        done = retried = False
        try:
            # A stream that failed before the request's first response (a reused one that broke
            # while idle; the replica behind a balancer died): once more on a new one. No
            # response means no token yet, so the turn was neither answered nor stored.
            while True:
                if call is None:
                    call = self._stub.ModelStreamInfer(metadata=tuple(headers.items()) if headers else None)
                    born = time.monotonic()
                try:
                    await self._write(call, message)
                    response = await self._read(call)
                    break
                except _StaleStream as e:
                    call.cancel()
                    if retried:
                        raise e.error from None
                    call, retried = None, True
            while True:
                events, done = decode(message_outputs(response))
                for event in events:
                    yield event
                if done:
                    return
                response = await self._read(call)
        except _StaleStream as e:
            raise e.error from None
        finally:
            if call is not None:
                young = time.monotonic() - born < self.stream_max_age_s
                if done and pooled and young and len(self._idle) < self.idle_streams and not call.done():
                    self._idle.append((call, born))
                elif done:
                    await self._finish(call)
                else:
                    call.cancel()  # cancels the request in Triton if it is still running

    async def _finish(self, call) -> None:
        """End a stream whose request is answered: the client half-closes and Triton ends it.
        Cancelled instead, as its last response goes out, Triton 2.51 can keep the model
        referenced: it never unloads, and a stop waits out the server's exit timeout
        (docs/voice.md)."""
        try:
            if not call.done():
                await call.done_writing()
                async with asyncio.timeout(STREAM_END_S):
                    await call.code()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError):
            call.cancel()

    def _take(self) -> tuple[grpc.aio.StreamStreamCall | None, float]:
        """An idle stream to reuse and when it was opened; aged ones are ended on the way."""
        now = time.monotonic()
        while self._idle:
            call, born = self._idle.pop()
            if call.done():
                continue
            if now - born < self.stream_max_age_s:
                return call, born
            task = asyncio.get_running_loop().create_task(self._finish(call))
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)
        return None, 0.0

    async def _write(self, call, request) -> None:
        try:
            await call.write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
            raise self._broken(e) from None

    async def _read(self, call) -> service_pb2.ModelStreamInferResponse:
        try:
            async with asyncio.timeout(self.timeout_s):  # no task per response, unlike wait_for
                message = await call.read()
        except TimeoutError:
            raise ChatError(f"no response within {self.timeout_s:.0f} s", "DEADLINE_EXCEEDED") from None
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
            raise self._broken(e) from None
        if message is grpc.aio.EOF:
            raise _StaleStream(ChatError(f"{self.url} closed the stream before the answer was complete", "UNAVAILABLE"))
        return message

    def _broken(self, e: Exception) -> "_StaleStream":
        """The call failed: the server is down or unreachable, or the stream was ended."""
        if isinstance(e, grpc.aio.AioRpcError):
            return _StaleStream(ChatError(f"could not send to {self.url}: {e.details()}", e.code().name))
        return _StaleStream(ChatError(f"could not send to {self.url}: the stream has ended ({e})", "UNAVAILABLE"))


class _StaleStream(Exception):
    """The stream itself failed (not a response): on a stream reused from the pool, before any
    response, the chat goes once more on a new stream."""

    def __init__(self, error: ChatError):
        super().__init__(str(error))
        self.error = error


def message_outputs(message: service_pb2.ModelStreamInferResponse) -> dict[str, bytes]:
    """The outputs of one message of a stream, as the decoders read them; an error (always the
    request's last response) raises ``ChatError``."""
    if message.error_message:
        code, text = error_code(message.error_message)
        raise ChatError(text, code)
    return first_elements(message.infer_response)


def response_events(message: service_pb2.ModelStreamInferResponse) -> tuple[str, ChatStats | None, bool]:
    """(text delta, stats, whether it is the chat's last response) of one message of a chat's
    stream; an error (always the chat's last response) raises ``ChatError``."""
    events, done = chat_decoder(message_outputs(message))
    delta = next((e for e in events if isinstance(e, str)), "")
    stats = next((e for e in events if isinstance(e, ChatStats)), None)
    return delta, stats, done

"""gRPC client for the ``chat`` model (streaming), built on tritonclient.

Priority contract: ``priority=1`` (live/VIP) or ``2`` (default). The SDK sets Triton's
request priority, which orders the queue of the ``chat`` model, and sends the same value as
the request parameter ``chat_priority``, which the pipeline carries to the engine's
scheduler (Python models in Triton 2.51 cannot read Triton's priority).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Iterator

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpc
from tritonclient.utils import InferenceServerException

from switchboard.wire import PRIORITY_PARAMETER, SESSION_HEADER, Chat, ChatStats, Pool, channel_args, untag

_ids = itertools.count()


def close_stream(client: grpcclient.InferenceServerClient, cancel: bool = False) -> None:
    """Stop a client's stream (cancelling what is still running when ``cancel``) and close it."""
    client.stop_stream(cancel_requests=cancel)
    client.close()


class ChatError(RuntimeError):
    """The server refused or failed the chat. ``code`` is the gRPC status (e.g. INVALID_ARGUMENT)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ChatReply:
    text: str
    stats: ChatStats


# What Triton itself answers when the queue in front of a model is full or a request waited
# past the queue policy's timeout (no status code reaches a stream client in 2.51).
# Triton's own refusals that a retry later can get past: its queue in front of chat is full or
# its wait ran out (overloaded), or the server is stopping or has not loaded chat yet (restart).
TRITON_RETRYABLE = (
    "Exceeds maximum queue size",
    "Request timeout expired",
    "Server is stopping",
    "has no available versions",
)


def error_of(e: InferenceServerException) -> tuple[str | None, str]:
    """(gRPC status name or None, message) of an error from a stream: the code the model wrote
    at the head of its message (switchboard.wire), else the gRPC status of the call itself
    (UNAVAILABLE when the server is gone), else None (Triton's own dtype/shape checks)."""
    code, message = untag(e.message() if hasattr(e, "message") else str(e))
    if code is None and e.status():
        code = e.status().split(".")[-1]
    if code is None and any(m in message for m in TRITON_RETRYABLE):
        code = "UNAVAILABLE"  # overloaded or restarting: retry later
    return code, message


def stream_request(
    model: str, text, session_id, priority: int, max_new_tokens, temperature, top_p, seed, history=None
) -> dict:
    """Keyword arguments of tritonclient's ``async_stream_infer`` (and the dict its asyncio
    client's ``stream_infer`` reads) for one chat. ``history``: the conversation before ``text``
    (``[{"role": "system" | "user" | "assistant", "content": str}, ...]``) for a stateless chat."""

    def tensor(name, value, dtype, triton_type):
        t = grpcclient.InferInput(name, [1, 1], triton_type)
        t.set_data_from_numpy(np.asarray([[value]], dtype=dtype))
        return t

    raw = text if isinstance(text, bytes) else text.encode("utf-8")
    inputs = [tensor(Chat.TEXT, raw, np.object_, "BYTES")]
    if session_id is not None:
        sid = session_id if isinstance(session_id, bytes) else session_id.encode("utf-8")
        inputs.append(tensor(Chat.SESSION_ID, sid, np.object_, "BYTES"))
    if max_new_tokens is not None:
        inputs.append(tensor(Chat.MAX_NEW_TOKENS, max_new_tokens, np.int32, "INT32"))
    if temperature is not None:
        inputs.append(tensor(Chat.TEMPERATURE, temperature, np.float32, "FP32"))
    if top_p is not None:
        inputs.append(tensor(Chat.TOP_P, top_p, np.float32, "FP32"))
    if history is not None:
        blob = json.dumps(list(history), ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
        inputs.append(tensor(Chat.HISTORY, blob, np.object_, "BYTES"))
    parameters = {PRIORITY_PARAMETER: int(priority)}
    if seed is not None:
        parameters[Pool.SEED] = int(seed)
    return {
        "model_name": model,
        "inputs": inputs,
        "request_id": f"{os.getpid()}-{next(_ids)}",
        "priority": int(priority),
        "parameters": parameters,
        "outputs": [grpcclient.InferRequestedOutput(Chat.TEXT_OUTPUT), grpcclient.InferRequestedOutput(Chat.STATS)],
    }


def parse_response(result, error) -> tuple[str, ChatStats | None]:
    """(text delta, stats if this is the last response) of one streamed response; an error
    response (always the request's last) raises ``ChatError``."""
    if error is not None:
        code, message = error_of(error)
        raise ChatError(message, code)
    delta, stats = "", None
    text_out = result.as_numpy(Chat.TEXT_OUTPUT)
    if text_out is not None:
        delta = text_out.reshape(-1)[0].decode("utf-8")
    blob = result.as_numpy(Chat.STATS)
    if blob is not None:
        stats = ChatStats.from_json(blob.reshape(-1)[0])
    return delta, stats


class ChatClient:
    def __init__(
        self,
        url: str = "127.0.0.1:8001",
        model: str = "chat",
        timeout_s: float = 120.0,
        private_connection: bool = False,
    ):
        """``private_connection``: chats do not share this process's connection to ``url``
        (``channel_args``); for health checks."""
        self.url = url
        self.model = model
        self.timeout_s = timeout_s
        self._channel_args = channel_args(private_connection)

    def _client(self) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(self.url, channel_args=self._channel_args)

    def ready(self) -> bool:
        with self._client() as c:
            try:
                return c.is_server_ready() and c.is_model_ready(self.model)
            except InferenceServerException:
                return False

    def chat(
        self,
        text: str,
        session_id: str | None = None,
        stream: bool = True,
        priority: int = 2,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        history: list[dict] | None = None,
    ) -> Iterator[str | ChatStats] | ChatReply:
        """``stream=True``: an iterator of text deltas (str) ending with one ``ChatStats``.
        ``stream=False``: the whole ``ChatReply``. Raises ``ChatError`` on refusal.
        ``history`` (instead of ``session_id``): the conversation before ``text``, kept by the caller."""
        events = self._events(text, session_id, priority, max_new_tokens, temperature, top_p, seed, history)
        if stream:
            return events
        parts, stats = [], None
        for event in events:
            if isinstance(event, ChatStats):
                stats = event
            else:
                parts.append(event)
        return ChatReply("".join(parts), stats)

    def _events(self, text, session_id, priority, max_new_tokens, temperature, top_p, seed, history=None):
        request = stream_request(
            self.model, text, session_id, priority, max_new_tokens, temperature, top_p, seed, history
        )
        # Behind a balancer (switchboard.ops.balancer) a chat that got nothing from a replica that
        # died or could not be reached is sent again: the balancer has another one. Once text
        # arrived, a broken stream is the caller's error (the answer would start over).
        for attempt in range(1 + RETRIES_BEFORE_ANSWER):
            try:
                yield from self._attempt(request, session_headers(session_id))
                return
            except _NothingReceived as e:
                if attempt == RETRIES_BEFORE_ANSWER:
                    raise e.error from None
                time.sleep(RETRY_AFTER_S)

    def _attempt(self, request: dict, headers: dict | None):
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
                client.start_stream(callback=callback, headers=headers)
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
                    if not received and transport_unavailable(error):
                        code, message = error_of(error)
                        raise _NothingReceived(ChatError(message, code))
                delta, stats = parse_response(result, error)
                received = True
                if delta:
                    yield delta
                if stats is not None:
                    done.set()
                    yield stats
        finally:
            close_stream(client, cancel=not done.is_set())


class _NothingReceived(Exception):
    """A chat that failed before anything came back, in a way another replica could answer."""

    def __init__(self, error: ChatError):
        super().__init__(str(error))
        self.error = error


RETRIES_BEFORE_ANSWER = 1
RETRY_AFTER_S = 0.5  # the balancer takes a dead replica out after two failed checks 0.5 s apart


def session_headers(session_id) -> dict | None:
    """The header the balancer hashes to keep a session on one replica (switchboard.ops.balancer):
    a digest of the session id, so any id (newlines, any script, any length) makes a valid HTTP/2
    header and the id itself stays out of the balancer's logs."""
    if session_id is None:
        return None
    raw = session_id if isinstance(session_id, bytes) else session_id.encode("utf-8", "surrogatepass")
    return {SESSION_HEADER: hashlib.sha256(raw).hexdigest()[:32]}


def transport_unavailable(error) -> bool:
    """The call failed on its way (connection refused or reset, a balancer without a replica),
    not a refusal the server wrote: those carry a tag (``[UNAVAILABLE] ...``)."""
    code, _ = untag(error.message() if hasattr(error, "message") else str(error))
    return code is None and (error.status() or "").endswith("UNAVAILABLE")


class AsyncChatClient:
    """The asyncio twin of ``ChatClient`` for services and load generators that hold many chats
    at once: every chat is a stream on one shared gRPC channel, where ``ChatClient`` opens a
    channel and a receiving thread per chat. Create and use it inside one running event loop.

        async with AsyncChatClient("127.0.0.1:8001") as client:
            async for event in client.stream("Where is my order?", priority=1):
                ...  # str deltas, then one ChatStats
    """

    def __init__(self, url: str = "127.0.0.1:8001", model: str = "chat", timeout_s: float = 120.0):
        self.url = url
        self.model = model
        self.timeout_s = timeout_s
        self._client = aiogrpc.InferenceServerClient(url, channel_args=channel_args())

    async def __aenter__(self) -> "AsyncChatClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    async def ready(self) -> bool:
        """The server and the chat model are ready."""
        try:
            return await self._client.is_server_ready() and await self._client.is_model_ready(self.model)
        except InferenceServerException:
            return False

    async def chat(
        self,
        text: str,
        session_id: str | None = None,
        priority: int = 2,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        history: list[dict] | None = None,
    ) -> ChatReply:
        """The whole answer. Raises ``ChatError`` on refusal."""
        parts, stats = [], None
        events = self.stream(text, session_id, priority, max_new_tokens, temperature, top_p, seed, history=history)
        async for event in events:
            if isinstance(event, ChatStats):
                stats = event
            else:
                parts.append(event)
        return ChatReply("".join(parts), stats)

    async def stream(
        self,
        text: str,
        session_id: str | None = None,
        priority: int = 2,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        history: list[dict] | None = None,
    ) -> AsyncIterator[str | ChatStats]:
        """Text deltas (str) ending with one ``ChatStats``; leaving early cancels the chat.
        ``history`` (instead of ``session_id``): the conversation before ``text``, kept by the caller."""
        request = stream_request(
            self.model, text, session_id, priority, max_new_tokens, temperature, top_p, seed, history
        )
        answered = asyncio.Event()

        async def requests():
            yield request
            await answered.wait()  # our half of the stream stays open until the answer is complete

        responses = self._client.stream_infer(requests(), headers=session_headers(session_id))
        done = False
        try:
            while not done:
                try:
                    async with asyncio.timeout(self.timeout_s):  # no task per response, unlike wait_for
                        result, error = await responses.__anext__()
                except TimeoutError:
                    raise ChatError(f"no response within {self.timeout_s:.0f} s", "DEADLINE_EXCEEDED") from None
                except StopAsyncIteration:
                    raise ChatError(
                        f"{self.url} closed the stream before the answer was complete", "UNAVAILABLE"
                    ) from None
                except grpc.aio.AioRpcError as e:  # the server is down or unreachable
                    raise ChatError(f"could not send to {self.url}: {e.details()}", e.code().name) from None
                done = error is not None  # an error response is the request's last
                delta, stats = parse_response(result, error)
                if delta:
                    yield delta
                if stats is not None:
                    done = True
                    yield stats
        finally:
            answered.set()
            if not done:
                responses.cancel()

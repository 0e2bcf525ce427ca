"""gRPC client for the ``chat`` model (streaming), built on tritonclient.

Priority contract: ``priority=1`` (live/VIP) or ``2`` (default). The SDK sets Triton's
request priority, which orders the queue of the ``chat`` model, and sends the same value as
the request parameter ``chat_priority``, which the pipeline carries to the engine's
scheduler (Python models in Triton 2.51 cannot read Triton's priority).
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from switchboard.request import PRIORITY_PARAMETER
from switchboard.status import untag

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
class ChatStats:
    prompt_tokens: int
    reused_tokens: int
    generated_tokens: int
    route: str
    ttft_ms: float | None
    fallback: bool
    raw: dict

    @classmethod
    def from_json(cls, blob: bytes | str) -> "ChatStats":
        d = json.loads(blob)
        return cls(d.get("prompt_tokens", 0), d.get("reused_tokens", 0), d.get("generated_tokens", 0),
                   d.get("route", ""), d.get("ttft_ms"), bool(d.get("fallback", False)), d)


@dataclass(frozen=True)
class ChatReply:
    text: str
    stats: ChatStats


def error_of(e: InferenceServerException) -> tuple[str | None, str]:
    """(gRPC status name or None, message) of an error from a stream: the code the model wrote
    at the head of its message (switchboard.status), else the gRPC status of the call itself
    (UNAVAILABLE when the server is gone), else None (Triton's own dtype/shape checks)."""
    code, message = untag(e.message() if hasattr(e, "message") else str(e))
    if code is None and e.status():
        code = e.status().split(".")[-1]
    return code, message


class ChatClient:
    def __init__(self, url: str = "127.0.0.1:8001", model: str = "chat", timeout_s: float = 120.0):
        self.url = url
        self.model = model
        self.timeout_s = timeout_s

    def ready(self) -> bool:
        with grpcclient.InferenceServerClient(self.url) as c:
            try:
                return c.is_server_ready() and c.is_model_ready(self.model)
            except InferenceServerException:
                return False

    def chat(self, text: str, session_id: str | None = None, stream: bool = True, priority: int = 2,
             max_new_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
             seed: int | None = None) -> Iterator[str | ChatStats] | ChatReply:
        """``stream=True``: an iterator of text deltas (str) ending with one ``ChatStats``.
        ``stream=False``: the whole ``ChatReply``. Raises ``ChatError`` on refusal."""
        events = self._events(text, session_id, priority, max_new_tokens, temperature, top_p, seed)
        if stream:
            return events
        parts, stats = [], None
        for event in events:
            if isinstance(event, ChatStats):
                stats = event
            else:
                parts.append(event)
        return ChatReply("".join(parts), stats)

    def _inputs(self, text, session_id, max_new_tokens, temperature, top_p) -> list:
        def tensor(name, value, dtype, triton_type):
            t = grpcclient.InferInput(name, [1, 1], triton_type)
            t.set_data_from_numpy(np.asarray([[value]], dtype=dtype))
            return t

        raw = text if isinstance(text, bytes) else text.encode("utf-8")
        inputs = [tensor("text", raw, np.object_, "BYTES")]
        if session_id is not None:
            sid = session_id if isinstance(session_id, bytes) else session_id.encode("utf-8")
            inputs.append(tensor("session_id", sid, np.object_, "BYTES"))
        if max_new_tokens is not None:
            inputs.append(tensor("max_new_tokens", max_new_tokens, np.int32, "INT32"))
        if temperature is not None:
            inputs.append(tensor("temperature", temperature, np.float32, "FP32"))
        if top_p is not None:
            inputs.append(tensor("top_p", top_p, np.float32, "FP32"))
        return inputs

    def _events(self, text, session_id, priority, max_new_tokens, temperature, top_p, seed):
        inputs = self._inputs(text, session_id, max_new_tokens, temperature, top_p)
        responses: queue.Queue = queue.Queue()
        done = threading.Event()

        def callback(result, error):
            responses.put((result, error))

        parameters = {PRIORITY_PARAMETER: int(priority)}
        if seed is not None:
            parameters["seed"] = int(seed)
        client = grpcclient.InferenceServerClient(self.url)
        try:
            # Not the `triton_grpc_error` header: streams it ends with an error status can crash
            # Triton 2.51 (README, "Reliability"); the code comes in the message instead.
            try:
                client.start_stream(callback=callback)
                client.async_stream_infer(self.model, inputs, request_id=f"{os.getpid()}-{next(_ids)}",
                                          priority=int(priority), parameters=parameters,
                                          outputs=[grpcclient.InferRequestedOutput("text_output"),
                                                   grpcclient.InferRequestedOutput("stats")])
            except InferenceServerException as e:  # no stream: the server is down or unreachable
                done.set()
                code = error_of(e)[0] or "UNAVAILABLE"
                raise ChatError(f"could not send to {self.url}: {e.message()}", code) from None
            while not done.is_set():
                try:
                    result, error = responses.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise ChatError(f"no response within {self.timeout_s:.0f} s", "DEADLINE_EXCEEDED") from None
                if error is not None:
                    done.set()  # an error response is the request's last
                    code, message = error_of(error)
                    raise ChatError(message, code)
                text_out = result.as_numpy("text_output")
                if text_out is not None:
                    delta = text_out.reshape(-1)[0]
                    if delta:
                        yield delta.decode("utf-8")
                stats = result.as_numpy("stats")
                if stats is not None:
                    done.set()
                    yield ChatStats.from_json(stats.reshape(-1)[0])
        finally:
            close_stream(client, cancel=not done.is_set())

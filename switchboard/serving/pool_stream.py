"""One generation on a pool, as ``chat`` sees it: a request over gRPC (``engine_client``), read
within deadlines, the responses that queued meanwhile merged into one.

A pool that never answers (its stub died mid-request: Triton 2.51 then never completes the
request) costs a timeout, not a hung chat; a stream the chat leaves (timeout, error, its client
gone) is cancelled, and with it the pool's request; once another chat finds the pool's stub
dead, the stream ends at once (``PoolHealth``).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from switchboard.codec import build_request
from switchboard.common import tracing
from switchboard.serving.engine_client import EngineClient, EngineStream
from switchboard.serving.pool_health import PoolHealth
from switchboard.wire import PRIORITY_PARAMETER, TRACE_PARAMETER, EngineStats, Pool, untag


class EngineError(RuntimeError):
    """The pool refused or failed the generation, or its stream broke."""


class EngineTimeout(EngineError):
    """No first response, or no next one, within its deadline."""


@dataclass(frozen=True)
class Generation:
    """What a chat asks a pool for."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    priority: int
    seed: int | None = None
    kv_reuse: bool = False  # the pool reuses the prompt's stored KV blocks and stores the new ones
    expected_reuse: int = 0  # prompt tokens the session's earlier turns stored KV for
    response_format: str | None = None  # the answer's constraint (ChatRequest's), if any
    logprobs: int = -1  # ChatRequest's
    presence_penalty: float = 0.0  # ChatRequest's (sent only when not 0)
    frequency_penalty: float = 0.0


class PoolStreams:
    """Streams generations from the pools. ``first_token_s`` bounds the wait for a pool's first
    response (its queue and the prefill), ``stall_s`` the wait between responses."""

    def __init__(
        self,
        engines: EngineClient,
        health: PoolHealth,
        fingerprint: str,
        first_token_s: float,
        stall_s: float,
        version: int = 0,
    ):
        self.engines, self.health, self.fingerprint = engines, health, fingerprint
        self.first_token_s, self.stall_s = first_token_s, stall_s
        self.version = version  # the pools' model version these streams go to (0: Triton's choice)

    def generate(self, pool: str, gen: Generation) -> Iterator[dict]:
        """The pool's responses as dicts (``token_ids``: list, ``stats``: EngineStats),
        each within its deadline; raises ``EngineError`` / ``EngineTimeout``."""
        inputs = {
            Pool.INPUT_IDS: np.asarray([gen.prompt_ids], np.int32),
            Pool.MAX_NEW_TOKENS: np.asarray([[gen.max_new_tokens]], np.int32),
            Pool.TEMPERATURE: np.asarray([[gen.temperature]], np.float32),
            Pool.TOP_P: np.asarray([[gen.top_p]], np.float32),
        }
        for name, value in (
            (Pool.PRESENCE_PENALTY, gen.presence_penalty),
            (Pool.FREQUENCY_PENALTY, gen.frequency_penalty),
        ):
            if value:
                inputs[name] = np.asarray([[value]], np.float32)
        parameters = {
            PRIORITY_PARAMETER: gen.priority,
            Pool.FINGERPRINT: self.fingerprint,
            Pool.KV_REUSE: gen.kv_reuse,
            Pool.EXPECTED_REUSE: gen.expected_reuse,
        }
        if gen.seed is not None:
            parameters[Pool.SEED] = gen.seed
        if gen.response_format is not None:
            parameters[Pool.RESPONSE_FORMAT] = gen.response_format
        if gen.logprobs >= 0:
            parameters[Pool.LOGPROBS] = gen.logprobs
        # The stream is a span of the chat's trace; the pool's spans join it (docs/tracing.md).
        attributes = {"prompt_tokens": len(gen.prompt_ids), "priority": gen.priority}
        span = tracing.active().child(f"stream {pool}", kind=tracing.SpanKind.CLIENT, attributes=attributes)
        traceparent = tracing.inject(span)
        if traceparent:
            parameters[TRACE_PARAMETER] = traceparent
        # Triton's queue orders the pool's requests by `priority` and rejects one it could not
        # start within `timeout`; the engine orders its batch by `chat_priority`.
        request = build_request(
            pool,
            inputs,
            list(Pool.OUTPUTS),
            parameters,
            priority=gen.priority,
            timeout_us=int(self.first_token_s * 1e6),
            version=self.version,
        )
        # Responses that queued while this chat waited for its turn to send go out as one.
        error = None
        try:
            for responses in self._bounded(pool, self.engines.stream(request)):
                merged: dict = {}
                for response in responses:
                    for name, array in response.items():
                        if name == Pool.TOKEN_IDS:
                            merged.setdefault(name, []).extend(array.reshape(-1).tolist())
                        elif name == Pool.STATS:
                            merged[name] = EngineStats.from_json(array.reshape(-1)[0])
                        elif name == Pool.LOGPROBS:
                            merged.setdefault(name, []).extend(json.loads(array.reshape(-1)[0]))
                yield merged
        except EngineError as e:
            error = str(e)
            raise
        finally:
            tracing.end(span, error)

    def _bounded(self, pool: str, stream: EngineStream):
        """The stream in batches: every response that has arrived (at least one), read on a
        helper thread so that the deadlines hold whatever the pool does."""
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
        with self.health.watching(pool, dead):
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
        """``responses.get(timeout=wait)``, telling ``health`` each time the stream has been
        quiet for ``probe_after_s`` (it may ping the pool)."""
        deadline = time.monotonic() + wait
        step = self.health.probe_after_s or wait
        while (left := deadline - time.monotonic()) > step:
            try:
                return responses.get(timeout=step)
            except queue.Empty:
                self.health.quiet(pool)
        return responses.get(timeout=max(0.0, left))

"""A generation pool's way back to ``chat``: each sequence's responses (token ids as the engine
makes them, then a final response with stats, then its new KV blocks stored). The engine loop
only queues (``ResponseSink.on_*``); the pool's sender thread and cancel watch
(switchboard/common/stream.py) do everything that talks to Triton, off that loop.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard.common import tracing
from switchboard.common.stream import CancelWatch, Outbox, TokenStream
from switchboard.engine.scheduler import GenerationResult
from switchboard.kv.tiers import BlockCache, Reuse
from switchboard.triton.common import send_error
from switchboard.wire import EngineStats, FinishReason, Pool

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_REDIS = {"db.system": "redis"}  # the blocks go to the pool's own memory and to Redis


class ResponseSink:
    """One sequence's way back to ``chat``. The engine loop calls ``on_*`` (they only queue);
    the sender thread calls ``deliver``."""

    def __init__(self, request, sender, priority: int, outbox: Outbox, stream: TokenStream, watch: CancelWatch):
        self.request, self.sender, self.priority, self.outbox, self.stream = request, sender, priority, outbox, stream
        self.watch, self.watched = watch, False
        # With KV reuse: where the new blocks go once the final response is out, and what was reused.
        self.blocks: BlockCache | None = None
        self.prompt: list[int] = []
        self.reuse = Reuse()
        self.broken = False  # a send failed (sender thread)
        self.cancel_seen = False  # the client cancelled (CancelWatch)
        self.lock = threading.Lock()  # guards final_sent (stream.Sink says why)
        self.final_sent = False
        # With logprobs asked: one entry per token not yet sent (the engine loop appends, the
        # sender thread takes as many as the tokens it sends)
        self._logprobs: list = []
        self._logprobs_lock = threading.Lock()
        # The pool's span of this request (ended after the final response, with the queue, prefill
        # and decode placed in it from the engine's stats) and when the engine got the request.
        self.span = tracing.NO_SPAN
        self.submitted_ns = 0

    def cancelled(self) -> bool:
        # Watched from the engine's first question on (admission), so the round trips scale
        # with the running batch, not with every request waiting behind it.
        if not self.watched:
            self.watched = True
            self.watch.add(self)
        return self.broken or self.cancel_seen

    def _logprobs_of(self, n: int) -> list[pb_utils.Tensor]:
        """The output with the next ``n`` tokens' logprobs, if asked for."""
        with self._logprobs_lock:
            if not n or not self._logprobs:
                return []
            entries, self._logprobs = self._logprobs[:n], self._logprobs[n:]
        blob = json.dumps([[round(lp, 5), [[i, round(x, 5)] for i, x in top]] for lp, top in entries])
        return [pb_utils.Tensor(Pool.LOGPROBS, np.asarray([[blob.encode()]], np.object_))]

    def emit(self, ids: list[int], logprobs: list | None = None) -> None:
        if logprobs:
            with self._logprobs_lock:
                self._logprobs.extend(logprobs)
        ids = self.stream.add(ids)
        if ids:
            self.outbox.put(self, self.priority, ids)

    def finish(self, result: GenerationResult) -> None:
        self.outbox.put(self, self.priority, self.stream.rest(), result, end=True)

    def fail(self, error: Exception) -> None:
        self.outbox.put(self, self.priority, (), error, end=True)

    def deliver(self, ids: list[int], final, end: bool) -> None:
        if not end:
            out = pb_utils.Tensor(Pool.TOKEN_IDS, np.asarray([ids], np.int32))
            self.sender.send(pb_utils.InferenceResponse(output_tensors=[out, *self._logprobs_of(len(ids))]))
        elif isinstance(final, Exception):
            try:
                send_error(self.sender, f"generation failed: {final.__class__.__name__}")
            finally:
                tracing.end(self.span, f"generation failed: {final.__class__.__name__}")
        else:
            stats = self._stats(final)
            # The pool's span ends as its answer leaves (chat's stream ends after that); the new
            # blocks are stored after the answer, so ``kv store`` starts after its parent ended.
            answered = time.time_ns()
            try:
                self.sender.send(self._final(stats, final, ids), flags=FINAL)
                tracer = tracing.active()
                tracer.engine_phases(self.span, self.submitted_ns, answered, stats)
                if self.blocks is not None and final.cache is not None:  # after the answer, never before
                    with tracer.span("kv store", self.span, kind=tracing.SpanKind.CLIENT, attributes=_REDIS):
                        self.blocks.store(self.prompt + final.tokens[:-1], final.cache, self.priority)
            finally:
                tracing.end(self.span, end_ns=answered)

    def _stats(self, result: GenerationResult) -> EngineStats:
        return EngineStats(
            reason=result.reason,
            generated=len(result.tokens),
            queue_ms=round(result.queue_ms, 2),
            prefill_ms=round(result.prefill_ms, 2),
            batch_size=result.batch_size_at_admission,
            engine_ms=round(result.engine_ms, 2),
            reused=self.reuse.tokens,
            kv_local_blocks=self.reuse.local_blocks,
            kv_redis_blocks=self.reuse.remote_blocks,
            cache_miss=self.reuse.miss,
            drafted=result.drafted,
            accepted=result.accepted,
        )

    def _final(self, stats: EngineStats, result: GenerationResult, ids: list[int]):
        outputs = [pb_utils.Tensor(Pool.STATS, np.asarray([[stats.to_json().encode()]], np.object_))]
        if ids and result.reason != FinishReason.CANCELLED:
            outputs.append(pb_utils.Tensor(Pool.TOKEN_IDS, np.asarray([ids], np.int32)))
            outputs += self._logprobs_of(len(ids))
        return pb_utils.InferenceResponse(output_tensors=outputs)

"""One chat turn, without Triton: load the session, build the prompt, reuse the cached KV of the
longest common prefix, route by length, stream the pool's tokens as text, store the session,
end with ``stats``; or answer from the FAQ when no pool can.

The Triton glue (``switchboard.triton.chat_model``) parses the request, admits it, and gives
the turn a ``Sink`` that sends responses; tests give it fakes for the session store, the pools
and the sink.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np

from switchboard.serving.detok import IncrementalDetokenizer
from switchboard.serving.engine_client import stub_dead
from switchboard.serving.fallback import FaqFallback
from switchboard.serving.kvcodec import KVEntry
from switchboard.serving.pool_health import PoolHealth
from switchboard.serving.pool_stream import EngineError, EngineTimeout, Generation
from switchboard.serving.prompt import PromptBuilder, PromptTooLong
from switchboard.serving.request import ChatRequest, RequestError
from switchboard.serving.router import Router
from switchboard.serving.session import Lookup, longest_common_prefix
from switchboard.wire import ChatStats, EngineStats, FallbackReason, FinishReason, Pool, SessionStatus

log = logging.getLogger("switchboard.chat")


class Cancelled(RuntimeError):
    """The client left; nothing more is sent or stored."""


class Sink(Protocol):
    """Where a turn's responses go, in order: text deltas, then one final response."""

    def text(self, delta: str, priority: int) -> None: ...

    def final(self, stats: ChatStats, text: str, priority: int) -> None: ...


class Sessions(Protocol):
    def load(self, session_id: str, want_kv: bool = True) -> Lookup: ...

    def save(self, session_id: str, conversation, kv: KVEntry | None) -> bool: ...


class Pools(Protocol):
    def generate(self, pool: str, gen: Generation) -> Iterator[dict]: ...


class ChatTurn:
    def __init__(
        self,
        *,
        prompts: PromptBuilder,
        sessions: Sessions,
        router: Router,
        pools: Pools,
        health: PoolHealth,
        faq: FaqFallback | None,
        decode: Callable[[list[int]], str],
        stop_ids: set[int],
        end_of_turn_id: int,
        kv_reuse: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.prompts, self.sessions, self.router, self.pools = prompts, sessions, router, pools
        self.health, self.faq, self.decode = health, faq, decode
        self.stop_ids, self.end_of_turn_id, self.kv_reuse = stop_ids, end_of_turn_id, kv_reuse
        self.clock = clock

    def run(self, chat: ChatRequest, sink: Sink, cancelled: Callable[[], bool], t0: float) -> None:
        """Serve ``chat``, started at ``t0`` (``clock``). Raises ``RequestError`` (the prompt does
        not fit), ``EngineError`` (no pool answered and there is no FAQ, or a pool failed after
        text was sent) or ``Cancelled``; otherwise ``sink.final`` was called."""
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
        gen = Generation(
            prompt.ids,
            prompt.max_new_tokens,
            chat.temperature,
            chat.top_p,
            chat.priority,
            chat.seed,
            past,
            return_kv=bool(chat.session_id and self.kv_reuse),
        )
        session_status = lookup.status if chat.session_id else SessionStatus.NONE
        _, preferred = self.router.route(len(prompt.ids))

        detok = IncrementalDetokenizer(self.decode)
        generated: list[int] = []
        ttft_ms, cache, engine_stats = None, None, EngineStats()
        # A pool that fails before anything was sent is retried on the other pool (both serve
        # every length); when both fail or time out, the customer gets the FAQ answer.
        for attempt, pool in enumerate(self.health.order(preferred, self.router.other(preferred))):
            try:
                for response in self.pools.generate(pool, gen):
                    if cancelled():
                        raise Cancelled()  # nothing is stored for a turn the customer never saw
                    ids = response.get(Pool.TOKEN_IDS)
                    if ids is not None:
                        generated.extend(ids)
                        delta = detok.add([t for t in ids if t not in self.stop_ids])
                        if delta:
                            ttft_ms = ttft_ms if ttft_ms is not None else (self.clock() - t0) * 1000
                            sink.text(delta, chat.priority)
                    cache = response.get(Pool.KV, cache)
                    engine_stats = response.get(Pool.STATS, engine_stats)
                break
            except EngineError as e:
                if generated:
                    raise  # text already streamed: an error, not a second answer
                log.warning("%s", e)
                timed_out = isinstance(e, EngineTimeout)
                if not timed_out and stub_dead(str(e)):
                    self.health.failed(pool)  # the stub died; Triton 2.51 does not restart it
                if timed_out or attempt == 1:
                    if self.faq is None:
                        raise
                    reason = FallbackReason.ENGINE_TIMEOUT if timed_out else FallbackReason.ENGINE_ERROR
                    return self.answer_from_faq(chat, sink, t0, reason, session_status, len(prompt.ids))
        tail = detok.flush()

        if chat.session_id:
            conversation = self.prompts.after_answer(prompt, generated, detok.text, self.end_of_turn_id)
            entry = None
            if cache is not None:
                covered = prompt.ids + generated[:-1]
                if cache.shape[3] == len(covered):
                    entry = KVEntry(covered, cache)
            self.sessions.save(chat.session_id, conversation, entry)
        stats = ChatStats(
            prompt_tokens=len(prompt.ids),
            reused_tokens=reused,
            generated_tokens=len(generated),
            route=self.router.name(pool),
            ttft_ms=round(ttft_ms, 2) if ttft_ms is not None else None,
            total_ms=round((self.clock() - t0) * 1000, 2),
            session=session_status,
            dropped_turns=prompt.dropped_turns,
            finish_reason=engine_stats.reason,
            engine_queue_ms=engine_stats.queue_ms,
            engine_ms=engine_stats.engine_ms,
            batch_size=engine_stats.batch_size,
            priority=chat.priority,
        )
        sink.final(stats, tail, chat.priority)

    def answer_from_faq(
        self,
        chat: ChatRequest,
        sink: Sink,
        t0: float,
        reason: FallbackReason,
        session: SessionStatus = SessionStatus.NONE,
        prompt_tokens: int = 0,
    ) -> None:
        """The FAQ's answer to ``chat`` as the whole reply, ``reason`` in its stats."""
        answer = self.faq.answer(chat.text)
        stats = ChatStats(
            prompt_tokens=prompt_tokens,
            total_ms=round((self.clock() - t0) * 1000, 2),
            fallback=True,
            fallback_reason=reason,
            faq_id=answer.entry_id,
            session=session,
            finish_reason=FinishReason.FALLBACK,
            priority=chat.priority,
        )
        sink.final(stats, answer.text, chat.priority)

"""One chat turn, without Triton: load the session, build the prompt, route by length, stream the
pool's tokens as text, store the conversation, end with ``stats``; or answer from the FAQ when
no pool can. The pool reuses the prompt's stored KV blocks itself (switchboard/kv): this side
deals in messages and token ids, tells the pool how much the session stored, and reports what
was reused and, when less than it could have been, why (``cache_miss``).

The Triton glue (``switchboard.triton.chat_model``) parses the request, admits it, and gives
the turn a ``Sink`` that sends responses; tests give it fakes for the session store, the pools
and the sink.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from switchboard.artifact.grammar import GrammarError, Grammars
from switchboard.artifact.tools import ToolCallParser, ToolFormat
from switchboard.common import tracing
from switchboard.common.detok import IncrementalDetokenizer
from switchboard.serving.engine_client import stub_dead
from switchboard.serving.fallback import FaqFallback
from switchboard.serving.pool_health import PoolHealth
from switchboard.serving.pool_stream import EngineError, EngineTimeout, Generation
from switchboard.serving.prompt import Conversation, Prompt, PromptBuilder, PromptTooLong, check_tool_results
from switchboard.serving.request import ChatRequest, RequestError
from switchboard.serving.router import Router
from switchboard.serving.session import Lookup, longest_common_prefix
from switchboard.wire import CacheMiss, ChatStats, EngineStats, FallbackReason, FinishReason, Pool, SessionStatus

log = logging.getLogger("switchboard.chat")
_REDIS = {"db.system": "redis"}  # OpenTelemetry's attribute for a Redis client span


class Cancelled(RuntimeError):
    """The client left; nothing more is sent or stored."""


class Sink(Protocol):
    """Where a turn's responses go, in order: text deltas, then one final response. With
    logprobs asked, ``logprobs`` comes before the ``text`` or ``final`` that carries them."""

    def text(self, delta: str, priority: int) -> None: ...

    def logprobs(self, entries: list[dict], priority: int) -> None: ...

    def tool_calls(self, deltas: list[dict], priority: int) -> None: ...

    def final(self, stats: ChatStats, text: str, priority: int) -> None: ...


class Sessions(Protocol):
    def load(self, session_id: str) -> Lookup: ...

    def save(self, session_id: str, conversation) -> bool: ...


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
        version: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        token_bytes: Callable[[int], bytes] | None = None,
        grammars: Grammars | None = None,
        tool_format: ToolFormat | None = None,
    ):
        self.prompts, self.sessions, self.router, self.pools = prompts, sessions, router, pools
        self.health, self.faq, self.decode = health, faq, decode
        self.stop_ids, self.end_of_turn_id, self.kv_reuse = stop_ids, end_of_turn_id, kv_reuse
        self.version = version  # the pools' model version this turn's pools and prompts are for
        self.clock = clock
        self.token_bytes = token_bytes  # IncrementalDetokenizer's: invalid bytes streamed at once
        self.grammars = grammars  # checks a chat's response_format against the model's tokenizer
        self.tool_format = tool_format  # how the model's template writes tool calls (None: it has none)

    def run(self, chat: ChatRequest, sink: Sink, cancelled: Callable[[], bool], t0: float) -> None:
        """Serve ``chat``, started at ``t0`` (``clock``). Raises ``RequestError`` (the prompt does
        not fit), ``EngineError`` (no pool answered and there is no FAQ, or a pool failed after
        text was sent) or ``Cancelled``; otherwise ``sink.final`` was called. A chat with a
        ``response_format`` or a tool it must call is never answered from the FAQ (its text
        would not match). With tools, the answer's calls go to ``sink.tool_calls`` as they are
        written, its other text to ``sink.text``."""
        constraint = self.check_format(chat)
        lookup = self._load(chat.session_id) if chat.session_id else Lookup()
        if chat.history is not None:  # stateless: the client's history; its KV is found by content
            lookup = Lookup(Conversation([dict(m) for m in chat.history]))
        if chat.tool_results:
            try:
                check_tool_results(lookup.conversation.messages if lookup.conversation else [], chat.tool_results)
            except ValueError as e:
                raise RequestError(str(e)) from None
        try:
            prompt = self.prompts.build(
                lookup.conversation, chat.text, chat.max_new_tokens, chat.system, chat.tools, chat.tool_results
            )
        except PromptTooLong as e:
            raise RequestError(str(e)) from None
        self.check_budget(constraint, prompt.max_new_tokens, chat)
        stored = lookup.conversation.kv_tokens if lookup.conversation else 0
        expected = min(longest_common_prefix(lookup.conversation.tokens, prompt.ids), stored) if stored else 0
        gen = Generation(
            prompt.ids,
            prompt.max_new_tokens,
            chat.temperature,
            chat.top_p,
            chat.priority,
            chat.seed,
            kv_reuse=self.kv_reuse,
            expected_reuse=expected,
            response_format=constraint,
            logprobs=chat.logprobs,
            presence_penalty=chat.presence_penalty,
            frequency_penalty=chat.frequency_penalty,
        )
        session_status = lookup.status if chat.session_id else SessionStatus.NONE
        _, preferred = self.router.route(len(prompt.ids) - expected)

        detok = IncrementalDetokenizer(self.decode, self.token_bytes)
        calls = (
            ToolCallParser(self.tool_format, {t["function"]["name"] for t in chat.tools}) if chat.calls_tools else None
        )
        generated: list[int] = []
        scored: list[dict] = []  # logprob entries not yet sent
        ttft_ms, engine_stats = None, EngineStats()
        failover_tokens = 0
        # A pool that fails before anything was sent is retried on the other pool (both serve
        # every length); when both fail, or the first times out (the other is as busy), the
        # customer gets the FAQ answer. A pool that fails after text was sent (its stub died
        # mid-answer) hands the answer to the other pool, which goes on from the tokens already
        # streamed: the customer sees one answer, not an error.
        for attempt, pool in enumerate(self.health.order(preferred, self.router.other(preferred))):
            if generated:
                if generated[-1] in self.stop_ids or len(generated) >= gen.max_new_tokens:
                    break  # the first pool had finished; only its final response was lost
                failover_tokens = len(generated)
                log.warning("%s goes on from the %d tokens streamed before the other pool failed", pool, len(generated))
            try:
                for response in self.pools.generate(pool, self._resumed(gen, generated)):
                    if cancelled():
                        raise Cancelled()  # nothing is stored for a turn the customer never saw
                    ids = response.get(Pool.TOKEN_IDS)
                    if ids is not None:
                        generated.extend(ids)
                        scored += self._scored(ids, response.get(Pool.LOGPROBS) or ())
                        delta = detok.add([t for t in ids if t not in self.stop_ids])
                        if delta:
                            ttft_ms = ttft_ms if ttft_ms is not None else (self.clock() - t0) * 1000
                            if scored:
                                sink.logprobs(scored, chat.priority)
                                scored = []
                            self._send(delta, calls, sink, chat.priority)
                    engine_stats = response.get(Pool.STATS, engine_stats)
                break
            except EngineError as e:
                log.warning("%s", e)
                timed_out = isinstance(e, EngineTimeout)
                if not timed_out and stub_dead(str(e)):
                    self.health.failed(pool)  # the stub died; Triton 2.51 does not restart it
                if generated:
                    if attempt == 1:
                        raise  # both pools failed mid-answer: an error, not a second answer
                    continue
                if timed_out or attempt == 1:
                    if self.faq is None or chat.must_generate:
                        raise
                    reason = FallbackReason.ENGINE_TIMEOUT if timed_out else FallbackReason.ENGINE_ERROR
                    return self.answer_from_faq(chat, sink, t0, reason, session_status, len(prompt.ids))
        if engine_stats.reason is None and generated:  # finished on the first pool, final response lost
            done = generated[-1] in self.stop_ids
            engine_stats = EngineStats(FinishReason.STOP if done else FinishReason.LENGTH, len(generated))
        tail = detok.flush()
        content = detok.text
        if calls is not None:
            tail = self._send(tail, calls, sink, chat.priority, last=True)
            content = calls.content
            if calls.calls and engine_stats.reason == FinishReason.STOP:
                engine_stats = dataclasses.replace(engine_stats, reason=FinishReason.TOOL_CALLS)

        if chat.session_id:
            conversation = self.prompts.after_answer(
                prompt, generated, content, self.end_of_turn_id, calls.calls if calls is not None else None
            )
            with tracing.active().span("redis session.save", kind=tracing.SpanKind.CLIENT, attributes=_REDIS) as s:
                s.set_attribute("stored", self.sessions.save(chat.session_id, conversation))
        stats = ChatStats(
            prompt_tokens=len(prompt.ids),
            reused_tokens=min(engine_stats.reused, len(prompt.ids)),  # after a failover: of the prompt
            kv_local_blocks=engine_stats.kv_local_blocks,
            kv_redis_blocks=engine_stats.kv_redis_blocks,
            cache_miss=self.cache_miss(lookup, prompt, stored, expected, engine_stats),
            generated_tokens=len(generated),
            route=self.router.name(pool),
            ttft_ms=round(ttft_ms, 2) if ttft_ms is not None else None,
            total_ms=round((self.clock() - t0) * 1000, 2),
            session=session_status,
            dropped_turns=prompt.dropped_turns,
            finish_reason=engine_stats.reason,
            engine_queue_ms=engine_stats.queue_ms,
            engine_prefill_ms=engine_stats.prefill_ms,
            engine_ms=engine_stats.engine_ms,
            batch_size=engine_stats.batch_size,
            drafted_tokens=engine_stats.drafted,
            accepted_tokens=engine_stats.accepted,
            priority=chat.priority,
            model_version=self.version,
            failover_tokens=failover_tokens,
        )
        if scored:
            sink.logprobs(scored, chat.priority)
        sink.final(stats, tail, chat.priority)

    def _load(self, session_id: str) -> Lookup:
        """The session's conversation from Redis, in a span of the chat's trace."""
        with tracing.active().span("redis session.load", kind=tracing.SpanKind.CLIENT, attributes=_REDIS) as s:
            lookup = self.sessions.load(session_id)
            s.set_attribute("status", str(lookup.status))
        return lookup

    @staticmethod
    def _send(delta: str, calls: ToolCallParser | None, sink: Sink, priority: int, last: bool = False) -> str:
        """``delta`` out: as text, or, with tools, its calls to ``sink.tool_calls`` and its
        other text (the last delta's returned, for the final response)."""
        if calls is None:
            if not last:
                sink.text(delta, priority)
            return delta
        text, made = calls.feed(delta)
        if last:
            held, more = calls.flush()
            text, made = text + held, made + more
        if made:
            sink.tool_calls(made, priority)
        if text and not last:
            sink.text(text, priority)
        return text

    def _scored(self, ids: list[int], logprobs) -> list[dict]:
        """The pool's logprobs of ``ids`` as OpenAI's entries (the stop token's left out)."""

        def entry(token: int, lp: float) -> dict:
            raw = self.token_bytes(token) if self.token_bytes else self.decode([token]).encode("utf-8")
            return {"token": raw.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(raw)}

        return [
            {**entry(token, lp), "top_logprobs": [entry(i, x) for i, x in top]}
            for token, (lp, top) in zip(ids, logprobs)
            if token not in self.stop_ids
        ]

    @staticmethod
    def _resumed(gen: Generation, generated: list[int]) -> Generation:
        """``gen`` going on after ``generated``: those tokens join the prompt (the pool finds the
        prompt's KV by content, so only the new tail is prefilled)."""
        if not generated:
            return gen
        return dataclasses.replace(
            gen, prompt_ids=gen.prompt_ids + generated, max_new_tokens=gen.max_new_tokens - len(generated)
        )

    def cache_miss(
        self, lookup: Lookup, prompt: Prompt, stored: int, expected: int, engine: EngineStats
    ) -> CacheMiss | None:
        """Why the prompt reused less than it could have (None: it reused all it could)."""
        if not self.kv_reuse:
            return None
        if engine.cache_miss is not None:  # stored blocks not found or not usable (the pool knows)
            return engine.cache_miss
        if lookup.status == SessionStatus.UNAVAILABLE:
            return CacheMiss.REDIS_UNAVAILABLE
        if lookup.other_model:
            return CacheMiss.FINGERPRINT_CHANGED
        if stored and expected < stored and prompt.dropped_turns:
            return CacheMiss.WINDOW_SLID
        if engine.reused == 0:
            return CacheMiss.NONE_STORED
        return None

    def check_format(self, chat: ChatRequest) -> str | None:
        """The constraint the pool holds the answer to (``parse_spec``'s JSON: the chat's
        response_format, or its tools' calls); ``RequestError`` when it cannot constrain this
        model."""
        if chat.calls_tools:
            if self.tool_format is None:
                raise RequestError("tools: this model's chat template has no tool-call format")
            chosen = [t for t in chat.tools if chat.tool_name in (None, t["function"]["name"])]
            spec = {
                "type": "tool_calls",
                "mode": "auto" if chat.tool_choice == "auto" else "required",
                "tools": [{"name": t["function"]["name"], "parameters": t["function"]["parameters"]} for t in chosen],
                "format": self.tool_format.to_dict(),
                "parallel": chat.tool_name is None,
            }
        elif chat.response_format is not None:
            spec = json.loads(chat.response_format)
        else:
            return None
        if self.grammars is None:
            raise RequestError(
                f"{'tools' if chat.calls_tools else 'response_format'}: this model's answers cannot be constrained"
            )
        try:
            self.grammars.grammar(spec)
        except GrammarError as e:
            raise RequestError(str(e)) from None
        return json.dumps(spec, ensure_ascii=False)

    def check_budget(self, constraint: str | None, budget: int, chat: ChatRequest) -> None:
        """A constrained answer must have room for its shortest whole answer: the pool finishes
        one the budget would cut (its finish_reason stays ``length``), and refuses nothing, so
        a budget below that is refused here, naming the tokens needed. ``budget``: the
        tokens the chat may generate (``max_new_tokens``, or less where the prompt leaves less
        of the context window)."""
        if constraint is None or self.grammars is None:
            return
        need = self.grammars.shortest(json.loads(constraint))
        if need is None or need <= budget:
            return
        what = "call of these tools" if chat.calls_tools else "answer in this response_format"
        if budget < chat.max_new_tokens:
            raise RequestError(
                f"max_new_tokens: the prompt leaves {budget} tokens of the context window and the shortest "
                f"{what} takes {need} on this model"
            )
        raise RequestError(
            f"max_new_tokens: {budget} is below the {need} tokens the shortest {what} takes on this model"
        )

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
            model_version=self.version,
        )
        sink.final(stats, answer.text, chat.priority)

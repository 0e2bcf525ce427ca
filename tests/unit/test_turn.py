"""One chat turn with fakes for the session store, the pools, the FAQ and the response sink."""

from __future__ import annotations

import dataclasses
import json

import pytest

from switchboard.artifact.grammar import GrammarError
from switchboard.serving.fallback import Answer
from switchboard.serving.pool_health import PoolHealth
from switchboard.serving.pool_stream import EngineError, EngineTimeout
from switchboard.serving.prompt import Conversation, Prompt, PromptTooLong
from switchboard.serving.request import ChatRequest, RequestError
from switchboard.serving.router import Router
from switchboard.serving.session import Lookup
from switchboard.serving.turn import Cancelled, ChatTurn
from switchboard.wire import CacheMiss, EngineStats, FallbackReason, SessionStatus

EOT = 99
DEAD = "Failed for execute the inference request. Model 'engine_short' is not ready: Stub process is not healthy."


def decode(ids):
    return "".join(chr(ord("a") + i % 26) for i in ids)


class Prompts:
    """Prompt ids: the history's tokens, then one id per character of the new message."""

    def build(self, history, text, max_new_tokens, system=None, tools=(), tool_results=()):
        if text == "too long":
            raise PromptTooLong("prompt: 900 tokens do not fit the context window")
        head = list(history.tokens) if history else [1, 2, 3]
        return Prompt(head + [ord(c) % 50 for c in text], [{"role": "user", "content": text}], max_new_tokens)

    @staticmethod
    def after_answer(prompt, answer_ids, answer_text, end_id, tool_calls=None):
        tokens = prompt.ids + answer_ids
        return Conversation([*prompt.messages, {"role": "assistant", "content": answer_text}], tokens, len(tokens) - 1)


class Sessions:
    def __init__(self, lookup: Lookup | None = None):
        self.lookup = lookup or Lookup()
        self.loads, self.saved = [], []

    def load(self, session_id):
        self.loads.append(session_id)
        return self.lookup

    def save(self, session_id, conversation):
        self.saved.append((session_id, conversation))
        return True


class Pools:
    """Per pool, a script: response dicts, and an exception raised where it stands."""

    def __init__(self, **scripts):
        self.scripts, self.calls = scripts, []

    def generate(self, pool, gen):
        self.calls.append((pool, gen))
        for item in self.scripts[pool]:
            if isinstance(item, Exception):
                raise item
            yield item


class Faq:
    def answer(self, text):
        return Answer("See My Orders.", "order-status", 0.9)


class Sink:
    def __init__(self):
        self.deltas, self.finals = [], []

    def text(self, delta, priority):
        self.deltas.append((delta, priority))

    def final(self, stats, text, priority):
        self.finals.append((stats, text, priority))

    @property
    def stats(self):
        """The final stats as the JSON carries them."""
        assert len(self.finals) == 1
        return json.loads(self.finals[0][0].to_json())

    @property
    def reply(self):
        return "".join(d for d, _ in self.deltas) + self.finals[0][1]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 0.010  # every reading 10 ms later
        return self.now


def _answer(ids, stats=None):
    out = {"token_ids": ids}
    if stats is not None:
        out["stats"] = stats
    return out


FAQ = Faq()


def _turn(sessions=None, pools=None, faq=FAQ, health=None, decode=decode, prompts=None, **kw):
    return ChatTurn(
        prompts=prompts or Prompts(),
        sessions=sessions or Sessions(),
        router=Router(8),
        pools=pools,
        health=health or PoolHealth(),
        faq=faq,
        decode=decode,
        stop_ids={EOT},
        end_of_turn_id=EOT,
        clock=Clock(),
        **kw,
    )


def _chat(text="hi", session_id=None, priority=2):
    return ChatRequest(text, session_id, 16, 0.0, 1.0, priority, None)


def _run(turn, chat, cancelled=lambda: False):
    sink = Sink()
    turn.run(chat, sink, cancelled, 0.0)
    return sink


ENGINE_STATS = EngineStats("stop", 3, queue_ms=1.5, prefill_ms=2.0, batch_size=3, engine_ms=9.0)


def test_a_one_off_chat_streams_text_and_ends_with_its_stats():
    pools = Pools(engine_short=[_answer([0, 1]), _answer([2, EOT], stats=ENGINE_STATS)])
    sessions = Sessions()
    sink = _run(_turn(sessions, pools), _chat("hi"))
    assert sink.reply == "abc" and all(p == 2 for _, p in sink.deltas)
    assert sessions.loads == [] and sessions.saved == []  # no session: neither read nor written
    stats = sink.stats
    assert stats["prompt_tokens"] == 5 and stats["generated_tokens"] == 4 and stats["reused_tokens"] == 0
    assert stats["route"] == "short" and stats["session"] == "none" and stats["fallback"] is False
    assert stats["finish_reason"] == "stop" and stats["batch_size"] == 3 and stats["engine_queue_ms"] == 1.5
    assert stats["engine_prefill_ms"] == 2.0
    assert stats["ttft_ms"] == 10.0 and stats["total_ms"] > stats["ttft_ms"]
    gen = pools.calls[0][1]
    assert gen.kv_reuse is True and gen.expected_reuse == 0 and gen.priority == 2  # blocks shared across chats
    assert stats["cache_miss"] == "none_stored"  # nothing was found


def test_a_session_hit_tells_the_pool_what_it_stored_and_reports_what_was_reused():
    history = Conversation([{"role": "user", "content": "x"}], [5, 6, 7, 8, EOT], kv_tokens=4)
    sessions = Sessions(Lookup(history, SessionStatus.HIT))
    reused = EngineStats("stop", 3, reused=4, kv_local_blocks=1)
    pools = Pools(engine_short=[_answer([0, 1]), _answer([EOT], stats=reused)])
    sink = _run(_turn(sessions, pools), _chat("ok", session_id="s1"))
    gen = pools.calls[0][1]
    assert gen.kv_reuse is True and gen.expected_reuse == 4  # the common prefix, as far as KV was computed
    stats = sink.stats
    assert stats["reused_tokens"] == 4 and stats["kv_local_blocks"] == 1 and stats["session"] == "hit"
    assert stats["cache_miss"] is None
    [(sid, conversation)] = sessions.saved
    assert sid == "s1" and conversation.tokens == gen.prompt_ids + [0, 1, EOT]
    assert conversation.kv_tokens == len(gen.prompt_ids) + 2  # no KV for the last token


def test_the_pools_miss_reason_is_the_turns():
    history = Conversation([], [5, 6, 7, 8], kv_tokens=4)
    evicted = EngineStats("stop", 1, cache_miss=CacheMiss.EVICTED)
    pools = Pools(engine_short=[_answer([EOT], stats=evicted)])
    sink = _run(_turn(Sessions(Lookup(history, SessionStatus.HIT)), pools), _chat(session_id="s"))
    assert sink.stats["cache_miss"] == "evicted" and sink.stats["reused_tokens"] == 0


def test_a_slid_window_and_another_model_say_so():
    history = Conversation([], [5, 6, 7, 8], kv_tokens=4)
    turn = _turn(Sessions(Lookup(history, SessionStatus.HIT)), Pools(engine_short=[_answer([EOT])]))
    turn.prompts.build = lambda h, text, max_new, *rest: Prompt([5, 9, 9], [], max_new, dropped_turns=1)
    sink = _run(turn, _chat(session_id="s"))
    assert sink.stats["cache_miss"] == "window_slid" and turn.pools.calls[0][1].expected_reuse == 1

    other = Lookup(Conversation([{"role": "user", "content": "x"}]), SessionStatus.HIT, other_model=True)
    sink = _run(_turn(Sessions(other), Pools(engine_short=[_answer([EOT])])), _chat(session_id="s"))
    assert sink.stats["cache_miss"] == "fingerprint_changed"


@pytest.mark.parametrize("status", ["miss", "rejected", "unavailable"])
def test_a_session_without_a_usable_entry_is_computed_from_scratch_and_says_why(status):
    pools = Pools(engine_short=[_answer([0, EOT])])
    sessions = Sessions(Lookup(None, status))
    sink = _run(_turn(sessions, pools), _chat(session_id="s"))
    assert sink.stats["session"] == status and sink.stats["reused_tokens"] == 0
    assert pools.calls[0][1].expected_reuse == 0 and len(sessions.saved) == 1
    assert sink.stats["cache_miss"] == ("redis_unavailable" if status == "unavailable" else "none_stored")


def test_kv_reuse_off_does_not_ask_the_pool_for_it():
    pools = Pools(engine_short=[_answer([0, EOT])])
    sessions = Sessions()
    sink = _run(_turn(sessions, pools, kv_reuse=False), _chat(session_id="s"))
    assert sessions.loads == ["s"] and pools.calls[0][1].kv_reuse is False and sink.stats["cache_miss"] is None


def test_long_prompts_go_to_the_long_pool():
    pools = Pools(engine_long=[_answer([0, EOT])])
    sink = _run(_turn(pools=pools), _chat("a longer message"))
    assert pools.calls[0][0] == "engine_long" and sink.stats["route"] == "long"


def test_a_pool_that_fails_before_any_text_is_retried_on_the_other():
    pools = Pools(engine_short=[EngineError("engine_short: boom")], engine_long=[_answer([0, EOT])])
    sink = _run(_turn(pools=pools), _chat())
    assert [p for p, _ in pools.calls] == ["engine_short", "engine_long"]
    assert sink.reply == "a" and sink.stats["route"] == "long" and sink.stats["fallback"] is False


def test_a_dead_stub_is_routed_around_by_the_next_chats():
    health = PoolHealth(retry_after_s=30)
    pools = Pools(engine_short=[EngineError(DEAD)], engine_long=[_answer([0, EOT])])
    turn = _turn(pools=pools, health=health)
    _run(turn, _chat())
    assert not health.up("engine_short")
    pools.calls.clear()
    _run(turn, _chat())
    assert [p for p, _ in pools.calls] == ["engine_long"]


def test_a_busy_pool_error_does_not_mark_it_dead():
    health = PoolHealth()
    pools = Pools(engine_short=[EngineError("engine_short: queue full")], engine_long=[_answer([EOT])])
    _run(_turn(pools=pools, health=health), _chat())
    assert health.up("engine_short")


def test_a_timeout_answers_from_the_faq_at_once():
    pools = Pools(engine_short=[EngineTimeout("engine_short: no first response within 10 s")], engine_long=[])
    sink = _run(_turn(pools=pools), _chat(session_id="s"))
    stats = sink.stats
    assert [p for p, _ in pools.calls] == ["engine_short"]  # not retried: the other pool is as busy
    assert stats["fallback"] is True and stats["fallback_reason"] == "engine_timeout"
    assert stats["faq_id"] == "order-status" and sink.reply == "See My Orders."
    assert stats["session"] == "miss" and stats["prompt_tokens"] == 5 and stats["finish_reason"] == "fallback"


class StubGrammars:
    def grammar(self, spec):
        if spec["type"] != "json_object":
            raise GrammarError("json_schema: Invalid type: wat")
        return "grammar"

    def shortest(self, spec):
        return 9  # tokens of the shortest whole answer


def _formatted(fmt='{"type": "json_object"}', **kw):
    return dataclasses.replace(_chat(**kw), response_format=fmt)


def test_a_response_format_goes_to_the_pool_and_is_checked_first():
    pools = Pools(engine_short=[_answer([1, EOT], stats=ENGINE_STATS)])
    _run(_turn(pools=pools, grammars=StubGrammars()), _formatted())
    assert pools.calls[0][1].response_format == '{"type": "json_object"}'
    pools = Pools(engine_short=[])
    with pytest.raises(RequestError, match="Invalid type: wat"):
        _run(_turn(pools=pools, grammars=StubGrammars()), _formatted('{"type": "json_schema", "schema": {}}'))
    with pytest.raises(RequestError, match="cannot be constrained"):
        _run(_turn(pools=pools), _formatted())
    assert pools.calls == [], "refused before any pool was asked"


def test_a_constrained_chat_is_never_answered_from_the_faq():
    pools = Pools(engine_short=[EngineTimeout("engine_short: no first response within 10 s")], engine_long=[])
    with pytest.raises(EngineTimeout):
        _run(_turn(pools=pools, grammars=StubGrammars()), _formatted())
    pools = Pools(engine_short=[EngineError("a")], engine_long=[EngineError("b")])
    with pytest.raises(EngineError):
        _run(_turn(pools=pools, grammars=StubGrammars()), _formatted())


def test_both_pools_failing_answers_from_the_faq():
    pools = Pools(engine_short=[EngineError("a")], engine_long=[EngineError("b")])
    sink = _run(_turn(pools=pools), _chat())
    assert sink.stats["fallback_reason"] == "engine_error" and sink.stats["session"] == "none"


def test_without_a_faq_the_engine_error_reaches_the_caller():
    pools = Pools(engine_short=[EngineError("a")], engine_long=[EngineError("b")])
    with pytest.raises(EngineError):
        _run(_turn(pools=pools, faq=None), _chat())


def test_a_pool_failing_after_text_was_sent_hands_the_answer_to_the_other_from_where_it_stopped():
    pools = Pools(
        engine_short=[_answer([0, 1]), EngineError(DEAD)], engine_long=[_answer([2]), _answer([EOT], ENGINE_STATS)]
    )
    sessions, health = Sessions(), PoolHealth(retry_after_s=30)
    sink = _run(_turn(sessions, pools, health=health), _chat(session_id="s"))
    (_, first), (second_pool, second) = pools.calls
    assert second_pool == "engine_long" and second.prompt_ids == first.prompt_ids + [0, 1]
    assert second.max_new_tokens == first.max_new_tokens - 2 and not health.up("engine_short")
    assert sink.reply == "abc" and [d for d, _ in sink.deltas] == ["ab", "c"]  # one answer, nothing repeated
    stats = sink.stats
    assert stats["failover_tokens"] == 2 and stats["generated_tokens"] == 4 and stats["route"] == "long"
    assert stats["prompt_tokens"] == len(first.prompt_ids) and stats["finish_reason"] == "stop"
    assert sessions.saved[0][1].tokens == first.prompt_ids + [0, 1, 2, EOT]


def test_both_pools_failing_mid_answer_is_an_error_not_a_second_answer():
    pools = Pools(engine_short=[_answer([0, 1]), EngineError("died")], engine_long=[_answer([2]), EngineError("too")])
    sessions, sink = Sessions(), Sink()
    with pytest.raises(EngineError):
        _turn(sessions, pools).run(_chat(session_id="s"), sink, lambda: False, 0.0)
    assert len(pools.calls) == 2 and sink.finals == [] and sessions.saved == []


@pytest.mark.parametrize("ids,reason", [([0, EOT], "stop"), (list(range(16)), "length")])
def test_a_pool_that_failed_after_its_last_token_is_not_asked_to_go_on(ids, reason):
    pools = Pools(engine_short=[_answer(ids), EngineError(DEAD)], engine_long=[_answer([5])])
    sink = _run(_turn(pools=pools), _chat())
    assert [p for p, _ in pools.calls] == ["engine_short"]
    assert sink.stats["finish_reason"] == reason and sink.stats["generated_tokens"] == len(ids)
    assert sink.stats["failover_tokens"] == 0


def test_the_shed_path_answers_from_the_faq_with_its_reason():
    sink = Sink()
    turn = _turn(pools=Pools())
    turn.answer_from_faq(_chat(priority=1), sink, 0.0, FallbackReason.QUEUE_TIMEOUT, SessionStatus.SKIPPED)
    stats, text, priority = sink.finals[0]
    assert stats.fallback_reason is FallbackReason.QUEUE_TIMEOUT and stats.session is SessionStatus.SKIPPED
    assert stats.priority == priority == 1 and text == "See My Orders." and stats.total_ms == 10.0
    assert json.loads(stats.to_json()) == {
        "prompt_tokens": 0, "reused_tokens": 0, "kv_local_blocks": 0, "kv_redis_blocks": 0, "cache_miss": None,
        "generated_tokens": 0, "route": None, "ttft_ms": None,
        "total_ms": 10.0, "fallback": True, "fallback_reason": "queue_timeout", "faq_id": "order-status",
        "session": "skipped", "dropped_turns": 0, "finish_reason": "fallback", "engine_queue_ms": None,
        "engine_prefill_ms": None, "engine_ms": None, "batch_size": None, "drafted_tokens": 0, "accepted_tokens": 0,
        "priority": 1, "model_version": None,
        "failover_tokens": 0,
    }  # fmt: skip


def test_bytes_that_never_make_a_character_stream_at_once_and_first_text_is_timed():
    # A random model repeating a lone lead byte: only the last one is held.
    def byte_decode(ids):
        return bytes(i for i in ids if i != EOT).decode("utf-8", errors="replace")

    def token_bytes(i):
        return b"" if i == EOT else bytes([i])

    pools = Pools(engine_short=[_answer([0xF4]), _answer([0xF4]), _answer([0x41, EOT], stats=ENGINE_STATS)])
    sink = _run(_turn(pools=pools, decode=byte_decode, token_bytes=token_bytes), _chat())
    assert [d for d, _ in sink.deltas] == ["\ufffd", "\ufffdA"]
    pools = Pools(engine_short=[_answer([0xF4]), _answer([0xF4]), _answer([0x41, EOT], stats=ENGINE_STATS)])
    sink = _run(_turn(pools=pools, decode=byte_decode), _chat())  # without the bytes: all held
    assert [d for d, _ in sink.deltas] == ["\ufffd\ufffdA"]


def test_a_client_that_leaves_stops_the_turn_and_nothing_is_stored():
    pools = Pools(engine_short=[_answer([0]), _answer([1]), _answer([EOT])])
    sessions = Sessions()
    asked = iter([False, True])
    sink = Sink()
    with pytest.raises(Cancelled):
        _turn(sessions, pools).run(_chat(session_id="s"), sink, lambda: next(asked), 0.0)
    assert sink.deltas == [("a", 2)] and sink.finals == [] and sessions.saved == []


def test_a_prompt_that_cannot_fit_is_the_clients_error():
    with pytest.raises(RequestError, match="context window"):
        _run(_turn(pools=Pools()), _chat("too long"))


def test_stop_tokens_are_counted_but_not_shown():
    pools = Pools(engine_short=[_answer([0, EOT])])
    sink = _run(_turn(pools=pools), _chat())
    assert sink.reply == "a" and sink.stats["generated_tokens"] == 2


def test_a_long_prompt_mostly_stored_stays_in_the_short_pool_where_its_blocks_are():
    history = Conversation([], list(range(10)), kv_tokens=9)  # 9 stored: 3 + len("ok") = 12 tokens, 3 to compute
    pools = Pools(engine_short=[_answer([EOT])])
    sink = _run(_turn(Sessions(Lookup(history, SessionStatus.HIT)), pools), _chat("ok", session_id="s"))
    assert pools.calls[0][0] == "engine_short" and sink.stats["route"] == "short"  # Router(8): 12 tokens is long


def test_a_budget_below_the_shortest_constrained_answer_is_refused_naming_what_it_takes():
    pools = Pools(engine_short=[_answer([1, EOT], stats=ENGINE_STATS)])
    _run(_turn(pools=pools, grammars=StubGrammars()), dataclasses.replace(_formatted(), max_new_tokens=9))
    assert pools.calls[0][1].max_new_tokens == 9, "exactly the shortest answer's tokens: served"
    with pytest.raises(RequestError, match=r"^max_new_tokens: 8 is below the 9 tokens the shortest answer in this"):
        _run(_turn(pools=pools, grammars=StubGrammars()), dataclasses.replace(_formatted(), max_new_tokens=8))

    class Short(Prompts):  # the prompt leaves 5 tokens of the context window
        def build(self, *args, **kw):
            return dataclasses.replace(super().build(*args, **kw), max_new_tokens=5)

    with pytest.raises(RequestError, match="the prompt leaves 5 tokens of the context window and the shortest"):
        _run(_turn(pools=pools, grammars=StubGrammars(), prompts=Short()), _formatted())
    assert len(pools.calls) == 1, "refused before any pool was asked"


def test_penalties_go_to_the_pool_with_the_chat():
    pools = Pools(engine_short=[_answer([1, EOT], stats=ENGINE_STATS)])
    _run(_turn(pools=pools), dataclasses.replace(_chat(), presence_penalty=0.5, frequency_penalty=-1.0))
    gen = pools.calls[0][1]
    assert (gen.presence_penalty, gen.frequency_penalty) == (0.5, -1.0)

"""The wire contract: stats as typed objects, their JSON unchanged, unknown values kept."""

from __future__ import annotations

import json

from switchboard.wire import ChatStats, EngineStats, FallbackReason, FinishReason, Route, SessionStatus

SERVED = {  # a generated answer's stats, as the server has always sent them
    "prompt_tokens": 49, "reused_tokens": 41, "kv_local_blocks": 2, "kv_redis_blocks": 0, "cache_miss": None,
    "generated_tokens": 12, "route": "short", "ttft_ms": 14.2,
    "total_ms": 40.1, "fallback": False, "session": "hit", "dropped_turns": 0, "finish_reason": "stop",
    "engine_queue_ms": 0.4, "engine_prefill_ms": 9.5, "engine_ms": 30.0, "batch_size": 3,
    "drafted_tokens": 9, "accepted_tokens": 7, "priority": 1, "model_version": 1, "failover_tokens": 0,
}  # fmt: skip


def test_chat_stats_read_typed_and_write_the_same_json():
    stats = ChatStats.from_json(json.dumps(SERVED))
    assert (
        stats.route is Route.SHORT and stats.session is SessionStatus.HIT and stats.finish_reason is FinishReason.STOP
    )
    assert stats.reused_tokens == 41 and stats.raw == SERVED
    assert json.loads(stats.to_json()) == SERVED and list(json.loads(stats.to_json())) == list(SERVED)


def test_a_fallbacks_stats_carry_its_reason_and_faq_entry_and_others_do_not():
    stats = ChatStats(fallback=True, fallback_reason=FallbackReason.QUEUE_FULL, faq_id=None)
    d = json.loads(stats.to_json())
    assert d["fallback_reason"] == "queue_full" and "faq_id" in d and d["faq_id"] is None
    assert "fallback_reason" not in json.loads(ChatStats().to_json())


def test_values_and_keys_from_a_newer_server_are_kept_not_refused():
    stats = ChatStats.from_dict({**SERVED, "session": "warmed", "tier": "gold"})
    assert stats.session == "warmed" and stats.extra == {"tier": "gold"} and stats.raw["tier"] == "gold"


def test_a_peer_that_sends_few_fields_gets_the_defaults():
    stats = ChatStats.from_json('{"generated_tokens": 5, "ttft_ms": 9.5}')
    assert stats.generated_tokens == 5 and stats.route is None and stats.fallback is False


def test_engine_stats_round_trip():
    stats = EngineStats(FinishReason.LENGTH, 8, queue_ms=1.0, prefill_ms=2.0, batch_size=4, engine_ms=20.0)
    assert EngineStats.from_json(stats.to_json()) == stats
    assert json.loads(stats.to_json())["reason"] == "length"


def test_the_dict_form_holds_plain_strings_not_enums():
    d = ChatStats(route=Route.LONG, session=SessionStatus.MISS, finish_reason=FinishReason.LENGTH).to_dict()
    assert {type(d[k]) for k in ("route", "session", "finish_reason")} == {str}

"""Pure parts of the measurement tools: gaps around long prompts, per-pool counters, the gateway's cost."""

from __future__ import annotations

import argparse
import json

from perf import gateway_cost
from perf.kv import TURNS
from perf.kv import markdown as kv_markdown
from perf.long_prompt import overlapping_gaps
from perf.scaling import _sum_pools


def test_a_stream_frozen_across_a_prefill_counts_as_one_long_gap():
    times = [[0.0, 0.1, 0.2, 2.3, 2.4], [5.0, 5.1]]
    gaps = overlapping_gaps(times, [(0.25, 2.25)])
    assert [round(g) for g in gaps] == [2100]


def test_pool_counters_are_summed_as_deltas():
    before = {"engine_short": {"prefill_s": 1.0, "decode_s": 2.0, "batch_steps": {8: 10}}}
    after = {
        "engine_short": {"prefill_s": 1.5, "decode_s": 4.0, "prefill_chunks": 3.0, "batch_steps": {8: 14, 7: 2}},
        "engine_long": {"prefill_s": 0.5, "decode_s": 0.0, "batch_steps": {}},
    }
    out = _sum_pools(before, after)
    assert out["prefill_s"] == 1.0 and out["decode_s"] == 2.0 and out["prefill_chunks"] == 3.0
    assert out["batch_steps"] == {8: 4, 7: 2}


def _kv_turn(session, turn, written, ttft, text="ok"):
    return {
        "session": session, "turn": turn, "prompt_tokens": 40 * turn, "reused": 32 * (turn - 1),
        "local_blocks": 2 * (turn - 1), "redis_blocks": 0, "cache_miss": None if turn > 1 else "none_stored",
        "generated": 10, "new_tokens": 40, "ttft_ms": ttft, "written": written, "read": 100, "text": text,
    }  # fmt: skip


def test_the_kv_report_puts_written_bytes_against_the_new_tokens_kv_and_ttft_against_cold():
    turns = range(1, len(TURNS) + 1)
    run = {"name": "reuse", "turns": [_kv_turn(0, t, 40 * 1024 * 1.05, 10.0) for t in turns]}
    cold = {"name": "cold", "turns": [_kv_turn(0, t, 0, 40.0, "other") for t in turns]}
    for r in (run, cold):
        r["redis_memory_per_session"] = 1e6
    fmt = {"bytes": 1024, "of_native": 1.0, "encode_ms": 0.1, "decode_ms": 0.1, "max_abs_error": 0.0}
    result = {
        "model": "m", "started": "now", "seconds": 1, "args": "", "sessions": 1, "max_new_tokens": 8,
        "kv_bytes_per_token": 1024, "runs": [run, cold], "formats": {"native": fmt},
    }  # fmt: skip
    report = kv_markdown(result)
    assert "| 2 | 80 | 32 (2.0 / 0.0) | 0.04 MB | 0.04 MB | 1.05x |" in report
    assert "| 10 ms | 40 ms | 0.25x |" in report
    assert "| cold |" in report and "| 0/4 |" in report  # cold's answers differ from the native ones here
    assert "reuse: none_stored 1; cold: none_stored 1" in report


def test_the_steady_window_counts_only_the_decode_steps_between_its_two_scrapes(monkeypatch):
    import time

    from perf import scaling

    snapshots = iter(
        [
            {"engine_short": {"prefill_s": 1.0, "decode_s": 5.0, "batch_steps": {8: 10, 2: 7}}},  # ramp before
            {"engine_short": {"prefill_s": 1.0, "decode_s": 6.0, "batch_steps": {8: 20, 7: 4, 2: 7}}},
        ]
    )
    monkeypatch.setattr(scaling, "engine_counters", lambda port: next(snapshots))
    monkeypatch.setattr(scaling, "STEADY_FROM_S", 0.0)
    now = time.monotonic()
    out: dict = {}
    scaling.steady_window(1, now, now + 0.2, out)
    assert 0.15 < out["seconds"] < 1.0
    assert out["mean_decode_batch"] == (10 * 8 + 4 * 7) / 14, "the ramp's batches of 2 are not in the window"
    assert abs(out["decode_tokens_per_s"] - 108 / out["seconds"]) < 1e-6


def _samples(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _chat(path, t0, ttft_ms, server_ms, tokens=10):
    return {
        "path": path,
        "t0": t0,
        "end": t0 + 0.5,
        "ttft_s": ttft_ms / 1000,
        "server_ttft_ms": server_ms,
        "tokens": tokens,
        "ok": True,
    }


def test_the_gateway_cost_splits_ttft_into_chats_own_and_the_hops_outside_it(tmp_path):
    # the gateway's chats: chat itself 1 ms slower (CPU shared with the gateway), hops 0.5 ms longer
    grpc = _samples(tmp_path / "g", [_chat("grpc", t, 10.0, 8.0) for t in range(20)])
    http = _samples(tmp_path / "h", [_chat("http", t, 11.5, 9.0) for t in range(20)])
    g, h = gateway_cost.summarize([grpc], 0, 20), gateway_cost.summarize([http], 0, 20)
    assert g["chat_ttft_p50_ms"] == 8.0 and g["outside_chat_p50_ms"] == 2.0
    results = {"grpc": g, "http": h, "rounds": gateway_cost.per_round({"grpc": [grpc], "http": [http]}, 0, 20)}
    text = gateway_cost.report(
        results, argparse.Namespace(users=4, max_tokens=48, rounds=1, seconds=20, warmup_s=0), ""
    )
    assert results["cost"]["ttft_p50_delta_ms"] == 1.5 and results["cost"]["outside_chat_delta_ms"] == 0.5
    assert results["cost"]["met"] and "median +0.50 ms through the gateway; in chat: +1.00 ms" in text
    assert "per round: median TTFT +1.50 ms" in text


def test_the_gateway_cost_is_not_met_when_throughput_drops(tmp_path):
    grpc = _samples(tmp_path / "g", [_chat("grpc", t / 2, 10.0, None) for t in range(40)])
    http = _samples(tmp_path / "h", [_chat("http", t, 10.5, None) for t in range(20)])  # half the chats
    results = {p: gateway_cost.summarize([f], 0, 19) for p, f in (("grpc", grpc), ("http", http))}
    text = gateway_cost.report(
        results, argparse.Namespace(users=4, max_tokens=48, rounds=1, seconds=19, warmup_s=0), ""
    )
    assert not results["cost"]["met"] and results["cost"]["outside_chat_delta_ms"] is None
    assert "bound 95%: NOT met" in text and "outside chat (" not in text

"""The AIPerf bench's own parts: the dataset it hands AIPerf, how it reads AIPerf's export, the
report (the llama-server client, which needs the exported model's tokenizer, is tested in
tests/model/test_llamacpp_client.py)."""

import json
import math

import pytest

from perf import aiperf_bench as ab


def _export(**over):
    """The shape of AIPerf 0.13's profile_export_aiperf.json (trimmed to what the bench reads)."""
    d = {
        "schema_version": "1.4",
        "request_count": {"unit": "requests", "avg": 96.0},
        "good_request_count": {"unit": "requests", "avg": 72.0},
        "goodput": {"unit": "requests/sec", "avg": 0.75},
        "request_throughput": {"unit": "requests/sec", "avg": 1.0},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 31.9},
        "time_to_first_token": {"unit": "ms", "avg": 900.0, "p50": 883.0, "p99": 4000.0},
        "inter_token_latency": {"unit": "ms", "avg": 190.0, "p50": 187.0, "p99": 400.0},
        "request_latency": {"unit": "ms", "avg": 7000.0, "p50": 6000.0, "p99": 12000.0},
        "total_usage_prompt_tokens": {"unit": "tokens", "avg": 10000.0},
        "total_usage_prompt_cache_read_tokens": {"unit": "tokens", "avg": 8000.0},
        "error_summary": [],
    }
    d.update(over)
    return d


def test_summary_reads_the_export():
    s = ab.summary(ab.metrics(_export()))
    assert s["requests"] == 96 and s["errors"] == 0 and s["error_rate"] == 0
    assert s["goodput_rps"] == 0.75 and s["good_share"] == 0.75
    assert (s["ttft_p50_ms"], s["ttft_p99_ms"], s["itl_p50_ms"]) == (883, 4000, 187)
    assert s["cached_prompt_tokens"] / s["prompt_tokens"] == 0.8


def test_summary_counts_errors_and_missing_figures():
    s = ab.summary(ab.metrics(_export(error_request_count={"unit": "requests", "avg": 4.0}, goodput=None)))
    assert s["errors"] == 4 and s["error_rate"] == pytest.approx(4 / 100)
    assert math.isnan(s["goodput_rps"])


def test_dataset_is_multi_turn_conversations_with_the_system_prompt(tmp_path):
    preset = ab.PRESETS["large"]
    path = ab.dataset(tmp_path / "d.jsonl", 5, preset, "You are the shop's agent.", seed=3)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 5 and len({r["session_id"] for r in rows}) == 5
    for r in rows:
        system, *turns = r["turns"]
        assert system == {"role": "system", "text": "You are the shop's agent."}
        assert len(turns) == preset.turns
        assert turns[0]["delay"] == 0 and all(t["delay"] >= 0 for t in turns)
        assert all(t["output_length"] == preset.answer_tokens and t["text"].strip() for t in turns)
    assert (
        ab.dataset(tmp_path / "e.jsonl", 5, preset, "You are the shop's agent.", seed=3).read_text() == path.read_text()
    )


def test_command_sends_the_priority_header_as_a_string(tmp_path, monkeypatch):
    # the command names AIPerf's CLI; finding it would install AIPerf (a download) on a fresh clone
    monkeypatch.setattr(ab, "aiperf_bin", lambda: tmp_path / "aiperf")
    data = tmp_path / "d.jsonl"
    data.write_text('{"turns": []}\n{"turns": []}\n')
    cmd = ab.aiperf_command("http://x:1", data, 8, ab.PRESETS["large"], tmp_path, tmp_path, [ab.PRIORITY_1])
    assert cmd[cmd.index("--conversation-num") + 1] == "2"
    assert cmd[cmd.index("--goodput") + 1] == "time_to_first_token:800 inter_token_latency:150"
    header = json.loads(cmd[cmd.index("--header") + 1])
    assert header[ab.PRIORITY_HEADER].strip() == "1" and not header[ab.PRIORITY_HEADER].isdigit()


def test_report_has_the_table_ratios_and_the_plot(tmp_path):
    row = lambda system, tps, **kw: {  # noqa: E731
        "system": system, "concurrency": 8, "conversations": 24, **ab.summary(ab.metrics(_export())),
        "output_tokens_per_s": tps, **kw,
    }  # fmt: skip
    results = {
        "preset": "large",
        "systems": {n: {} for n in ("switchboard", "llama.cpp")},
        "workload": {k: str(v) for k, v in ab.PRESETS["large"].__dict__.items()},
        "llama_server_args": ["--parallel", "8"],
        "aiperf": ab.AIPERF,
        "started": "now",
        "device": {"cpu": "test", "cpus": 2},
        "runs": [row("switchboard", 60.0), row("llama.cpp", 20.0)],
        "priority": [
            {
                "system": "switchboard",
                "concurrency": 8,
                "p1": row("x", 1, ttft_p99_ms=100.0),
                "p2": row("x", 1, ttft_p99_ms=1000.0),
            }
        ],  # fmt: skip
        "command": "test",
    }
    (tmp_path / "results.json").write_text(json.dumps(results))
    text = ab.write_report(tmp_path).read_text()
    assert "| switchboard | 8 | 0.75 | 75% | 60.0 | 883 / 4000 | 187 / 400 | 80% | 0 |" in text
    assert "switchboard / llama.cpp output tokens/s **3.00x**" in text
    assert "**0.10x**" in text
    assert (tmp_path / "goodput.png").stat().st_size > 0

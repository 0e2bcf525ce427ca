"""A few seconds of the ASR benchmark (``--preset smoke``): the served asr pool on tiny.en,
started from a private repository, transcribes spoken questions at 1 and 8 callers, and the
summary and plot come out. The side-by-side runs are `make bench-asr`."""

from __future__ import annotations

import json

from perf import asr_bench
from tests.integration.speechtools import NEEDS_TINY_EN

pytestmark = NEEDS_TINY_EN


def test_asr_bench_smoke(tmp_path):
    out = tmp_path / "asr"
    assert asr_bench.main(["--preset", "smoke", "--out", str(out)]) == 0

    results = json.loads((out / "results.json").read_text())
    rows = {(r["system"], r["concurrency"]): r for r in results["throughput"]}
    assert set(rows) == {("switchboard", 1), ("switchboard", 8)}
    for row in rows.values():
        assert row["model"] == "test-tiny-en" and row["failed"] == 0 and row["audio_s_per_s"] > 0
        assert row["error_rate"]["en"] < 0.8  # a real recognizer heard real questions
    c8 = (out / "samples" / "test-tiny-en-switchboard-fp32-c8.jsonl").read_text().splitlines()
    assert max(json.loads(line)["extra"]["batch_size"] for line in c8) > 1  # eight callers, batched together

    summary = (out / "summary.md").read_text()
    assert "### Throughput: test-tiny-en" in summary and "| switchboard | fp32 |" in summary
    assert (out / "asr-bench.png").stat().st_size > 10_000
    assert (out / "bench.log").is_file()
    # The private repository holds asr alone; model_repository/ was not touched.
    assert [p.name for p in (out / "repos" / "asr-test-tiny-en").iterdir()] == ["asr"]

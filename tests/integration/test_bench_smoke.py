"""A short run of the side-by-side benchmark: every system starts, replays the same traffic,
and the report shows what each configuration really did (the full runs are `make bench`)."""

import json

from perf import bench
from perf.report import load_records


def test_bench_smoke(artifacts, tmp_path):
    out = tmp_path / "bench"
    assert bench.main(["--preset", "smoke", "--out", str(out)]) == 0

    results = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    for name in ("optimized", "baseline", "litserve", "hf"):
        assert f"| {name} |" in report
        records = load_records(out, name, 3.0)
        assert records and all(r["ok"] for r in records), (name, [r["status"] for r in records if not r["ok"]])
    for plot in ("cdf.png", "load.png", "turns.png", "batches.png", "padding.png"):
        assert (out / plot).stat().st_size > 10_000, plot

    # The baseline is what it claims: batch 1, no KV reuse, one pool.
    baseline = load_records(out, "baseline", 3.0)
    assert all(r["reused"] == 0 and r["route"] == "short" for r in baseline)
    engine = next(e["engine"] for e in results["runs"] if e["system"] == "baseline")
    assert {int(b) for b in engine["engine_short"]["batch_steps"]} == {1}  # JSON keys are strings
    assert not engine.get("engine_long", {}).get("batch_steps")
    # The optimized server reused cached KV on later turns, and the limit was measured.
    optimized = load_records(out, "optimized", 3.0)
    assert any(r["turn"] > 1 for r in optimized)
    assert all(r["reused"] > 0 for r in optimized if r["turn"] > 1)
    assert results["limit"]["tokens_per_s"] > 0

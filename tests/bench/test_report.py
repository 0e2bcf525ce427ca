"""The chat benchmark's report (perf/report.py) from a results directory written here."""

from __future__ import annotations

import json
from dataclasses import asdict

from perf import report
from perf.driver import TurnRecord

ENGINE = {
    "engine_short": {
        "batch_steps": {"1": 5, "4": 10},
        "decode_columns": 100,
        "decode_padded_columns": 7,
        "prefill_tokens": 90,
        "prefill_padded_tokens": 100,
        "busy_s": 3.25,
        "prefill_batches": 3,
    },
    "engine_long": {"batch_steps": {}, "prefill_batches": 0},
}


def turn(session: str, n: int, ttft_ms: float, ok: bool = True) -> dict:
    return asdict(
        TurnRecord(
            session, n, 1 + n % 2, 0.1 * n, ok=ok, status=None if ok else "UNAVAILABLE",
            ttft_ms=ttft_ms if ok else None, e2e_ms=4 * ttft_ms, itl_ms=[1.0, 2.0] if ok else [], deltas=3,
            generated=8 if ok else 0, prompt_tokens=20, reused=10 if n > 1 else 0, route="short",
        )
    )  # fmt: skip


def write_results(out, systems: dict[str, list[dict]]) -> None:
    (out / "runs").mkdir(parents=True)
    for name, records in systems.items():
        (out / "runs" / f"{name}-r0-l2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    results = {
        "preset": "quick",
        "started": "2026-11-29 05:00:00",
        "elapsed_s": 60.0,
        "command": "python -m perf chat --preset quick",
        "device": {"cpu": "EPYC", "cpus": 2, "platform": "Linux", "device": "cpu"},
        "seconds": 30,
        "grace": 10,
        "rounds": 1,
        "systems": {name: {"about": f"the {name} server"} for name in systems},
        "loads": [2.0],
        "runs": [{"system": name, "load": 2.0, "wall_s": 10.0, "engine": ENGINE} for name in systems],
    }
    (out / "results.json").write_text(json.dumps(results))


def test_the_report_compares_the_systems_and_breaks_the_optimized_one_down(tmp_path):
    write_results(
        tmp_path,
        {
            "optimized": [turn("a", n, 10.0) for n in (1, 2, 3)] + [turn("b", 1, 0, ok=False)],
            "baseline": [turn("c", n, 40.0) for n in (1, 2, 3)],
            "hf": [],  # no turn answered: its figures are missing, not nan
        },
    )
    text = report.write_report(tmp_path).read_text()
    assert "| optimized | 3/4 | 0.30 | 2 | 10 ms | 10 ms | 10 ms | 40 ms | 40 ms | 1.5 ms | 1 (0) | 0 | 33% |" in text
    assert "| hf | 0/0 | 0.00 | 0 | – ms | – ms | – ms | – ms | – ms | – ms | 0 (0) | 0 | 0% |" in text
    assert "| baseline | 1.00x | 4.00x | 4.00x | 4.00x | 4.00x | 4.00x |" in text  # >1: optimized is better
    assert "| hf | – | – | – | – | – | – |" in text
    assert "| baseline | engine_short | 15 | 3.00 | 4 | 7.0% | 10.0% | 3.2 s |" in text
    assert "| 2 | 3 | 1 | 1 | 0.20 | 2 | 10/10/10 | 1.5/2.0 | 40/40/40 | 10/40 |" in text  # optimized by priority
    assert "nan" not in text.lower() and (tmp_path / "cdf.png").is_file()

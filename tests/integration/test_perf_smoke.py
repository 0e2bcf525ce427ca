"""perf_analyzer (the 2.51 build from tritonclient) really runs against chat with corpus input data."""

from perf.analyzer import llm_metrics, run_perf_analyzer, write_input_data


def test_perf_analyzer_streams_corpus_questions_through_chat(stack, tmp_path):
    data = write_input_data(tmp_path / "input_data.json", 16)
    export = tmp_path / "profile_export.json"
    proc = run_perf_analyzer(stack.grpc_url, data, "2", export, requests=6, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (row,) = llm_metrics(export)
    assert row["concurrency"] == 2 and row["requests"] >= 6
    assert 0 < row["ttft_p50_ms"] <= row["e2e_p50_ms"]
    assert row["text_deltas_per_s"] > 0

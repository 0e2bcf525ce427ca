"""perf_analyzer against ``chat``: ``python -m perf.analyzer``.

Builds an input-data file of real corpus questions, runs perf_analyzer over gRPC streaming
at several concurrency levels, and turns its per-response timestamps (--profile-export-file)
into LLM metrics: time to first token, inter-token latency, end-to-end latency (P50/P99),
requests/s and streamed responses/s. Starts its own redis-server and tritonserver on free
ports unless --url points at a running server.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from perf.stats import percentile
from switchboard.data import corpus
from switchboard.wire import PRIORITY_PARAMETER


def perf_analyzer_binary() -> Path:
    return Path(sys.executable).parent / "perf_analyzer"


def perf_analyzer_env() -> dict[str, str]:
    import nvidia.cuda_runtime  # perf_analyzer 2.51 links libcudart.so.12 even without a GPU

    lib = Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{lib}{os.pathsep}{env.get('LD_LIBRARY_PATH', '')}"
    return env


def write_input_data(path: Path, n: int, seed: int = 0) -> Path:
    """perf_analyzer input data: one corpus question per request, cycled in order."""
    questions = corpus.sample_questions(corpus.load(), n, seed=seed)
    data = {"data": [{"text": [q], "max_new_tokens": [48]} for q in questions]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1))
    return path


def write_workload_data(path: Path, workload: Path) -> Path:
    """perf_analyzer input data from a workload file: every turn as a one-off request (perf_analyzer
    cannot chain turns; ``perf.driver`` replays them as sessions)."""
    from perf.workload import load

    _, sessions = load(workload)
    data = {"data": [{"text": [t], "max_new_tokens": [s.max_new_tokens]} for s in sessions for t in s.turns]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1))
    return path


def run_perf_analyzer(
    url: str,
    input_data: Path,
    concurrency: str | None,
    export: Path,
    requests: int,
    priority: int = 2,
    timeout: float = 600,
    request_rate: str | None = None,
) -> subprocess.CompletedProcess:
    """One sweep: ``concurrency`` ("1:4:1") or ``request_rate`` ("5:20:5", requests/s)."""
    sweep = ["--request-rate-range", request_rate] if request_rate else ["--concurrency-range", concurrency]
    export.unlink(missing_ok=True)  # perf_analyzer refuses to overwrite an earlier run's export
    cmd = [
        str(perf_analyzer_binary()),
        "-m",
        "chat",
        "-i",
        "grpc",
        "-u",
        url,
        "--streaming",
        "--input-data",
        str(input_data),
        *sweep,
        "--measurement-mode",
        "count_windows",
        "--measurement-request-count",
        str(requests),
        "--stability-percentage",
        "50",
        "--max-trials",
        "10",
        "--request-parameter",
        f"{PRIORITY_PARAMETER}:{priority}:int",
        "--profile-export-file",
        str(export),
    ]
    return subprocess.run(cmd, env=perf_analyzer_env(), capture_output=True, text=True, timeout=timeout)


def llm_metrics(export: Path) -> list[dict]:
    """Per concurrency level, from perf_analyzer's per-request response timestamps (ns)."""
    doc = json.loads(export.read_text())
    rows = []
    for experiment in doc.get("experiments", []):
        ttft, itl, e2e, responses, starts, ends = [], [], [], 0, [], []
        for req in experiment.get("requests", []):
            t0, ts = req["timestamp"], req.get("response_timestamps", [])
            if not ts:
                continue
            ttft.append((ts[0] - t0) / 1e6)
            e2e.append((ts[-1] - t0) / 1e6)
            itl += [(b - a) / 1e6 for a, b in zip(ts[:-2], ts[1:-1])]  # last response carries only stats
            responses += max(0, len(ts) - 1)
            starts.append(t0)
            ends.append(ts[-1])
        if not e2e:
            continue
        span_s = (max(ends) - min(starts)) / 1e9
        rows.append(
            {
                "mode": experiment["experiment"].get("mode", "concurrency"),
                "concurrency": experiment["experiment"].get("value"),
                "requests": len(e2e),
                "requests_per_s": len(e2e) / span_s,
                "text_deltas_per_s": responses / span_s,
                "ttft_p50_ms": percentile(ttft, 50),
                "ttft_p99_ms": percentile(ttft, 99),
                "itl_p50_ms": percentile(itl, 50),
                "itl_p99_ms": percentile(itl, 99),
                "e2e_p50_ms": percentile(e2e, 50),
                "e2e_p99_ms": percentile(e2e, 99),
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    head = (
        "| load | requests | req/s | text deltas/s | TTFT P50 | TTFT P99 | ITL P50 | ITL P99 "
        "| E2E P50 | E2E P99 |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {r.get('mode', 'concurrency').replace('_', ' ')} {r['concurrency']} | {r['requests']} "
        f"| {r['requests_per_s']:.2f} | {r['text_deltas_per_s']:.1f} "
        f"| {r['ttft_p50_ms']:.0f} ms | {r['ttft_p99_ms']:.0f} ms "
        f"| {r['itl_p50_ms']:.1f} ms | {r['itl_p99_ms']:.1f} ms "
        f"| {r['e2e_p50_ms']:.0f} ms | {r['e2e_p99_ms']:.0f} ms |\n"
        for r in rows
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.analyzer", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="gRPC address of a running server (default: start one on free ports)")
    p.add_argument("--out", type=Path, default=Path("build/perf"), help="output directory")
    p.add_argument("--concurrency", default="1:4:1", help="perf_analyzer --concurrency-range")
    p.add_argument("--request-rate", help="perf_analyzer --request-rate-range (requests/s), instead of concurrency")
    p.add_argument(
        "--workload",
        type=Path,
        help="input data from a workload file (every turn as a one-off request) instead of corpus questions",
    )
    p.add_argument("--requests", type=int, default=24, help="requests per measurement window")
    p.add_argument("--questions", type=int, default=200, help="corpus questions in the input data")
    args = p.parse_args(argv)

    data = (
        write_workload_data(args.out / "input_data.json", args.workload)
        if args.workload
        else write_input_data(args.out / "input_data.json", args.questions)
    )
    stack = None
    url = args.url
    if url is None:
        from switchboard.ops.launch import Ports, Stack

        stack = Stack(Ports.free(), run_dir=args.out / "run")
        print("starting redis-server and tritonserver on free ports ...", flush=True)
        stack.start()
        url = stack.grpc_url
    try:
        sweep = f"request rate {args.request_rate}" if args.request_rate else f"concurrency {args.concurrency}"
        print(f"perf_analyzer -m chat --streaming against {url}, {sweep} ...", flush=True)
        export = args.out / "profile_export.json"
        proc = run_perf_analyzer(url, data, args.concurrency, export, args.requests, request_rate=args.request_rate)
        (args.out / "perf_analyzer.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
    finally:
        if stack is not None:
            stack.stop()
    rows = llm_metrics(export)
    source = f"workload {args.workload}" if args.workload else "corpus questions, max_new_tokens 48"
    report = (
        f"# perf_analyzer: chat (gRPC streaming, {source})\n\n"
        + markdown(rows)
        + "\nTTFT: request sent to first streamed text delta; ITL: between text deltas; "
        "E2E: to the final response (with stats).\n"
    )
    (args.out / "report.md").write_text(report)
    (args.out / "metrics.json").write_text(json.dumps(rows, indent=2))
    print(report)
    print(f"written: {args.out}/report.md, metrics.json, profile_export.json, perf_analyzer.log")
    return 0


if __name__ == "__main__":
    sys.exit(main())

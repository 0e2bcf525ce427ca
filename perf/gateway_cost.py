"""What the HTTP gateway costs: the same closed-loop streaming load through the gateway
(``POST /v1/chat/completions``) and straight to ``chat`` over gRPC (the SDK), in one run,
phases alternating, both driven by Locust (``perf/locust_gateway.py``, in a process of its own).

Reported per path: median and P90/P99 time to first token as the client sees it, completed
chats/s and generated tokens/s; then the gateway's cost: the median TTFT difference (bound:
2 ms) and the throughput ratio (bound: at least 95%) at ``--users`` concurrent chats, by default
the saturating load of ``make perf`` (4 concurrent streaming chats, ``max_new_tokens`` 48).

    python -m perf.gateway_cost                 # its own stack on free ports
    python -m perf.gateway_cost --grpc-url 127.0.0.1:8001 --gateway-url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from perf.markdown import number
from perf.servertools import wait_http
from switchboard import paths
from switchboard.data import corpus
from switchboard.ops.launch import Ports, Stack, free_port

LOCUSTFILE = Path(__file__).with_name("locust_gateway.py")
CLASSES = {"grpc": "GrpcUser", "http": "GatewayUser"}


def run_phase(path: str, args, grpc_url: str, gateway_url: str, questions: list[str], out: Path, tag: str) -> Path:
    """One Locust run of ``args.warmup_s + args.seconds`` for one path; its samples file."""
    samples = out / f"samples-{tag}-{path}.jsonl"
    samples.unlink(missing_ok=True)
    env = {
        **os.environ,
        "SWITCHBOARD_QUESTIONS": json.dumps(questions, ensure_ascii=False),
        "SWITCHBOARD_MAX_TOKENS": str(args.max_tokens),
        "SWITCHBOARD_SAMPLES": str(samples),
        "SWITCHBOARD_GRPC_URL": grpc_url,
        "PYTHONPATH": str(paths.ROOT),
    }
    cmd = [
        str(Path(sys.executable).with_name("locust")),
        "-f",
        str(LOCUSTFILE),
        CLASSES[path],
        "--headless",
        "--users",
        str(args.users),
        "--spawn-rate",
        str(args.users),
        "--run-time",
        f"{args.warmup_s + args.seconds:g}s",
        "--host",
        gateway_url,
        "--only-summary",
        "--loglevel",
        "WARNING",
        "--csv",
        str(out / f"locust-{tag}-{path}"),
    ]
    with open(out / f"locust-{tag}-{path}.log", "wb") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=out, timeout=args.seconds + 120)
    # Exit code 1: some chats failed (counted from the samples); no samples: Locust itself failed.
    if proc.returncode not in (0, 1) or not samples.exists():
        raise SystemExit(f"locust exited with {proc.returncode}: see {out}/locust-{tag}-{path}.log")
    return samples


def summarize(files: list[Path], warmup_s: float, seconds: float) -> dict:
    """Chats that started after the warm-up; throughput over each run's measured window."""
    ttfts, servers, outside, rates, token_rates, failed = [], [], [], [], [], 0
    for f in files:
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        if not rows:
            continue
        start = min(r["t0"] for r in rows) + warmup_s
        end = start + seconds
        window = [r for r in rows if start <= r["t0"] and r["end"] <= end]
        ok = [r for r in window if r["ok"]]
        failed += len(window) - len(ok)
        ttfts += [r["ttft_s"] * 1000 for r in ok if r["ttft_s"] is not None]
        timed = [r for r in ok if r["ttft_s"] is not None and r.get("server_ttft_ms") is not None]
        servers += [r["server_ttft_ms"] for r in timed]
        outside += [r["ttft_s"] * 1000 - r["server_ttft_ms"] for r in timed]  # the hops to chat and back
        done = [r for r in rows if r["ok"] and start <= r["end"] <= end]  # finished in the window
        rates.append(len(done) / seconds)
        token_rates.append(sum(r["tokens"] for r in done) / seconds)
    if not ttfts:
        raise SystemExit(f"no successful chats in {', '.join(map(str, files))}")
    q = statistics.quantiles(ttfts, n=100)
    return {
        "chats": len(ttfts),
        "failed": failed,
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p90_ms": q[89],
        "ttft_p99_ms": q[98],
        "chat_ttft_p50_ms": statistics.median(servers) if servers else None,
        "outside_chat_p50_ms": statistics.median(outside) if outside else None,
        "chats_per_s": statistics.mean(rates),
        "tokens_per_s": statistics.mean(token_rates),
    }


def _delta(h: dict, g: dict, key: str) -> float | None:
    return None if h.get(key) is None or g.get(key) is None else h[key] - g[key]


def per_round(files: dict[str, list[Path]], warmup_s: float, seconds: float) -> list[dict]:
    """Each round's gateway cost on its own: how much of the whole run's figure is noise."""
    out = []
    for grpc_file, http_file in zip(files["grpc"], files["http"]):
        g, h = summarize([grpc_file], warmup_s, seconds), summarize([http_file], warmup_s, seconds)
        out.append(
            {
                "ttft_p50_delta_ms": h["ttft_p50_ms"] - g["ttft_p50_ms"],
                "throughput_ratio": h["chats_per_s"] / g["chats_per_s"],
            }
        )
    return out


def report(results: dict, args, extra: str) -> str:
    g, h = results["grpc"], results["http"]
    delta = h["ttft_p50_ms"] - g["ttft_p50_ms"]
    ratio = h["chats_per_s"] / g["chats_per_s"]
    lines = [
        f"Locust {args.users} users, closed loop, streaming, corpus questions, max_tokens {args.max_tokens}, "
        f"{args.rounds} rounds x {args.seconds:g} s per path (after {args.warmup_s:g} s warm-up), phases alternating"
        f"{extra}",
        "",
        "| path | chats | failed | TTFT P50 | P90 | P99 | in chat P50 | outside chat P50 | chats/s | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, label in (("grpc", "gRPC (SDK) to chat"), ("http", "HTTP gateway, /v1/chat/completions")):
        r = results[name]
        lines.append(
            f"| {label} | {r['chats']} | {r['failed']} | {r['ttft_p50_ms']:.2f} ms | {r['ttft_p90_ms']:.1f} ms | "
            f"{r['ttft_p99_ms']:.1f} ms | {number(r['chat_ttft_p50_ms'], 2, ' ms')} "
            f"| {number(r['outside_chat_p50_ms'], 2, ' ms')} | "
            f"{r['chats_per_s']:.1f} | {r['tokens_per_s']:.0f} |"
        )
    rounds = results.get("rounds", [])
    lines += [
        "",
        f"gateway cost: median TTFT {delta:+.2f} ms (bound +2 ms: {'met' if delta <= 2 else 'NOT met'}), "
        f"throughput {ratio:.1%} of gRPC (bound 95%: {'met' if ratio >= 0.95 else 'NOT met'})",
    ]
    if rounds:
        lines.append(
            "per round: median TTFT "
            + ", ".join(f"{r['ttft_p50_delta_ms']:+.2f}" for r in rounds)
            + " ms; throughput "
            + ", ".join(f"{r['throughput_ratio']:.1%}" for r in rounds)
        )
    outside = _delta(h, g, "outside_chat_p50_ms")
    if outside is not None:
        lines.append(
            f"outside chat (client TTFT minus chat's own, per chat): median {outside:+.2f} ms through the gateway; "
            f"in chat: {_delta(h, g, 'chat_ttft_p50_ms'):+.2f} ms"
        )
    results["cost"] = {
        "ttft_p50_delta_ms": delta,
        "outside_chat_delta_ms": outside,
        "throughput_ratio": ratio,
        "met": delta <= 2 and ratio >= 0.95,
    }
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.gateway_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--grpc-url", help="a running stack's gRPC endpoint (default: start one on free ports)")
    p.add_argument("--gateway-url", help="a running gateway in front of it (default: start one on a free port)")
    p.add_argument("--users", type=int, default=4, help="concurrent chats (default 4: make perf's saturating load)")
    p.add_argument("--seconds", type=float, default=20, help="measured seconds per path and round (default 20)")
    p.add_argument("--warmup-s", type=float, default=5, help="seconds of load before measuring (default 5)")
    p.add_argument("--rounds", type=int, default=4, help="rounds, each measuring both paths (default 4)")
    p.add_argument("--max-tokens", type=int, default=48, help="max_tokens of every chat (default 48)")
    p.add_argument("--questions", type=int, default=200, help="corpus questions, asked in turn (default 200)")
    p.add_argument("--out", type=Path, default=paths.BUILD / "gateway-cost", help="samples and report")
    p.add_argument("--check", action="store_true", help="exit 1 when a bound is not met")
    args = p.parse_args(argv)
    args.out = args.out.resolve()  # Locust runs in it
    args.out.mkdir(parents=True, exist_ok=True)
    questions = corpus.sample_questions(corpus.load(), args.questions, seed=0)

    stack = gateway = None
    try:
        grpc_url = args.grpc_url
        if grpc_url is None:
            print("starting a stack on free ports ...", flush=True)
            stack = Stack(Ports.free(), run_dir=args.out / "run").start()
            grpc_url = stack.grpc_url
        gateway_url = args.gateway_url
        if gateway_url is None:
            port = free_port()
            gateway_url = f"http://127.0.0.1:{port}"
            cmd = [sys.executable, "-m", "switchboard.gateway", "--port", str(port), "--grpc-url", grpc_url]
            cmd += ["--max-inflight", "100000"]
            gateway = subprocess.Popen(cmd, stdout=open(args.out / "gateway.log", "wb"), stderr=subprocess.STDOUT)
        wait_http(f"{gateway_url}/readyz", 60)
        files: dict[str, list[Path]] = {"grpc": [], "http": []}
        for r in range(args.rounds):
            for path in ("grpc", "http") if r % 2 == 0 else ("http", "grpc"):
                print(f"round {r + 1}/{args.rounds}: {path} ...", flush=True)
                files[path].append(run_phase(path, args, grpc_url, gateway_url, questions, args.out, f"r{r}"))
        results = {path: summarize(fs, args.warmup_s, args.seconds) for path, fs in files.items()}
        results["rounds"] = per_round(files, args.warmup_s, args.seconds)
        where = " (own stack and gateway on free ports)" if stack and gateway else ""
        text = report(results, args, where)
        (args.out / "report.md").write_text(text)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
        print(text, end="")
        return 1 if args.check and not results["cost"]["met"] else 0
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(15)
        if stack is not None:
            stack.stop()


if __name__ == "__main__":
    sys.exit(main())

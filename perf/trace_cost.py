"""What traces cost: the same closed-loop streaming load through two gateways in front of one
stack, one sampling 0% of its chats, the other 100%, phases alternating, driven by Locust as
``gateway-cost`` drives it (``perf/locust_gateway.py``).

The stack's models and both gateways export to a real receiver (Arize Phoenix on free ports,
``make traces-receiver`` installs it). Sampling is decided at the gateway and followed by
``chat`` and the pools (switchboard/common/tracing.py), so a 0% chat carries an unsampled
context through every hop and records nothing, which is what ``SWITCHBOARD_TRACE_SAMPLING=0``
costs in production. Reported per sampling: time to first token (P50/P90/P99), chats/s and
tokens/s, and the spans the receiver got and those dropped.

    python -m perf trace-cost                  # ~4 min on 2 cores: own stack, gateways, Phoenix
    python -m perf trace-cost --rounds 4 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from perf.gateway_cost import run_phase, summarize
from perf.servertools import wait_http
from switchboard import paths
from switchboard.data import corpus
from switchboard.ops import traces
from switchboard.ops.launch import Ports, Stack, free_port, free_ports

SAMPLINGS = ("0", "1")


def start_gateway(grpc_url: str, env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "switchboard.gateway", "--port", str(port), "--grpc-url", grpc_url]
    proc = subprocess.Popen(
        [*cmd, "--max-inflight", "100000"], env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT
    )
    return proc, f"http://127.0.0.1:{port}"


class Discard(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that takes every export and keeps nothing (``--receiver discard``):
    what tracing costs Switchboard's processes without a receiver's own work on the same cores."""

    received = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        Discard.received += 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def start_discard() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Discard)
    threading.Thread(target=server.serve_forever, name="discard", daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def settled_count(count, timeout_s: float = 120) -> int:
    """``count()`` once it stopped growing for 3 s (the receiver ingests after it answered)."""
    deadline, last, since = time.monotonic() + timeout_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        n = count()
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= 3:
            break
        time.sleep(0.5)
    return last


def dropped_spans(metrics_port: int) -> int:
    """``switchboard_trace_spans_dropped_total`` over the server's models."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return int(sum(float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith("switchboard_trace_spans_dropped_total")))


def report(results: dict, args) -> str:
    lines = [
        f"Locust {args.users} users, closed loop, streaming, corpus questions, max_tokens {args.max_tokens}, "
        f"{args.rounds} rounds x {args.seconds:g} s per sampling (after {args.warmup_s:g} s warm-up), phases "
        f"alternating; one stack ({args.repository}), a gateway per sampling, all exporting to {args.receiver}",
        "",
        "| sampling | chats | failed | TTFT P50 | P90 | P99 | chats/s | tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in SAMPLINGS:
        r = results[s]
        lines.append(
            f"| {float(s):.0%} | {r['chats']} | {r['failed']} | {r['ttft_p50_ms']:.2f} ms | "
            f"{r['ttft_p90_ms']:.1f} ms | {r['ttft_p99_ms']:.1f} ms | {r['chats_per_s']:.2f} | "
            f"{r['tokens_per_s']:.0f} |"
        )
    off, on = results["0"], results["1"]
    lines += [
        "",
        f"100% vs 0%: median TTFT {on['ttft_p50_ms'] - off['ttft_p50_ms']:+.2f} ms, "
        f"throughput {on['chats_per_s'] / off['chats_per_s']:.1%}; {results['received']} at the receiver, "
        f"spans dropped by the models {results['dropped']}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.trace_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=4, help="concurrent chats (default 4: make perf's saturating load)")
    p.add_argument("--seconds", type=float, default=20, help="measured seconds per sampling and round (default 20)")
    p.add_argument("--warmup-s", type=float, default=5, help="seconds of load before measuring (default 5)")
    p.add_argument("--rounds", type=int, default=2, help="rounds, each measuring both samplings (default 2)")
    p.add_argument("--max-tokens", type=int, default=48, help="max_tokens of every chat (default 48)")
    p.add_argument("--questions", type=int, default=200, help="corpus questions, asked in turn (default 200)")
    p.add_argument("--out", type=Path, default=paths.BUILD / "trace-cost", help="samples and report")
    p.add_argument(
        "--receiver",
        choices=["phoenix", "discard"],
        default="phoenix",
        help="phoenix (default; on the same cores) or discard: an OTLP endpoint that keeps nothing",
    )
    p.add_argument(
        "--repository", type=Path, default=paths.MODEL_REPOSITORY, help="the model repository to serve (default: ours)"
    )
    args = p.parse_args(argv)
    if args.receiver == "phoenix" and traces.executable() is None:
        raise SystemExit(f"{traces.PHOENIX} is not installed: make traces-receiver")
    args.out = args.out.resolve()  # Locust runs in it
    args.out.mkdir(parents=True, exist_ok=True)
    questions = corpus.sample_questions(corpus.load(), args.questions, seed=0)

    phoenix = stack = discard = None
    gateways: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        print(f"starting {args.receiver}, a stack and two gateways on free ports ...", flush=True)
        if args.receiver == "phoenix":
            phoenix = traces.Phoenix(args.out / "phoenix", *free_ports(2)).start()
            url = phoenix.url
        else:
            discard, url = start_discard()
        endpoint = {"SWITCHBOARD_TRACE_ENDPOINT": url}
        # chat and the pools follow the gateway's decision; their own ratio only matters for a
        # request that comes without a context (none here)
        stack = Stack(Ports.free(), repository=args.repository, run_dir=args.out / "run", env=endpoint).start()
        for s in SAMPLINGS:
            env = {**os.environ, **endpoint, "SWITCHBOARD_TRACE_SAMPLING": s}
            gateways[s] = start_gateway(stack.grpc_url, env, args.out / f"gateway-{s}.log")
        for _, url in gateways.values():
            wait_http(f"{url}/readyz", 60)
        files: dict[str, list[Path]] = {s: [] for s in SAMPLINGS}
        for r in range(args.rounds):
            for s in SAMPLINGS if r % 2 == 0 else SAMPLINGS[::-1]:
                print(f"round {r + 1}/{args.rounds}: sampling {float(s):.0%} ...", flush=True)
                url = gateways[s][1]
                files[s].append(run_phase("http", args, stack.grpc_url, url, questions, args.out, f"r{r}-s{s}"))
        results: dict = {s: summarize(fs, args.warmup_s, args.seconds) for s, fs in files.items()}
        results["dropped"] = dropped_spans(stack.ports.metrics)
        if phoenix is not None:
            results["received"] = f"{settled_count(lambda: len(phoenix.spans()))} spans"
        else:
            results["received"] = f"{Discard.received} exports"
        text = report(results, args)
        (args.out / "report.md").write_text(text)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
        print(text, end="")
    finally:
        for proc, _ in gateways.values():
            proc.terminate()
            proc.wait(15)
        if stack is not None:
            stack.stop()
        if phoenix is not None:
            phoenix.stop()
        if discard is not None:
            discard.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

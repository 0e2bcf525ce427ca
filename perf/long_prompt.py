"""Does a long prompt freeze the chats already decoding? ``python -m perf.long_prompt``.

For each ``--budgets`` value (the pools' ``prefill_budget``; 0 = whole prompts in one pass) a
private stack on free ports serves ``--artifacts``; ``--decoders`` streams decode in
``engine_short`` (short prompts, long answers, every token sent as it comes:
``stream_interval_ms`` 0), and meanwhile ``--long`` prompts of ``--long-tokens`` tokens arrive
at the same pool one after another. The decoders' inter-token gaps that overlap a long prompt's time in
the pool give P50 / P99 / max per budget, with the long prompts' time to their first token.
Talks to the pool directly over gRPC (as ``chat`` does), so the random-weight model's token ids
need no detokenizing. Writes ``long_prompt.json`` and ``long_prompt.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

from perf.stats import percentile
from switchboard import paths
from switchboard.wire import Pool


def stream(url: str, ids: list[int], max_new_tokens: int, times: list[float], done: threading.Event) -> None:
    """One generation on ``engine_short``; appends the arrival time of every token response."""
    import tritonclient.grpc as grpcclient

    from switchboard.client.sync import close_stream

    client = grpcclient.InferenceServerClient(url)
    inputs = [
        grpcclient.InferInput(Pool.INPUT_IDS, [1, len(ids)], "INT32"),
        grpcclient.InferInput(Pool.MAX_NEW_TOKENS, [1, 1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.asarray([ids], np.int32))
    inputs[1].set_data_from_numpy(np.asarray([[max_new_tokens]], np.int32))

    def callback(result, error):
        if error is not None:
            done.set()
            return
        now = time.perf_counter()
        out = result.as_numpy(Pool.TOKEN_IDS)
        if out is not None and out.size:
            times.append(now)
        if result.as_numpy(Pool.STATS) is not None:
            done.set()

    client.start_stream(callback=callback)
    outputs = [grpcclient.InferRequestedOutput(Pool.TOKEN_IDS), grpcclient.InferRequestedOutput(Pool.STATS)]
    client.async_stream_infer("engine_short", inputs, outputs=outputs)
    answered = done.wait(600)
    close_stream(client, cancel=not answered)  # an answered stream is ended, not cancelled (docs/voice.md)
    client.close()


def overlapping_gaps(times: list[list[float]], windows: list[tuple[float, float]]) -> list[float]:
    """Each stream's gaps between tokens (ms) that overlap one of ``windows``: a stream frozen by
    a prefill shows one long gap spanning it."""
    return [(b - a) * 1000 for ts in times for a, b in zip(ts, ts[1:]) if any(a < hi and b > lo for lo, hi in windows)]


def measure(url: str, decoders: int, long: int, long_tokens: int, vocab: int) -> dict:
    rng = np.random.default_rng(0)
    times: list[list[float]] = [[] for _ in range(decoders)]
    events = [threading.Event() for _ in range(decoders)]
    threads = [
        threading.Thread(target=stream, args=(url, rng.integers(5, vocab, 40).tolist(), 2000, times[i], events[i]))
        for i in range(decoders)
    ]
    for t in threads:
        t.start()
    while min(len(t) for t in times) < 5:  # all decoding
        time.sleep(0.05)
    windows, firsts = [], []
    for _ in range(long):
        first: list[float] = []
        done = threading.Event()
        t0 = time.perf_counter()
        stream(url, rng.integers(5, vocab, long_tokens).tolist(), 1, first, done)
        windows.append((t0, time.perf_counter()))
        firsts.append((first[0] - t0) * 1000 if first else float("nan"))
        time.sleep(1.0)  # decoding alone between long prompts
    for e in events:
        e.set()
    for t in threads:
        t.join()
    gaps = overlapping_gaps(times, windows)
    alone = [(b - a) * 1000 for ts in times for a, b in zip(ts, ts[1:]) if b < windows[0][0]]
    return {
        "gaps": len(gaps),
        "itl_p50_ms": percentile(gaps, 50),
        "itl_p99_ms": percentile(gaps, 99),
        "itl_max_ms": float(max(gaps)) if gaps else float("nan"),
        "itl_alone_p50_ms": percentile(alone, 50),
        "long_first_token_ms": float(np.nanmean(firsts)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.long_prompt", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifacts", type=Path, default=paths.ARTIFACTS / "large-model", help="exported model to serve")
    p.add_argument("--budgets", default="0,64", help="prefill_budget values to compare")
    p.add_argument("--decoders", type=int, default=4, help="chats decoding meanwhile")
    p.add_argument("--long", type=int, default=4, help="long prompts, one after another")
    p.add_argument("--long-tokens", type=int, default=400)
    p.add_argument("--out", type=Path, default=paths.BUILD / "long-prompt")
    args = p.parse_args(argv)
    from perf.servertools import repository_with
    from switchboard.artifact.manifest import Manifest
    from switchboard.ops.launch import Ports, Stack

    manifest = Manifest.load(args.artifacts)
    vocab = min(manifest.vocab_size, 4096)
    args.out.mkdir(parents=True, exist_ok=True)
    repository = repository_with(args.artifacts, args.out / "repository")
    result = {
        "command": "python -m perf.long_prompt " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": manifest.name,
        "decoders": args.decoders,
        "long": args.long,
        "long_tokens": args.long_tokens,
        "budgets": {},
    }
    for budget in (int(b) for b in args.budgets.split(",")):
        env = {
            "SWITCHBOARD_PREFILL_BUDGET": str(budget),
            "SWITCHBOARD_STREAM_INTERVAL_MS": "0",
            "SWITCHBOARD_LONG_PROMPT_TOKENS": "1000000",  # everything in engine_short, where we measure
        }
        stack = Stack(Ports.free(), repository=repository, run_dir=args.out / "run", env=env)
        stack.start()
        try:
            r = measure(stack.grpc_url, args.decoders, args.long, args.long_tokens, vocab)
        finally:
            stack.stop()
        result["budgets"][budget] = r
        print(
            f"prefill_budget {budget}: decoders' gaps during long prompts P50 {r['itl_p50_ms']:.0f} ms, "
            f"P99 {r['itl_p99_ms']:.0f} ms, max {r['itl_max_ms']:.0f} ms (alone {r['itl_alone_p50_ms']:.0f} ms); "
            f"long prompt's first token {r['long_first_token_ms']:.0f} ms",
            flush=True,
        )
    md = [
        f"# Chats decoding while {args.long_tokens}-token prompts arrive ({manifest.name})",
        "",
        f"`{result['command']}`: {args.decoders} chats decoding in one pool, {args.long} long prompts one after "
        "another; the decoders' inter-token gaps that overlap a long prompt's time in the pool.",
        "",
        "| prefill_budget | gaps | P50 | P99 | max | decoding alone P50 | long prompt's first token |",
        "|---|---|---|---|---|---|---|",
    ]
    for b, r in result["budgets"].items():
        md.append(
            f"| {b} | {r['gaps']} | {r['itl_p50_ms']:.0f} ms | {r['itl_p99_ms']:.0f} ms | {r['itl_max_ms']:.0f} ms | "
            f"{r['itl_alone_p50_ms']:.0f} ms | {r['long_first_token_ms']:.0f} ms |"
        )
    (args.out / "long_prompt.json").write_text(json.dumps(result, indent=1))
    (args.out / "long_prompt.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())

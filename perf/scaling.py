"""Served tokens/s against concurrency, next to the bare runtime: ``python -m perf.scaling``.

Closed loop: at each concurrency C, C clients send one-off chats (a new session each, one
question, ``--max-new-tokens`` answers, greedy) back to back for ``--seconds``. Per level:

- tokens/s: all generated tokens over the level's wall time (prefill included);
- decode tokens/s: tokens after each chat's first over the wall time less the seconds the
  engines spent in prefill passes (their ``prefill_s`` counter): the rate the served system
  decodes at, which is what the bare runtime's decode loop measures;
- decode steps by batch size, from the engines' counters (full batches: all at C);
- the bare ONNX Runtime decode loop at batch 1 and 8 (``--bare``), the same graph and threads,
  cache as long as a served chat's, in the same run after the server stopped.

Starts a private stack on free ports from ``--artifacts`` (the repository's configs with those
artifacts in place) unless ``--url`` names a running one. Writes ``scaling.json`` and
``scaling.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

from perf.servertools import metric_delta, repository_with, scrape
from switchboard import paths
from switchboard.client import ChatClient, ChatStats

QUESTIONS = [
    "我的订单什么时候发货？",
    "How do I return a damaged item?",
    "优惠券为什么用不了？",
    "Can I change the delivery address after paying?",
    "退款多久到账？",
    "Do you ship to Hong Kong?",
    "会员积分怎么兑换？",
    "My package says delivered but I did not get it.",
]


# A long first message (~230 tokens with the system prompt): routed to engine_long.
LONG_QUESTION = (
    "我上周在你们店买了一台洗衣机，订单号是 20261111-88231，送到的时候外箱破了一个角，里面的控制面板也有划痕。"
    "快递员说让我找商家处理，我打了两次客服电话都没有人接。I also ordered a dryer in the same order and it has "
    "not arrived yet, the tracking page has said 'in transit' for six days. 请问洗衣机可以换新还是只能退货？"
    "如果退货，运费谁来出？烘干机什么时候能到？我下周要出差，能不能约周末送货？Please also tell me whether "
    "the coupon I used will be returned if I cancel the dryer, and how long the refund takes to reach my card."
)


def engine_counters(metrics_port: int) -> dict:
    return metric_delta({}, scrape(metrics_port))


def _sum_pools(before: dict, after: dict) -> dict:
    out = {"batch_steps": {}, "prefill_s": 0.0, "decode_s": 0.0, "prefill_chunks": 0.0}
    for pool, d in after.items():
        b = before.get(pool, {})
        for key in ("prefill_s", "decode_s", "prefill_chunks"):
            out[key] += d.get(key, 0.0) - b.get(key, 0.0)
        for size, n in d.get("batch_steps", {}).items():
            delta = n - b.get("batch_steps", {}).get(size, 0)
            if delta:
                out["batch_steps"][size] = out["batch_steps"].get(size, 0) + delta
    return out


STEADY_FROM_S = 5.0  # the steady window starts this long after the clients


def steady_window(metrics_port: int, t0: float, stop_at: float, out: dict) -> None:
    """Decode tokens/s between ``t0 + STEADY_FROM_S`` and ``stop_at`` (when the clients stop
    starting chats), from the engines' counters: the served rate at a full load, without the
    first chats' ramp or the last ones' drain at shrinking batches, which the bare loop (a
    constant batch) does not have. Fills ``out``."""
    time.sleep(max(0.0, t0 + STEADY_FROM_S - time.monotonic()))
    a, ta = engine_counters(metrics_port), time.monotonic()
    time.sleep(max(0.0, stop_at - time.monotonic()))
    b, tb = engine_counters(metrics_port), time.monotonic()
    d = _sum_pools(a, b)
    rows = sum(int(size) * n for size, n in d["batch_steps"].items())
    steps = sum(d["batch_steps"].values())
    seconds = tb - ta
    out.update(
        seconds=seconds,
        decode_tokens_per_s=rows / max(seconds - d["prefill_s"], 1e-9),
        mean_decode_batch=rows / steps if steps else float("nan"),
    )


def level(
    url: str,
    metrics_port: int | None,
    concurrency: int,
    seconds: float,
    max_new_tokens: int,
    long_workers: int = 0,
    memory=None,
) -> dict:
    """``concurrency`` clients of short questions, and ``long_workers`` more of long ones;
    ``memory()``, when given, is sampled every 5 s and the largest total kept."""
    stats: list[ChatStats] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def worker(w: int) -> None:
        client = ChatClient(url, timeout_s=300)
        k = 0
        while time.monotonic() < stop_at:
            k += 1
            try:
                reply = client.chat(
                    LONG_QUESTION + f" ({k})" if w >= concurrency else QUESTIONS[(w + k) % len(QUESTIONS)],
                    session_id=f"scaling-c{concurrency}-w{w}-{k}-{time.time_ns()}",
                    stream=False,
                    max_new_tokens=max_new_tokens,
                    temperature=0.0,
                )
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(str(e)[:200])
                continue
            with lock:
                stats.append(reply.stats)

    before = engine_counters(metrics_port) if metrics_port else {}
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency + long_workers)]
    for t in threads:
        t.start()
    window: dict = {}  # the engines' counters in the steady window (not the ramp, not the drain)
    if metrics_port:
        watcher = threading.Thread(target=steady_window, args=(metrics_port, t0, stop_at, window), daemon=True)
        watcher.start()
    peak = None
    while memory is not None and any(t.is_alive() for t in threads):
        sample = memory()
        if peak is None or sample["total_mib"] > peak["total_mib"]:
            peak = sample
        time.sleep(5)
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    time.sleep(1.5 if metrics_port else 0)  # the engines publish their counters once a second
    after = engine_counters(metrics_port) if metrics_port else {}
    engine = _sum_pools(before, after) if metrics_port else {}
    by_pool = {}
    for pool in after:
        one = _sum_pools({pool: before.get(pool, {})}, {pool: after[pool]})
        rows = sum(int(b) * n for b, n in one["batch_steps"].items())
        steps = sum(one["batch_steps"].values())
        by_pool[pool] = {
            "decode_tokens_per_s": rows / wall,
            "decode_s": one["decode_s"],
            "prefill_s": one["prefill_s"],
            "decode_step_ms": 1000 * one["decode_s"] / steps if steps else float("nan"),
            "mean_decode_batch": rows / steps if steps else float("nan"),
        }
    if metrics_port:
        watcher.join()
    served = [s for s in stats if s and not s.fallback]
    tokens = sum(s.generated_tokens for s in served)
    decode_tokens = sum(max(0, s.generated_tokens - 1) for s in served)
    prefill_s = engine.get("prefill_s", 0.0)
    steps = engine.get("batch_steps", {})
    return {
        "concurrency": concurrency,
        "long_workers": long_workers,
        "memory_peak": peak,
        "by_pool": by_pool,
        "chats": len(served),
        "fallback": len(stats) - len(served),
        "errors": len(errors),
        "error_examples": errors[:3],
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "decode_tokens_per_s": decode_tokens / max(wall - prefill_s, 1e-9),
        "prefill_share": prefill_s / wall,
        "chat_p50_ms": float(np.median([s.total_ms for s in served if s.total_ms is not None] or [np.nan])),
        "prompt_tokens_mean": float(np.mean([s.prompt_tokens for s in served] or [np.nan])),
        "steady": window,
        "batch_steps": {int(k): int(v) for k, v in sorted(steps.items())},
        "mean_decode_batch": sum(int(b) * n for b, n in steps.items()) / max(1, sum(steps.values())),
        "engine": engine,
    }


def stack_memory(stack, artifacts: Path, precision: str) -> dict:
    """PSS of every process of the stack (shared pages counted once in the sum) against the model file."""
    from perf.loadtools import pss_kib
    from switchboard.artifact.manifest import Manifest
    from switchboard.ops.launch import children

    pids = {"tritonserver": stack.triton.pid, "redis-server": stack.redis.pid, **children(stack.triton.pid)}
    mib = {name: (pss_kib(pid) or 0) / 1024 for name, pid in pids.items()}
    model = Manifest.load(artifacts).variant(precision)["bytes"] / 2**20
    serving = sum(v for k, v in mib.items() if k != "redis-server")  # Redis holds the sessions' KV: data
    return {
        "pss_mib": mib,
        "total_mib": sum(mib.values()),
        "model_mib": model,
        "ratio": sum(mib.values()) / model,
        "serving_ratio": serving / model,
    }


def bare(artifacts: Path, precision: str, past: int, batches: tuple[int, ...], steps: int = 32) -> dict:
    """The bare runtime's decode loop: ``steps`` decode steps at each batch size, the cache
    growing by one column per step from ``past``, on the pools' threads and shared weights;
    the median step (after three warm-up steps)."""
    from switchboard.artifact.manifest import Manifest
    from switchboard.engine.runtime import OnnxDecoder
    from switchboard.engine.sizing import MANY_THREADS_FROM_BYTES
    from switchboard.runtime.onnx import auto_threads, weights_cache

    manifest = Manifest.load(artifacts)
    threads = auto_threads(manifest.variant(precision).get("bytes", 0), MANY_THREADS_FROM_BYTES)
    decoder = OnnxDecoder(artifacts, manifest, precision, threads=threads, weights_cache=weights_cache(""))
    shape = (manifest.num_kv_heads, past, manifest.head_dim)
    out = {"threads": threads, "past": past}
    for b in batches:
        kv = [(np.zeros((b, *shape), decoder.dtype), np.zeros((b, *shape), decoder.dtype))] * manifest.num_layers
        ids = np.ones((b, 1), np.int64)
        for _ in range(3):  # warm
            decoder.forward(ids, np.ones((b, past + 1), np.int64), np.full((b, 1), past), kv)
        times = []
        for i in range(steps):
            mask = np.ones((b, past + i + 1), np.int64)
            t0 = time.perf_counter()
            logits, kv = decoder.forward(ids, mask, np.full((b, 1), past + i), kv)
            ids = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
            times.append(time.perf_counter() - t0)
        dt = float(np.median(times))
        out[f"batch_{b}"] = {"step_ms": dt * 1000, "tokens_per_s": b / dt}
    return out


def markdown(result: dict) -> str:
    lines = [
        f"# Served tokens/s against concurrency ({result['model']}, {result['precision']})",
        "",
        f"`{result['command']}`, {result['started']}; one-off chats, {result['max_new_tokens']}-token answers, "
        f"{result['seconds']:g} s per level.",
        "",
        "| concurrency | chats | tokens/s | decode tokens/s | steady decode tokens/s (batch) | prefill share | "
        "chat P50 | mean decode batch | decode steps by batch size |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["levels"]:
        w = r.get("steady") or {}
        steady = f"{w['decode_tokens_per_s']:.1f} ({w['mean_decode_batch']:.2f})" if w else "-"
        lines.append(
            f"| {r['concurrency']} | {r['chats']} | {r['tokens_per_s']:.1f} | {r['decode_tokens_per_s']:.1f} | "
            f"{steady} | {100 * r['prefill_share']:.0f}% | {r['chat_p50_ms']:.0f} ms | {r['mean_decode_batch']:.2f} | "
            f"{', '.join(f'{b}: {n}' for b, n in r['batch_steps'].items())} |"
        )
    if result.get("both_pools"):
        lines += [
            "",
            "Both pools: each pool's decode tokens/s alone and with the other busy (short clients + long clients):",
            "",
            "| short + long clients | engine_short tokens/s | its decode step (mean batch) | engine_long tokens/s "
            "| its decode step (mean batch) | passes in flight |",
            "|---|---|---|---|---|---|",
        ]
        for r in [x for x in result["levels"] if x["concurrency"] == result["both_pools"][-1]["concurrency"]][-1:] + [
            *result["both_pools"]
        ]:
            cells = []
            for pool in ("engine_short", "engine_long"):
                d = r["by_pool"].get(pool, {})
                cells += [
                    f"{d.get('decode_tokens_per_s', 0.0):.1f}",
                    f"{d.get('decode_step_ms', float('nan')):.0f} ms ({d.get('mean_decode_batch', float('nan')):.1f})",
                ]
            busy = sum(d.get("decode_s", 0.0) + d.get("prefill_s", 0.0) for d in r["by_pool"].values()) / r["wall_s"]
            lines.append(f"| {r['concurrency']} + {r.get('long_workers', 0)} | {' | '.join(cells)} | {busy:.2f} |")
    memory = [("after the first chat", result.get("memory_warm"))]
    memory += [(f"peak at concurrency {r['concurrency']}", r.get("memory_peak")) for r in result["levels"]]
    memory += [
        (f"peak at {r['concurrency']} + {r['long_workers']} long", r.get("memory_peak"))
        for r in result.get("both_pools", [])
    ]
    memory = [(when, m) for when, m in memory if m]
    if memory:
        lines += [
            "",
            "Memory: PSS of the stack's processes (shared pages counted once) against the "
            f"{memory[0][1]['model_mib']:.0f} MiB model file; Redis holds the sessions' KV, which grows with "
            "sessions (its TTL and maxmemory bound it).",
            "",
            "| when | tritonserver + chat + pools | with Redis | MiB by process |",
            "|---|---|---|---|",
        ]
        for when, m in memory:
            parts = ", ".join(f"{k} {v:.0f}" for k, v in m["pss_mib"].items())
            lines.append(f"| {when} | **{m['serving_ratio']:.2f}x** | {m['ratio']:.2f}x | {parts} |")
    if result.get("bare"):
        b = result["bare"]
        lines += ["", f"Bare ONNX Runtime decode loop ({b['threads']} threads, cache from {b['past']} columns):", ""]
        for key, v in b.items():
            if key.startswith("batch_"):
                lines.append(f"- batch {key[6:]}: {v['step_ms']:.0f} ms per step, {v['tokens_per_s']:.1f} tokens/s")
        levels = {r["concurrency"]: r for r in result["levels"]}

        def steady(c: int) -> float:
            return (levels[c].get("steady") or {}).get("decode_tokens_per_s", float("nan"))

        if 8 in levels and "batch_8" in b:
            lines.append(
                f"- served decode at concurrency 8 / bare batch 8: "
                f"{levels[8]['decode_tokens_per_s'] / b['batch_8']['tokens_per_s']:.2f} over the level, "
                f"{steady(8) / b['batch_8']['tokens_per_s']:.2f} in the steady window"
            )
        if 8 in levels and 1 in levels:
            lines.append(
                f"- served decode, concurrency 8 / concurrency 1: "
                f"{levels[8]['decode_tokens_per_s'] / levels[1]['decode_tokens_per_s']:.2f} over the level, "
                f"{steady(8) / steady(1):.2f} in the steady window"
            )
        lines.append(
            f"- the steady window: from {STEADY_FROM_S:g} s after the clients start to when they stop starting "
            "chats (the level's last chats drain at shrinking batches; the bare loop has no ramp or drain)"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifacts", type=Path, default=paths.ARTIFACTS / "large-model", help="exported model to serve")
    p.add_argument("--url", help="a running server's gRPC address instead of a private stack")
    p.add_argument("--metrics-port", type=int, help="with --url: its metrics port (engine counters)")
    p.add_argument("--precision", default="fp32", help="the variant the pools run")
    p.add_argument("--concurrency", default="1,4,8", help="comma-separated concurrency levels")
    p.add_argument("--seconds", type=float, default=40.0, help="duration of each level")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--bare", action="store_true", help="also time the bare runtime's decode loop at batch 1 and 8")
    p.add_argument(
        "--both-pools",
        type=int,
        default=0,
        metavar="N",
        help="then N clients of long questions (engine_long) alone, and beside the last concurrency level's short "
        "ones: each pool's decode tokens/s alone and with the other busy",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="SWITCHBOARD_<KEY> for the stack")
    p.add_argument("--out", type=Path, default=paths.BUILD / "scaling")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from switchboard.artifact.manifest import Manifest

    manifest = Manifest.load(args.artifacts)
    result = {
        "command": "python -m perf.scaling " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": manifest.name,
        "precision": args.precision,
        "max_new_tokens": args.max_new_tokens,
        "seconds": args.seconds,
        "levels": [],
    }
    stack = None
    try:
        if args.url:
            url, metrics_port = args.url, args.metrics_port
        else:
            from switchboard.ops.launch import Ports, Stack

            env = {"SWITCHBOARD_PRECISION": args.precision}
            env.update({f"SWITCHBOARD_{k.upper()}": v for k, v in (s.split("=", 1) for s in args.set)})
            repository = repository_with(args.artifacts, args.out / "repository")
            stack = Stack(Ports.free(), repository=repository, run_dir=args.out / "run", env=env)
            print(f"starting a private stack on {args.artifacts} ...", flush=True)
            stack.start()
            url, metrics_port = stack.grpc_url, stack.ports.metrics
        ChatClient(url, timeout_s=300).chat("hello", stream=False, max_new_tokens=4)  # first-call costs
        if stack is not None:
            result["memory_warm"] = stack_memory(stack, args.artifacts, args.precision)
        levels = [(int(x), 0) for x in args.concurrency.split(",")]
        if args.both_pools:
            levels += [(0, args.both_pools), (levels[-1][0], args.both_pools)]
        for c, n_long in levels:
            sample = (lambda: stack_memory(stack, args.artifacts, args.precision)) if stack is not None else None
            r = level(url, metrics_port, c, args.seconds, args.max_new_tokens, n_long, sample)
            (result["levels"] if not n_long else result.setdefault("both_pools", [])).append(r)
            print(
                f"concurrency {c}+{n_long} long: {r['chats']} chats, {r['tokens_per_s']:.1f} tokens/s, decode "
                f"{r['decode_tokens_per_s']:.1f} tokens/s, mean decode batch {r['mean_decode_batch']:.2f}, "
                f"errors {r['errors']}",
                flush=True,
            )
    finally:
        if stack is not None:
            stack.stop()
    if args.bare:
        prompt = np.nanmean([r["prompt_tokens_mean"] for r in result["levels"]])
        result["bare"] = bare(args.artifacts, args.precision, int(prompt) + args.max_new_tokens // 2, (1, 8))
    (args.out / "scaling.json").write_text(json.dumps(result, indent=1))
    (args.out / "scaling.md").write_text(markdown(result))
    print((args.out / "scaling.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

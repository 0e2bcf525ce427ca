"""KV reuse, measured: ``python -m perf.kv [--artifacts DIR] --out build/kv``.

The same multi-turn sessions (greedy, so every configuration sees the same conversation)
against a private stack per configuration:

  reuse       as committed: blocks in the pool's memory, then Redis
  cold        no KV reuse at all: every prompt prefilled in full (the reference for time to first token)
  redis-only  no local tier (``kv_local_mb`` 0): every reused block read from Redis, in the runtime's dtype
  float16, int8, zstd   the same with the block storage format changed (Redis only, so the format is what
              the answers are computed from)

Per turn: what Redis received and sent (its own byte counters, ``INFO stats``: KV blocks, the
conversation entry and protocol, after the pool's writer has finished), the KV bytes of the
tokens new in that turn, the reused tokens by tier, time to first token. Per configuration:
Redis memory per session. Per format: bytes per block and encode/decode time, and whether the
answers are the native ones. A markdown report and the numbers go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import redis

from switchboard import paths
from switchboard.artifact.manifest import Manifest

TURNS = [
    "Hi, I ordered a pair of running shoes last week (order {n}) and they have not arrived yet. Where is my order?",
    "The tracking page says the parcel is in Shanghai. Can you change the delivery address to my office?",
    "Thanks. If the size is wrong, how do I return them, and how long does the refund take?",
    "One more thing: can I still use my coupon on the next order, or has it expired?",
]
CONFIGS = {
    "reuse": {},
    "cold": {"SWITCHBOARD_KV_REUSE": "false"},
    "redis-only": {"SWITCHBOARD_KV_LOCAL_MB": "0"},
    "float16": {"SWITCHBOARD_KV_LOCAL_MB": "0", "SWITCHBOARD_KV_STORAGE": "float16"},
    "int8": {"SWITCHBOARD_KV_LOCAL_MB": "0", "SWITCHBOARD_KV_STORAGE": "int8"},
    "zstd": {"SWITCHBOARD_KV_LOCAL_MB": "0", "SWITCHBOARD_KV_ZSTD": "true"},
}


class RedisBytes:
    """Bytes in and out of Redis from its own counters, minus what asking costs."""

    def __init__(self, port: int):
        self.r = redis.Redis(port=port)
        a, b = self._raw(), self._raw()
        self.cost = (b[0] - a[0], b[1] - a[1])

    def _raw(self) -> tuple[int, int]:
        s = self.r.info("stats")
        return int(s["total_net_input_bytes"]), int(s["total_net_output_bytes"])

    def read(self) -> tuple[int, int]:
        raw = self._raw()
        return raw[0], raw[1]

    def settled(self, quiet_s: float = 0.4, timeout_s: float = 30.0) -> tuple[int, int]:
        """The counters once nothing but these questions has moved them for ``quiet_s``."""
        last, still_since, deadline = self.read(), time.monotonic(), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.read()
            if now[0] - last[0] > self.cost[0] + 64:
                still_since = time.monotonic()
            last = now
            if time.monotonic() - still_since >= quiet_s:
                break
        return last

    def memory(self) -> int:
        return int(self.r.info("memory")["used_memory"])


def run_config(name: str, env: dict, repository: Path, sessions: int, max_new: int, run_dir: Path) -> dict:
    from switchboard.client import ChatClient
    from switchboard.ops.launch import Ports, Stack

    stack = Stack(Ports.free(), repository=repository, run_dir=run_dir / name, env=env)
    stack.start()
    try:
        client = ChatClient(stack.grpc_url, timeout_s=300)
        meter = RedisBytes(stack.ports.redis)
        client.chat("warm-up", stream=False, max_new_tokens=2)  # first-call costs out of the figures
        meter.settled()
        memory0 = meter.memory()
        turns = []
        for n in range(sessions):
            prev_kv = 0
            for t, text in enumerate(TURNS):
                before = meter.settled()
                reply = client.chat(
                    text.format(n=1000 + n),
                    session_id=f"kv-{n}",
                    stream=True,
                    temperature=0.0,
                    max_new_tokens=max_new,
                )
                parts, stats = [], None
                for event in reply:
                    if isinstance(event, str):
                        parts.append(event)
                    else:
                        stats = event
                after = meter.settled()
                raw = stats.raw
                kv_tokens = raw["prompt_tokens"] + raw["generated_tokens"] - 1
                turns.append(
                    {
                        "session": n,
                        "turn": t + 1,
                        "prompt_tokens": raw["prompt_tokens"],
                        "reused": raw["reused_tokens"],
                        "local_blocks": raw.get("kv_local_blocks", 0),
                        "redis_blocks": raw.get("kv_redis_blocks", 0),
                        "cache_miss": raw.get("cache_miss"),
                        "generated": raw["generated_tokens"],
                        "new_tokens": kv_tokens - prev_kv,
                        "ttft_ms": raw["ttft_ms"],
                        "written": after[0] - before[0] - meter.cost[0] * 3,
                        "read": after[1] - before[1] - meter.cost[1] * 3,
                        "text": "".join(parts),
                    }
                )
                prev_kv = kv_tokens
        return {
            "name": name,
            "env": env,
            "turns": turns,
            "redis_memory_per_session": (meter.memory() - memory0) / sessions,
        }
    finally:
        stack.stop()


def format_costs(manifest: Manifest, repeats: int = 20) -> dict:
    """Bytes per block and encode/decode time of each storage format, on a block of this model's shape."""
    from switchboard.kv.blocks import BlockFormat, chain, model_root

    key = chain(model_root("x", "", 16, "native"), list(range(16)), 16)[0]
    rng = np.random.default_rng(0)
    out = {}
    for name, storage, zstd in (
        ("native", "native", False),
        ("float16", "float16", False),
        ("int8", "int8", False),
        ("zstd", "native", True),
    ):
        fmt = BlockFormat(manifest.num_layers, manifest.num_kv_heads, manifest.head_dim, 16, storage=storage, zstd=zstd)
        kv = rng.standard_normal(fmt.shape).astype(np.float32)
        t0 = time.perf_counter()
        for _ in range(repeats):
            blob = fmt.encode(key, kv)
        t1 = time.perf_counter()
        for _ in range(repeats):
            back = fmt.decode(key, blob)
        t2 = time.perf_counter()
        out[name] = {
            "bytes": len(blob),
            "of_native": len(blob) / fmt.nbytes,
            "encode_ms": (t1 - t0) / repeats * 1000,
            "decode_ms": (t2 - t1) / repeats * 1000,
            "max_abs_error": float(np.abs(back - kv).max()),
        }
    return out


def _per_turn(results: dict, key: str, turn: int) -> list:
    return [r[key] for r in results["turns"] if r["turn"] == turn]


def markdown(result: dict) -> str:
    runs = {r["name"]: r for r in result["runs"]}
    kv_token = result["kv_bytes_per_token"]
    lines = [
        f"# KV reuse ({result['model']})",
        "",
        f"Run {result['started']}, {result['seconds']:.0f} s: `python -m perf.kv {result['args']}`",
        "",
        f"{result['sessions']} sessions x {len(TURNS)} turns, greedy, {result['max_new_tokens']}-token answers; "
        f"KV {kv_token / 1024:.1f} KiB per token. Bytes are Redis's own counters per turn (blocks, the conversation "
        "entry and protocol), after the pool's writes finished; *new KV* is the KV of the tokens the turn added "
        "(its prompt past the last turn's stored tokens, and its answer).",
        "",
        "## Per turn, as committed (`reuse`) and without any reuse (`cold`)",
        "",
        "| turn | prompt tokens | reused (local / Redis blocks) | new KV | written | written / new KV | read "
        "| TTFT | cold TTFT | TTFT / cold |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    reuse, cold = runs.get("reuse"), runs.get("cold")
    for t in range(1, len(TURNS) + 1):
        rs = [r for r in reuse["turns"] if r["turn"] == t]
        cs = [r for r in cold["turns"] if r["turn"] == t] if cold else []
        new_kv = statistics.mean(r["new_tokens"] for r in rs) * kv_token
        written = statistics.mean(r["written"] for r in rs)
        ttft = statistics.median(r["ttft_ms"] for r in rs)
        cold_ttft = statistics.median(r["ttft_ms"] for r in cs) if cs else float("nan")
        lines.append(
            f"| {t} | {statistics.mean(r['prompt_tokens'] for r in rs):.0f} "
            f"| {statistics.mean(r['reused'] for r in rs):.0f} "
            f"({statistics.mean(r['local_blocks'] for r in rs):.1f} "
            f"/ {statistics.mean(r['redis_blocks'] for r in rs):.1f}) "
            f"| {new_kv / 1e6:.2f} MB | {written / 1e6:.2f} MB | {written / new_kv:.2f}x "
            f"| {statistics.mean(r['read'] for r in rs) / 1e6:.3f} MB | {ttft:.0f} ms | {cold_ttft:.0f} ms "
            f"| {ttft / cold_ttft:.2f}x |"
        )
    lines += [
        "",
        "## Configurations",
        "",
        "| configuration | written per turn | read per turn | reused tokens | later turns' TTFT (median) "
        "| answers as native | Redis memory per session |",
        "|---|---|---|---|---|---|---|",
    ]
    base = {(r["session"], r["turn"]): r["text"] for r in reuse["turns"]}
    for name, run in runs.items():
        turns = run["turns"]
        later = [r["ttft_ms"] for r in turns if r["turn"] > 1]
        same = sum(base.get((r["session"], r["turn"])) == r["text"] for r in turns)
        lines.append(
            f"| {name} | {statistics.mean(r['written'] for r in turns) / 1e6:.2f} MB "
            f"| {statistics.mean(r['read'] for r in turns) / 1e6:.2f} MB "
            f"| {sum(r['reused'] for r in turns)} / {sum(r['prompt_tokens'] for r in turns)} "
            f"| {statistics.median(later):.0f} ms | {same}/{len(turns)} "
            f"| {run['redis_memory_per_session'] / 1e6:.2f} MB |"
        )
    misses: dict = {}
    for run in runs.values():
        for r in run["turns"]:
            if r["cache_miss"]:
                misses.setdefault(run["name"], {}).setdefault(r["cache_miss"], 0)
                misses[run["name"]][r["cache_miss"]] += 1
    by_config = [f"{k}: " + ", ".join(f"{reason} {n}" for reason, n in v.items()) for k, v in misses.items()]
    lines += ["", "Turns that reused less than they could, by reason: " + ("; ".join(by_config) or "none"), ""]
    lines += [
        "## Storage formats, one block of this model",
        "",
        "| format | bytes | of native | encode | decode | max abs error |",
        "|---|---|---|---|---|---|",
    ]
    for name, f in result["formats"].items():
        lines.append(
            f"| {name} | {f['bytes'] / 1024:.0f} KiB | {f['of_native']:.2f} | {f['encode_ms']:.2f} ms "
            f"| {f['decode_ms']:.2f} ms | {f['max_abs_error']:.3g} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.kv", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifacts", type=Path, default=None, help="exported model (default: the installed repository's)")
    p.add_argument("--out", type=Path, default=paths.BUILD / "kv")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {', '.join(CONFIGS)}")
    p.add_argument("--sessions", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=32)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    repository = paths.MODEL_REPOSITORY
    if args.artifacts is not None:
        from perf.servertools import repository_with

        repository = repository_with(args.artifacts, args.out / "repository")
    manifest = Manifest.load(repository / "engine_short" / "1")
    t0 = time.time()
    result = {
        "model": manifest.name,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "args": " ".join(argv if argv is not None else __import__("sys").argv[1:]),
        "sessions": args.sessions,
        "max_new_tokens": args.max_new_tokens,
        "kv_bytes_per_token": manifest.num_layers * 2 * manifest.num_kv_heads * manifest.head_dim * 4,
        "runs": [],
    }
    for name in args.configs.split(","):
        print(f"[kv] {name}: {args.sessions} sessions x {len(TURNS)} turns", flush=True)
        result["runs"].append(
            run_config(name, CONFIGS[name], repository, args.sessions, args.max_new_tokens, args.out / "run")
        )
    result["formats"] = format_costs(manifest)
    result["seconds"] = time.time() - t0
    (args.out / "results.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    (args.out / "report.md").write_text(markdown(result))
    print((args.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

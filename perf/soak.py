"""Mixed multi-turn load for a long time: ``python -m perf.soak`` (default 10 minutes).

Starts a private stack (session TTL shortened to ``--ttl-s``) and runs ``--workers`` customers,
each holding 3-6 turn conversations in English and Chinese (15% priority 1). Every 10 s it
samples the resident memory of tritonserver and each Python-backend stub and Redis'
``used_memory``. At the end it checks that memory grew less than 10% after warm-up (the first
quarter), that sessions idle longer than the TTL are gone from Redis, and that no chat failed.
Prints a markdown summary and writes it to ``build/soak/summary.md``; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import redis

from perf.loadtools import rss_kib, timed_chat
from perf.markdown import ms, table, write_summary
from perf.stats import nearest_rank
from switchboard import paths
from switchboard.client import ChatClient
from switchboard.data.corpus import load, sample_questions
from switchboard.ops.launch import Ports, Stack, children
from switchboard.serving.session import session_key


def growth_rows(samples: list[tuple[float, dict]], duration_s: float) -> tuple[list[list], bool]:
    """Memory growth per process after warm-up (the first quarter): rows for the table, and
    whether every one stayed under 10%. Process RSS compares the first and last sample after
    warm-up. Redis' used_memory follows the live sessions, whose number moves with the load's
    pace (1168-1633 keys in one soak, used_memory with them): it is judged per live key, the
    averages of its two halves compared, so a leak shows and a busier minute does not."""
    warm = [s for t, s in samples if t >= duration_s / 4]
    rows, ok = [], True
    if not warm:
        return rows, False
    half = len(warm) // 2
    for name in warm[-1]:
        if name == "redis keys":
            continue
        label, unit, scale = name, "MiB", 1024
        if name.startswith("redis") and half >= 2:
            values = [s[name] for s in warm]
            if all(s.get("redis keys") for s in warm):
                values = [s[name] / s["redis keys"] for s in warm]
                label, unit, scale = f"{name} per live key", "KiB", 1
            first = sum(values[:half]) / half
            last = sum(values[half:]) / (len(values) - half)
        else:
            first, last = warm[0].get(name), warm[-1].get(name)
        if not first or last is None:
            rows.append([label, "-", "-", "-", "no data"])
            ok = False
            continue
        growth = (last - first) / first * 100
        ok &= growth < 10
        rows.append(
            [
                label,
                f"{first / scale:.1f} {unit}",
                f"{last / scale:.1f} {unit}",
                f"{growth:+.1f}%",
                "ok" if growth < 10 else "GREW",
            ]
        )
    return rows, ok


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--ttl-s", type=int, default=60, help="session TTL during the soak (default 60)")
    p.add_argument("--out", type=Path, default=paths.BUILD / "soak")
    args = p.parse_args(argv)

    data = load()
    questions = {
        "en": sample_questions(data, 300, seed=1),
        "zh": [q for q in sample_questions(data, 600, seed=2) if not q.isascii()],
    }
    stack = Stack(Ports.free(), run_dir=args.out / "run", env={"SWITCHBOARD_SESSION_TTL_S": str(args.ttl_s)})
    log(f"starting the stack (session TTL {args.ttl_s} s), then {args.workers} customers for {args.duration_s:.0f} s")
    stack.start()
    client = ChatClient(stack.grpc_url, timeout_s=60)
    r = redis.Redis(port=stack.ports.redis)
    outcomes, finished_sessions, lock = [], [], threading.Lock()
    stop = threading.Event()

    def customer(n):
        rng = random.Random(n)
        s = 0
        while not stop.is_set():
            sid, lang = f"soak-{n}-{s}", rng.choice(["en", "zh"])
            priority = 1 if rng.random() < 0.15 else 2
            for _ in range(rng.randint(3, 6)):
                if stop.is_set():
                    break
                o = timed_chat(
                    client,
                    rng.choice(questions[lang]),
                    session_id=sid,
                    priority=priority,
                    max_new_tokens=rng.choice([16, 32, 64]),
                )
                with lock:
                    outcomes.append(o)
            with lock:
                finished_sessions.append((time.monotonic(), sid))
            s += 1

    samples = []
    threads = [threading.Thread(target=customer, args=(n,), daemon=True) for n in range(args.workers)]
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        while time.monotonic() - t0 < args.duration_s:
            time.sleep(min(10, max(0.0, args.duration_s - (time.monotonic() - t0))))
            procs = {
                "tritonserver": stack.triton.pid,
                **{f"stub {k}": v for k, v in children(stack.triton.pid).items()},
            }
            sample = {name: rss_kib(pid) for name, pid in procs.items()}
            sample["redis used_memory"] = int(r.info("memory")["used_memory"]) // 1024
            sample["redis keys"] = r.dbsize()
            samples.append((time.monotonic() - t0, sample))
            with lock:
                n, errs = len(outcomes), sum(not o.ok for o in outcomes)
            log(
                f"{time.monotonic() - t0:4.0f} s: {n} chats, {errs} errors, tritonserver "
                f"{sample['tritonserver'] // 1024} MiB, redis {sample['redis used_memory']} KiB, "
                f"{sample['redis keys']} keys"
            )
        stop.set()
        for t in threads:
            t.join(120)
        # TTL: sessions finished more than TTL + 2 s ago must be gone.
        now = time.monotonic()
        old = [sid for t, sid in finished_sessions if now - t > args.ttl_s + 2]
        lingering = sum(r.exists(session_key("sb", sid) + ":conv") for sid in old)
    finally:
        stack.stop()

    (args.out / "samples.json").write_text(json.dumps(samples))
    rows, ok = growth_rows(samples, args.duration_s)
    lat = [o.seconds for o in outcomes if o.ok]
    errors = Counter(o.reason for o in outcomes if not o.ok)
    sessions = Counter(o.stats.get("session") for o in outcomes)
    ok &= not errors and lingering == 0
    body = table(["process", "after warm-up", "end", "growth", ""], rows)
    body += "\n\n" + table(
        ["chats", "errors", "FAQ fallback", "latency P50 / P99", "sessions", "expired by TTL"],
        [
            [
                len(outcomes),
                sum(errors.values()) or 0,
                sum(o.fallback for o in outcomes),
                f"{ms(nearest_rank(lat, 50))} / {ms(nearest_rank(lat, 99))}",
                dict(sessions),
                f"{len(old) - lingering}/{len(old)} idle > TTL gone",
            ]
        ],
    )
    body += f"\n\n{args.duration_s:.0f} s, {args.workers} customers, TTL {args.ttl_s} s; " + (
        "all checks passed" if ok else "CHECKS FAILED"
    )
    write_summary(args.out / "summary.md", "make soak", body)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

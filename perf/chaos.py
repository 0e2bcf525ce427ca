"""Faults and overload against a private stack: ``python -m switchboard.perf.chaos``.

Starts redis-server and tritonserver on free ports and runs, in order:
1. baseline: priority-1 latency of single chats on an idle server;
2. burst: capacity measured at concurrency 4, then open-loop arrivals at 5x that rate for
   ``--burst-s`` seconds (a ``--vip-share`` of 5% at priority 1), every chat with a 30 s
   client deadline; before it, the same priority-1 arrivals alone, as the reference that
   priority 1 under the burst is compared with;
3. Redis stopped for 5 s under load, then restarted (time until KV reuse resumes);
4. Redis paused (``CLIENT PAUSE`` 3 s) under load;
5. the ``engine_short`` stub killed with chats in flight, under ``switchboard.ops.supervisor``
   (Triton 2.51 never restarts the stub and sometimes aborts): time until chats are generated
   again.
Prints a markdown summary and writes it to ``build/chaos/summary.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from switchboard import paths
from switchboard.client import AsyncChatClient, ChatClient
from switchboard.ops.launch import Ports, Stack, children
from switchboard.ops.supervisor import Supervisor, probe
from switchboard.perf.loadtools import ms, percentile, table, timed_chat, timed_chat_async, write_summary
from switchboard.training.corpus import load, sample_questions


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def closed_loop(client, questions, seconds: float, workers: int, session_prefix: str | None = None):
    out, stop = [], threading.Event()

    def worker(n):
        i = 0
        while not stop.is_set():
            sid = f"{session_prefix}-{n}-{i // 3}" if session_prefix else None
            out.append(
                (
                    time.monotonic(),
                    timed_chat(client, questions[(n * 31 + i) % len(questions)], session_id=sid, max_new_tokens=32),
                )
            )
            i += 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(workers)]
    for t in threads:
        t.start()
    return out, stop, threads


def finish(stop, threads):
    stop.set()
    for t in threads:
        t.join(120)


def burst(url: str, questions, rate: float, seconds: float, vip_share: float):
    """Open-loop Poisson arrivals at ``rate`` for ``seconds``, each chat a stream on one asyncio
    channel (a thread per chat cost the generator 8-10 ms of CPU per chat on the server's cores
    and fell tens of seconds behind schedule)."""
    return asyncio.run(_burst(url, questions, rate, seconds, vip_share))


async def _burst(url: str, questions, rate: float, seconds: float, vip_share: float):
    rng = random.Random(0)
    results: list = []

    async def one(client, i, priority, scheduled):
        started = time.monotonic()
        o = await timed_chat_async(client, questions[i % len(questions)], priority=priority, max_new_tokens=48)
        o.backlog = started - scheduled  # load generator's own delay
        results.append(o)

    async with AsyncChatClient(url, timeout_s=30) as client:
        tasks, t0 = [], time.monotonic()
        next_at = t0
        while next_at - t0 < seconds:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, len(tasks), 1 if rng.random() < vip_share else 2, next_at)))
            next_at += rng.expovariate(rate)
            if len(tasks) % int(max(rate, 1) * 5) == 0:
                log(f"burst: {len(tasks)} sent, {len(results)} answered")
        await asyncio.gather(*tasks)
    return results, len(tasks)


def burst_row(label: str, results, sent: int) -> list:
    vip_outcomes = [o for o in results if o.priority == 1 and o.ok and not o.fallback]
    vip = [o.seconds for o in vip_outcomes]
    fb = Counter(o.reason for o in results if o.fallback)
    # Refused: Triton's queue in front of chat was full or its wait timed out (SDK code
    # UNAVAILABLE), an immediate answer the client can retry on.
    refused = sum(not o.ok and o.reason == "UNAVAILABLE" for o in results)
    errs = Counter(o.reason for o in results if not o.ok and o.reason != "UNAVAILABLE")
    return [
        label,
        sent,
        sum(o.ok and not o.fallback for o in results),
        sum(fb.values()),
        refused,
        sum(errs.values()),
        sum(o.seconds > 30 for o in results),
        f"priority-1 generated P50 {ms(percentile(vip, 50))}, P95 {ms(percentile(vip, 95))}, "
        f"TTFT {ttft(vip_outcomes)}; fallback {dict(fb)}; errors {dict(errs)}",
    ]


def ttft(outcomes) -> str:
    """Server-side time to first token (from chat's arrival), P50 and P95."""
    values = [o.stats["ttft_ms"] / 1000 for o in outcomes if o.stats.get("ttft_ms") is not None]
    return f"P50 {ms(percentile(values, 50))}, P95 {ms(percentile(values, 95))}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.perf.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--burst-s", type=float, default=30.0, help="length of the 5x burst (default 30)")
    p.add_argument("--factor", type=float, default=5.0, help="burst rate as a multiple of capacity (default 5)")
    p.add_argument(
        "--vip-share", type=float, default=0.05, help="share of priority-1 chats in the burst (default 0.05)"
    )
    p.add_argument("--out", type=Path, default=paths.BUILD / "chaos")
    args = p.parse_args(argv)

    questions = sample_questions(load(), 400, seed=7)
    stack = Stack(Ports.free(), run_dir=args.out / "run", env={"SWITCHBOARD_SESSION_TTL_S": "600"})
    log("starting redis-server and tritonserver on free ports ...")
    stack.start()
    client = ChatClient(stack.grpc_url, timeout_s=30)
    rows, notes = [], []
    sup_stop = threading.Event()
    try:
        log("1/5 baseline: 20 priority-1 chats, one at a time")
        base = [timed_chat(client, questions[i], priority=1, max_new_tokens=48) for i in range(20)]
        base_p50, base_p95 = percentile([o.seconds for o in base], 50), percentile([o.seconds for o in base], 95)
        rows.append(
            [
                "baseline (idle, priority 1)",
                len(base),
                sum(o.ok for o in base),
                0,
                "-",
                0,
                0,
                f"P50 {ms(base_p50)}, P95 {ms(base_p95)}; TTFT {ttft(base)}",
            ]
        )

        log("2/5 capacity at concurrency 4 for 8 s")
        done, stop, threads = closed_loop(client, questions, 8, 4)
        time.sleep(8)
        finish(stop, threads)
        capacity = sum(o.ok and not o.fallback for _, o in done) / 8
        rate = args.factor * capacity
        vip_rate = args.vip_share * rate
        log(
            f"capacity {capacity:.1f} chats/s; priority 1 alone at {vip_rate:.1f}/s, then the burst at "
            f"{rate:.0f}/s, {args.burst_s:.0f} s each"
        )
        # The reference for priority 1 under the burst: the same priority-1 arrivals without the
        # priority-2 traffic, so the table separates what priority 2 costs priority 1 from what
        # priority 1's own load costs.
        results, sent = burst(stack.grpc_url, questions, vip_rate, args.burst_s, 1.0)
        rows.append(burst_row(f"priority 1 alone ({vip_rate:.1f}/s, {args.burst_s:.0f} s)", results, sent))
        results, sent = burst(stack.grpc_url, questions, rate, args.burst_s, args.vip_share)
        rows.append(
            burst_row(
                f"burst {args.factor:g}x ({rate:.0f}/s, {args.burst_s:.0f} s, {args.vip_share:.0%} priority 1)",
                results,
                sent,
            )
        )
        backlog = max((o.backlog for o in results), default=0.0)
        notes.append(
            f"Burst: the load generator (one asyncio thread on the same cores) started requests up to "
            f"{backlog:.1f} s late; latencies are measured from the actual send."
        )

        log("3/5 Redis stopped for 5 s under load")
        done, stop, threads = closed_loop(client, questions, 0, 3, session_prefix="outage")
        time.sleep(2)
        stack.stop_redis()
        time.sleep(5)
        stack.start_redis()
        back = time.monotonic()
        resumed = None
        while time.monotonic() - back < 30:
            recent = [o for t, o in list(done) if t > back and o.stats.get("reused_tokens", 0) > 0]
            if recent:
                resumed = time.monotonic() - back
                break
            time.sleep(0.1)
        finish(stop, threads)
        outs = [o for _, o in done]
        sessions = Counter(o.stats.get("session") for o in outs)
        rows.append(
            [
                "Redis stopped 5 s",
                len(outs),
                sum(o.ok and not o.fallback for o in outs),
                sum(o.fallback for o in outs),
                "-",
                sum(not o.ok for o in outs),
                0,
                f"sessions {dict(sessions)}; reuse resumed {resumed:.1f} s after restart"
                if resumed
                else f"sessions {dict(sessions)}; reuse did NOT resume within 30 s",
            ]
        )

        log("4/5 Redis paused 3 s under load")
        done, stop, threads = closed_loop(client, questions, 0, 3, session_prefix="paused")
        time.sleep(2)
        import redis as redis_py

        r = redis_py.Redis(port=stack.ports.redis)
        t_pause = time.monotonic()
        r.execute_command("CLIENT", "PAUSE", 3000, "ALL")
        time.sleep(4)
        finish(stop, threads)
        during = [o for t, o in done if t_pause <= t <= t_pause + 3]
        outs = [o for _, o in done]
        rows.append(
            [
                "Redis paused 3 s",
                len(outs),
                sum(o.ok and not o.fallback for o in outs),
                sum(o.fallback for o in outs),
                "-",
                sum(not o.ok for o in outs),
                0,
                f"slowest chat finishing during the pause {ms(max((o.seconds for o in during), default=None))}",
            ]
        )

        log("5/5 engine_short stub killed with chats in flight, under the supervisor")
        supervisor = Supervisor(stack, lambda: probe(stack.grpc_url, 10), interval_s=1, failures_to_restart=2)
        supervised = threading.Thread(target=supervisor.run, args=(sup_stop,), daemon=True)
        supervised.start()
        done, stop, threads = closed_loop(client, questions, 0, 3)
        time.sleep(1)
        t_kill = time.monotonic()
        os.kill(children(stack.triton.pid)["engine_short"], signal.SIGKILL)
        recovered = None
        while recovered is None and time.monotonic() - t_kill < 120:
            time.sleep(0.5)
            if supervisor.restarted_at is not None:
                back = [
                    t + o.seconds for t, o in list(done) if t >= supervisor.restarted_at and o.ok and not o.fallback
                ]
                recovered = min(back) - t_kill if back else None
        time.sleep(2)
        finish(stop, threads)
        sup_stop.set()
        supervised.join(60)
        outs = [o for t, o in done if t >= t_kill]
        if recovered is not None:
            notes.append(
                f"Stub kill: the supervisor restarted tritonserver ({supervisor.last_failure}); chats were "
                f"generated again {recovered:.1f} s after the kill."
            )
        else:
            notes.append("Stub kill: chats were NOT generated again within 120 s.")
        rows.append(
            [
                "engine_short stub killed, supervised (chats after the kill)",
                len(outs),
                sum(o.ok and not o.fallback for o in outs),
                sum(o.fallback for o in outs),
                "-",
                sum(not o.ok for o in outs),
                sum(o.seconds > 30 for o in outs),
                f"slowest {ms(max((o.seconds for o in outs), default=None))}; generated again after "
                + (f"{recovered:.1f} s" if recovered is not None else "NEVER")
                + f"; errors {dict(Counter(o.reason for o in outs if not o.ok))}",
            ]
        )
    finally:
        sup_stop.set()
        for proc in (stack.triton, stack.redis):  # a killed stub blocks a clean shutdown for 30 s
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    body = table(["scenario", "chats", "generated", "FAQ fallback", "refused", "errors", "over 30 s", "notes"], rows)
    body += "\n\n" + "\n".join(f"- {n}" for n in notes)
    write_summary(args.out / "summary.md", "make chaos", body)
    failed = any(r[5] for r in rows[:-1]) or any(r[6] for r in rows) or "NEVER" in rows[-1][7]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

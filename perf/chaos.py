"""Faults and overload against a private stack: ``python -m switchboard.perf.chaos``.

Starts redis-server and tritonserver on free ports (``--replicas 2``: two tritonservers sharing
the Redis behind HAProxy, as ``make serve REPLICAS=2``) and runs, in order:
1. baseline: priority-1 latency of single chats on an idle server;
2. burst: capacity measured at concurrency 4, then open-loop arrivals at 5x that rate for
   ``--burst-s`` seconds (a ``--vip-share`` of 5% at priority 1), every chat with a 30 s
   client deadline; before it, the same priority-1 arrivals alone, as the reference that
   priority 1 under the burst is compared with;
3. Redis stopped for 5 s under load, then restarted (time until KV reuse resumes);
4. Redis paused (``CLIENT PAUSE`` 3 s) under load;
5. the ``engine_short`` stub killed with chats in flight, under ``switchboard.ops.supervisor``
   as ``make serve`` runs it (Triton 2.51 never restarts the stub and sometimes aborts): errors,
   the longest time without a generated answer, and how long the reload took;
6. with ``--replicas`` 2 or more: a burst at ``--replica-factor`` x capacity, one replica's
   tritonserver killed (SIGKILL to its process group) a third of the way in, every replica
   under its supervisor.
Prints a markdown summary and writes it to ``build/chaos/summary.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
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
from switchboard.ops.balancer import Balancer, Replica
from switchboard.ops.launch import Ports, Stack, children, free_port, free_ports
from switchboard.ops.supervisor import Supervisor, probe, with_reloads
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


def burst(url: str, questions, rate: float, seconds: float, vip_share: float, at=None):
    """Open-loop Poisson arrivals at ``rate`` for ``seconds``, each chat a stream on one asyncio
    channel (a thread per chat cost the generator 8-10 ms of CPU per chat on the server's cores
    and fell tens of seconds behind schedule). ``at``: (seconds in, function) run on a thread
    then (a fault)."""
    if at is not None:
        timer = threading.Timer(*at)
        timer.start()
    try:
        return asyncio.run(_burst(url, questions, rate, seconds, vip_share))
    finally:
        if at is not None:
            timer.cancel()


async def _burst(url: str, questions, rate: float, seconds: float, vip_share: float):
    rng = random.Random(0)
    results: list = []

    async def one(client, i, priority, scheduled):
        started = time.monotonic()
        o = await timed_chat_async(client, questions[i % len(questions)], priority=priority, max_new_tokens=48)
        o.backlog = started - scheduled  # load generator's own delay
        o.started = started
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


class Private:
    """The stack under test on free ports: one tritonserver, or ``replicas`` of them sharing one
    Redis behind HAProxy (what ``make serve REPLICAS=n`` runs)."""

    def __init__(self, replicas: int, run_dir: Path, env: dict[str, str]):
        first = Ports.free()
        self.stacks = [Stack(first, run_dir=run_dir / "replica-0", env=env)]
        for i in range(1, replicas):
            http, grpc, metrics = free_ports(3)
            self.stacks.append(
                Stack(Ports(http, grpc, metrics, first.redis), run_dir=run_dir / f"replica-{i}", env=env)
            )
        self.run_dir, self.balancer = run_dir, None

    def start(self) -> None:
        self.stacks[0].start()
        for stack in self.stacks[1:]:
            stack.start_triton()
        if len(self.stacks) > 1:
            replicas = [Replica(f"replica-{i}", s.ports.grpc, s.ports.http) for i, s in enumerate(self.stacks)]
            self.balancer = Balancer(free_port(), replicas, self.run_dir).start()

    @property
    def url(self) -> str:
        return self.balancer.url if self.balancer is not None else self.stacks[0].grpc_url

    @property
    def redis(self) -> Stack:
        """The stack that runs redis-server."""
        return self.stacks[0]

    def kill(self) -> None:
        """Everything, at once: a killed stub blocks a clean shutdown for 30 s."""
        if self.balancer is not None:
            self.balancer.stop()
        for proc in [s.triton for s in self.stacks] + [self.stacks[0].redis]:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def supervise(stack: Stack, stop: threading.Event) -> Supervisor:
    """``stack`` under a supervisor as ``make serve`` runs it (dead models reloaded alone), with a
    probe every second."""
    supervisor = with_reloads(Supervisor(stack, lambda: probe(stack.grpc_url, 10), interval_s=1, failures_to_restart=2))
    threading.Thread(target=supervisor.run, args=(stop,), daemon=True).start()
    return supervisor


def longest_gap(done, start: float, end: float) -> float | None:
    """The longest time within [start, end] without a chat ending in a generated answer."""
    ends = sorted(t + o.seconds for t, o in done if o.ok and not o.fallback and start <= t + o.seconds <= end)
    edges = [start, *ends, end]
    return max(b - a for a, b in zip(edges, edges[1:])) if ends else None


def stub_kill(supervisor: Supervisor, client: ChatClient, questions, notes: list[str]) -> tuple[list, bool]:
    """Scenario 5: ``engine_short``'s stub killed under three closed-loop clients; the table row,
    and whether no chat failed and answers were generated again within 5 s of the kill."""
    done, stop, threads = closed_loop(client, questions, 0, 3)
    time.sleep(2)
    t_kill = time.monotonic()
    os.kill(children(supervisor.stack.triton.pid)["engine_short"], signal.SIGKILL)
    while not supervisor.reloads and not supervisor.restarts and time.monotonic() - t_kill < 120:
        time.sleep(0.2)
    repaired = time.monotonic() - t_kill
    time.sleep(5)  # chats back on engine_short (chat pings it while routing around it)
    finish(stop, threads)
    outs = [o for t, o in done if t + o.seconds >= t_kill]  # in flight at the kill, or after it
    gap = longest_gap(done, t_kill, t_kill + 10)
    if supervisor.reloads:
        how = f"reloaded engine_short alone ({supervisor.last_reload})"
    elif supervisor.restarts:
        how = f"restarted tritonserver ({supervisor.last_failure})"
    else:
        how = "did NOT repair it"
    gap_text = f"{gap:.2f} s" if gap is not None else "NEVER (no generated answer in 10 s)"
    notes.append(
        f"Stub kill: the supervisor {how}, {repaired:.1f} s after the kill; the longest time without a "
        f"generated answer in the 10 s after it: {gap_text}."
    )
    failovers = sum(o.stats.get("failover_tokens", 0) > 0 for o in outs)
    errors = Counter(o.reason for o in outs if not o.ok)
    row = [
        "engine_short stub killed, supervised (chats in flight at the kill or after it)",
        len(outs),
        sum(o.ok and not o.fallback for o in outs),
        sum(o.fallback for o in outs),
        "-",
        sum(errors.values()),
        sum(o.seconds > 30 for o in outs),
        f"{failovers} went on in engine_long mid-answer; no generated answer for at most {gap_text}; "
        f"slowest {ms(max((o.seconds for o in outs), default=None))}; errors {dict(errors)}",
    ]
    ok = bool(supervisor.reloads) and not supervisor.restarts and gap is not None and gap <= 5 and not errors
    return row, ok


def replica_kill(victim: Supervisor, url: str, questions, rate: float, args) -> tuple[list, bool]:
    """Scenario 6: a burst at ``rate`` through HAProxy, ``victim``'s tritonserver and stubs
    killed a third of the way in; the table row, and whether every chat that failed was in flight
    on the killed replica and the replica came back."""
    seconds, killed = 30.0, {}

    def kill():
        killed["at"] = time.monotonic()
        os.killpg(victim.stack.triton.pid, signal.SIGKILL)

    results, sent = burst(url, questions, rate, seconds, args.vip_share, at=(seconds / 3, kill))
    t_kill = killed.get("at", math.inf)
    while victim.restarted_at is None and time.monotonic() - t_kill < 60:
        time.sleep(0.2)
    back = victim.restarted_at - t_kill if victim.restarted_at is not None else None
    # HAProxy takes a replica out after two failed checks 0.5 s apart: a chat that failed after
    # that was not failed by the kill.
    failed = [o for o in results if not o.ok]
    in_flight = [o for o in results if o.started <= t_kill <= o.started + o.seconds]
    later = [o for o in failed if o.started > t_kill + 2]
    row = burst_row(
        f"replica killed in a {args.replica_factor:g}x burst ({rate:.0f}/s, {seconds:.0f} s)", results, sent
    )
    row[7] += (
        f"; {len(in_flight)} chats in flight at the kill, {sum(not o.ok for o in in_flight)} of them failed "
        f"{dict(Counter(o.reason for o in in_flight if not o.ok))}; "
        f"{len(later)} failed after the balancer's 2 s; the replica served again "
        + (f"{back:.1f} s after the kill" if back is not None else "NEVER")
    )
    return row, not later and back is not None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.perf.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--burst-s", type=float, default=30.0, help="length of the 5x burst (default 30)")
    p.add_argument("--factor", type=float, default=5.0, help="burst rate as a multiple of capacity (default 5)")
    p.add_argument(
        "--vip-share", type=float, default=0.05, help="share of priority-1 chats in the burst (default 0.05)"
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=int(os.environ.get("REPLICAS", 1)),
        help="tritonservers behind HAProxy (default 1; 2 or more add the replica kill, scenario 6)",
    )
    p.add_argument(
        "--replica-factor",
        type=float,
        default=2.0,
        help="rate of the burst a replica is killed in, as a multiple of capacity (default 2)",
    )
    p.add_argument("--out", type=Path, default=paths.BUILD / "chaos")
    args = p.parse_args(argv)

    questions = sample_questions(load(), 400, seed=7)
    private = Private(args.replicas, args.out / "run", env={"SWITCHBOARD_SESSION_TTL_S": "600"})
    what = f"{args.replicas} tritonservers behind HAProxy" if args.replicas > 1 else "tritonserver"
    log(f"starting redis-server and {what} on free ports ...")
    private.start()
    stack, url = private.redis, private.url
    client = ChatClient(url, timeout_s=30)
    rows, notes = [], []
    sup_stop = threading.Event()
    steps = 6 if args.replicas > 1 else 5
    try:
        log(f"1/{steps} baseline: 20 priority-1 chats, one at a time")
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

        log(f"2/{steps} capacity at concurrency 4 for 8 s")
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
        results, sent = burst(url, questions, vip_rate, args.burst_s, 1.0)
        rows.append(burst_row(f"priority 1 alone ({vip_rate:.1f}/s, {args.burst_s:.0f} s)", results, sent))
        results, sent = burst(url, questions, rate, args.burst_s, args.vip_share)
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

        log(f"3/{steps} Redis stopped for 5 s under load")
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

        log(f"4/{steps} Redis paused 3 s under load")
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

        log(f"5/{steps} engine_short stub killed with chats in flight, under the supervisor")
        supervisors = [supervise(stack, sup_stop)]
        row, stub_ok = stub_kill(supervisors[0], client, questions, notes)
        rows.append(row)

        replica_ok = True
        if args.replicas > 1:
            log(f"6/{steps} a replica's tritonserver killed in a {args.replica_factor:g}x burst, all supervised")
            supervisors += [supervise(s, sup_stop) for s in private.stacks[1:]]
            row, replica_ok = replica_kill(supervisors[-1], url, questions, args.replica_factor * capacity, args)
            rows.append(row)
    finally:
        sup_stop.set()
        private.kill()
    body = table(["scenario", "chats", "generated", "FAQ fallback", "refused", "errors", "over 30 s", "notes"], rows)
    body += "\n\n" + "\n".join(f"- {n}" for n in notes)
    write_summary(args.out / "summary.md", "make chaos", body)
    # Errors fail the run except where a replica was killed (the chats streaming from it then)
    # and in the burst rows, which count refusals apart; the stub kill must cost no chat.
    checked = [r for r in rows if not r[0].startswith(("replica killed", "burst", "priority 1 alone"))]
    failed = any(r[5] for r in checked) or any(r[6] for r in rows) or not stub_ok or not replica_ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

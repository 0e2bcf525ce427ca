"""Two Switchboard replicas sharing one Redis behind Debian's HAProxy on one gRPC address: the
second added to the running balancer (its admin socket) takes chats on a connection the client
already held; session affinity keeps a session's KV blocks local; a replica drained out moves its
sessions with their history; when a replica is killed under load the other answers, sessions keep
their history and reuse the blocks the dead one stored."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis

from switchboard.client import ChatClient, ChatError
from switchboard.ops.balancer import Balancer, Replica, add, remove
from switchboard.ops.launch import Ports, Stack, free_ports
from tests.integration.kvtools import kv_lookups, session_blocks


@pytest.fixture(scope="module")
def fleet(artifacts, tmp_path_factory):
    run = tmp_path_factory.mktemp("fleet")
    first = Stack(Ports.free(), run_dir=run / "r0")
    first.start()
    ports = Ports.free()
    ports.redis = first.ports.redis
    second = Stack(ports, run_dir=run / "r1")
    second.start_triton()
    balancer = Balancer(free_ports(1)[0], [Replica("replica-0", first.ports.grpc, first.ports.http)], run).start()
    # a client connected while the balancer has one replica; the second joins it live
    client = ChatClient(balancer.url, timeout_s=60)
    client.chat("Hello", stream=False, max_new_tokens=2)
    add(balancer.admin, 1, Replica("replica-1", second.ports.grpc, second.ports.http))
    yield first, second, balancer, client
    balancer.stop()
    second.stop_triton()
    first.stop()


def test_sessions_stay_on_one_replica_and_find_their_blocks_local(fleet):
    first, second, balancer, client = fleet  # the client connected before the second replica joined
    later = []
    for n in range(16):
        # Each session its own text: identical conversations would share blocks across replicas.
        for turn, text in enumerate((f"Where is my order {n}?", "Can I change the address?", "And the invoice?")):
            reply = client.chat(text, session_id=f"affinity-{n}", stream=False, max_new_tokens=16, temperature=0.0)
            if turn:
                later.append(reply.stats.raw)
    assert all(s["session"] == "hit" and s["kv_local_blocks"] > 0 and s["kv_redis_blocks"] == 0 for s in later), [
        (s["session"], s["kv_local_blocks"], s["kv_redis_blocks"])
        for s in later
        if s["kv_redis_blocks"] or s["session"] != "hit"
    ]
    time.sleep(1.5)  # the pools publish their counters once a second
    lookups = [kv_lookups(s.ports.metrics) for s in (first, second)]
    assert lookups[0] > 0 and lookups[1] > 0, "both replicas should hold some sessions"


def test_a_replica_drained_out_moves_its_sessions_with_their_history(fleet):
    first, second, balancer, client = fleet
    pinned = ChatClient(second.grpc_url, timeout_s=60)
    sids = [f"drained-{n}" for n in range(3)]
    for sid in sids:  # sessions whose first turn the second replica answered
        pinned.chat(f"Where is my parcel {sid}?", session_id=sid, stream=False, max_new_tokens=8)
    time.sleep(1.5)
    before = kv_lookups(second.ports.metrics)
    assert remove(balancer.admin, [1], timeout_s=30) == {1: True}
    assert balancer.admin.servers()["replica-1"]["status"] == "MAINT"
    for sid in sids:
        moved = client.chat("Can I change the address?", session_id=sid, stream=False, max_new_tokens=8).stats.raw
        assert moved["session"] == "hit", moved
    time.sleep(1.5)
    assert kv_lookups(second.ports.metrics) == before, "a drained replica takes no chat"
    add(balancer.admin, 1, Replica("replica-1", second.ports.grpc, second.ports.http))  # back for the next test


def test_a_replica_killed_under_load_leaves_the_other_answering_with_the_sessions_history(fleet):
    first, second, balancer, _ = fleet
    client = ChatClient(balancer.url, timeout_s=60)
    texts = ["Where is my order?", "Can I change the address?", "How do I return it?", "And the refund?"]
    records, stop = [], threading.Event()
    killed_at = []

    def worker(w):
        turn = 0
        while not stop.is_set():
            sid = f"kill-{w}-{turn // len(texts)}"
            t0, got, error, stats = time.monotonic(), False, None, None
            try:
                text = texts[turn % len(texts)].replace("order", f"order {sid}")  # its own blocks
                for event in client.chat(text, session_id=sid, max_new_tokens=24, temperature=0.0):
                    if isinstance(event, str):
                        got = True
                    else:
                        stats = event.raw
            except ChatError as e:
                error = e
            records.append({"sid": sid, "turn": turn % len(texts), "t0": t0, "t1": time.monotonic(), "got": got,
                            "error": error, "stats": stats})  # fmt: skip
            turn += 1

    # Sessions known to live on the replica about to die: their first turn sent to it directly.
    pinned = ChatClient(second.grpc_url, timeout_s=60)
    firsts = {
        f"pinned-{n}": pinned.chat(f"Where is my parcel {n}?", session_id=f"pinned-{n}", stream=False) for n in range(3)
    }
    rc = redis.Redis(port=first.ports.redis)
    for sid in firsts:
        keys = session_blocks(rc, first.repository, sid)
        deadline = time.monotonic() + 10
        while rc.exists(*keys) < len(keys):
            assert time.monotonic() < deadline, "the replica did not store the session's blocks"
            time.sleep(0.05)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    killed_at.append(time.monotonic())
    os.killpg(second.triton.pid, signal.SIGKILL)
    time.sleep(4.0)
    stop.set()
    for t in threads:
        t.join(60)
    kill = killed_at[0]
    after = [r for r in records if r["t0"] > kill]
    failed = [r for r in records if r["error"] is not None]
    assert len(after) > 10 and all(r["error"] is None for r in after), [str(r["error"]) for r in after][:3]
    assert all(r["t0"] <= kill for r in failed), "only chats streaming when the replica died may fail"
    assert all(r["got"] for r in failed), "a chat that had received nothing is retried, not failed"
    broken = {r["sid"] for r in failed if r["turn"] == 0}  # a first turn lost with the replica: no history
    later = [r["stats"] for r in after if r["turn"] > 0 and r["error"] is None and r["sid"] not in broken]
    assert later and all(s["session"] == "hit" for s in later), "sessions keep their history"
    for sid, first_turn in firsts.items():  # moved to the survivor: the dead replica's blocks, from Redis
        moved = client.chat("Can I change the address?", session_id=sid, stream=False).stats.raw
        assert moved["session"] == "hit" and moved["reused_tokens"] > first_turn.stats.prompt_tokens
        assert moved["kv_redis_blocks"] > 0, moved

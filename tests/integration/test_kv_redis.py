"""KV blocks and conversations against Redis as deployed: a 3-node Redis Cluster started from
redis-server on local ports, and maxmemory eviction under the policy `make serve` uses."""

from __future__ import annotations

import shutil
import subprocess
import time

import numpy as np
import pytest
import redis

from switchboard.kv.blocks import BlockFormat, model_root
from switchboard.kv.local import LocalBlocks
from switchboard.kv.remote import RedisBlocks
from switchboard.kv.tiers import BlockCache
from switchboard.ops.launch import free_ports, port_open
from switchboard.redis_conn import connect
from switchboard.serving.prompt import Conversation
from switchboard.serving.session import SessionStore, StoreConfig
from switchboard.wire import CacheMiss
from tests.integration.kvtools import session_blocks

FMT = BlockFormat(layers=2, kv_heads=2, head_dim=64, tokens=16)  # 32 KiB a block
ROOT = model_root("fp-test", "", 16, "native")


def kv_for(ids):
    kv = np.zeros((2, 2, 2, len(ids), 64), np.float32)
    kv[:, :, :, :, 0] = np.asarray(ids, np.float32)
    return kv


def redis_server(port: int, tmp, *args) -> subprocess.Popen:
    proc = subprocess.Popen(
        [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "", *args],
        cwd=tmp,
        stdout=open(tmp / f"redis-{port}.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while not port_open(port):
        assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.05)
    return proc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three masters, the slots split between them by redis-cli, as an operator would."""
    free = free_ports(6)  # cluster bus ports too: the default, port + 10000, may be taken or past 65535
    ports, buses = free[:3], free[3:]
    procs = []
    for port, bus in zip(ports, buses):
        tmp = tmp_path_factory.mktemp(f"node{port}")
        args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", str(bus))
        procs.append(redis_server(port, tmp, *args))
    try:
        nodes = [f"127.0.0.1:{p}" for p in ports]
        subprocess.run(
            [shutil.which("redis-cli"), "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while not all(b"cluster_state:ok" in redis.Redis(port=p).execute_command("CLUSTER", "INFO") for p in ports):
            assert time.monotonic() < deadline, "the cluster did not come up"
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{ports[0]}/0", ports
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def test_blocks_spread_over_the_cluster_and_read_back_through_any_node(cluster):
    url, ports = cluster
    cache = BlockCache(FMT, ROOT, LocalBlocks(0), RedisBlocks(connect(url, 2.0, cluster=True)))
    ids = list(range(1000, 1000 + 16 * 30 + 5))
    cache.store(ids, kv_for(ids), 2)
    assert cache.flush() and cache.snapshot().get("writes_ok") == 1
    per_node = [redis.Redis(port=p).dbsize() for p in ports]
    assert sum(per_node) == 30 and all(n > 0 for n in per_node), per_node  # every node holds some
    other = BlockCache(FMT, ROOT, LocalBlocks(0), RedisBlocks(connect(f"redis://127.0.0.1:{ports[2]}/0", 2.0, True)))
    reuse = other.lookup(ids + [1], 2, expected=len(ids))
    assert reuse.tokens == 16 * 30 and reuse.remote_blocks == 30 and reuse.miss is None
    assert np.array_equal(reuse.past, kv_for(ids)[:, :, :, : 16 * 30])


def test_conversations_work_on_the_cluster(cluster):
    url, _ = cluster
    store = SessionStore(StoreConfig(url=url, secret=b"k", cluster=True), "fp")
    for i in range(20):
        assert store.save(f"s{i}", Conversation([{"role": "user", "content": "hi"}], [1, 2, 3], 2))
    assert all(store.load(f"s{i}").conversation.tokens == [1, 2, 3] for i in range(20))


def test_under_maxmemory_blocks_are_evicted_before_conversations(tmp_path):
    """`make serve`'s Redis: volatile-ttl, blocks with a shorter TTL than conversations. Filling it
    with blocks evicts older blocks; the conversation stays, so reuse drops and answers stay right."""
    (port,) = free_ports(1)
    proc = redis_server(port, tmp_path, "--maxmemory", "6mb", "--maxmemory-policy", "volatile-ttl")
    try:
        url = f"redis://127.0.0.1:{port}/0"
        store = SessionStore(StoreConfig(url=url, ttl_s=3600), "fp")
        first = list(range(16 * 8 + 1))
        assert store.save("early", Conversation([{"role": "user", "content": "hi"}], first, len(first)))
        cache = BlockCache(FMT, ROOT, LocalBlocks(0), RedisBlocks(connect(url, 2.0), ttl_s=1800))
        cache.store(first, kv_for(first), 2)
        assert cache.flush()
        for n in range(40):  # 40 conversations' worth of blocks (~10 MB) into 6 MB
            ids = [50_000 + n] + list(range(16 * 8))
            cache.store(ids, kv_for(ids), 2)
            assert cache.flush()
        assert int(redis.Redis(port=port).info("stats")["evicted_keys"]) > 0
        assert store.load("early").conversation.tokens == first  # the conversation survived
        reuse = cache.lookup(first + [7], 2, expected=len(first))
        assert reuse.tokens < len(first) - 1 and reuse.miss == CacheMiss.EVICTED
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_server_on_the_cluster_keeps_sessions_and_blocks_there(cluster, artifacts, tmp_path):
    from switchboard.client import ChatClient
    from switchboard.ops.launch import Ports, Stack

    url, ports = cluster
    stack = Stack(
        Ports.free(), run_dir=tmp_path, env={"SWITCHBOARD_REDIS_URL": url, "SWITCHBOARD_REDIS_CLUSTER": "true"}
    )
    stack.start_triton()
    try:
        client = ChatClient(stack.grpc_url, timeout_s=60)
        first = client.chat("Where is my order? (cluster)", session_id="on-cluster", stream=False, temperature=0.0)
        second = client.chat("Can I change the address?", session_id="on-cluster", stream=False, temperature=0.0)
        assert first.stats.raw["session"] == "miss" and second.stats.raw["session"] == "hit"
        assert second.stats.reused_tokens > first.stats.prompt_tokens
        rc = redis.RedisCluster.from_url(url)
        keys = session_blocks(rc, stack.repository, "on-cluster")
        deadline = time.monotonic() + 10
        while sum(rc.exists(k) for k in keys) < len(keys):
            assert time.monotonic() < deadline, "the pool did not store the session's blocks on the cluster"
            time.sleep(0.1)
    finally:
        stack.stop_triton()

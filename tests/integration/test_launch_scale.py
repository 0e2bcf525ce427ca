"""A running `make serve REPLICAS=2` scaled live, on free ports: the capacity plan applied
(`python -m switchboard.ops.capacity plan --apply`, a promotion asking for 3 replicas) starts a
third replica, and HAProxy takes it in; it answers chats arriving on the gateway's connection it
already held. `make scale REPLICAS=1` (`python -m switchboard.ops.launch scale`) drains and stops
the others while chats keep being answered; a scale the stack cannot do is refused, saying why."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import openai

from switchboard.ops.launch import Ports, free_port, replica_arguments
from switchboard.ops.process import alive, pid_file
from tests.integration.kvtools import kv_lookups


def test_replicas_are_added_and_removed_while_the_stack_serves(artifacts, tmp_path):
    ports, gateway_port = Ports.free(), free_port()
    args = ["--http-port", str(ports.http), "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics)]
    args += ["--redis-port", str(ports.redis), "--run-dir", str(tmp_path)]
    launch = [sys.executable, "-m", "switchboard.ops.launch"]

    def run(*extra, timeout=300):
        return subprocess.run(launch + [*extra, *args], capture_output=True, text=True, timeout=timeout)

    up = run("up", "--replicas", "2", "--gateway-port", str(gateway_port), "--asr-model", "off")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key="none", max_retries=0)

        def ask(n: int) -> None:
            for i in range(n):
                messages = [{"role": "user", "content": f"Where is my order {i}?"}]
                reply = client.chat.completions.create(model="switchboard", messages=messages, max_tokens=4)
                assert reply.choices[0].message.content is not None

        ask(1)  # the gateway holds its connection to HAProxy from here on

        # the promotion calendar asks for 3 replicas now; the plan applied live starts the third
        now = datetime.now(timezone.utc).replace(microsecond=0)
        calendar = tmp_path / "calendar.toml"
        calendar.write_text(
            f'[[promotion]]\nname = "now"\nstart = {(now + timedelta(minutes=5)).isoformat()}\n'
            f"end = {(now + timedelta(hours=1)).isoformat()}\nreplicas = 3\n"
        )
        plan = [sys.executable, "-m", "switchboard.ops.capacity", "plan", f"--calendar={calendar}", "--apply"]
        plan += [f"--run-dir={tmp_path}", "--floor=1"]
        more = subprocess.run(plan, capture_output=True, text=True, timeout=300)
        assert more.returncode == 0, more.stdout + more.stderr
        assert "scaling `make serve` from 2 to 3 replicas" in more.stdout and "replica 2 takes chats" in more.stdout
        listed = json.loads((tmp_path / "replicas.json").read_text())
        assert [r["name"] for r in listed] == ["replica-0", "replica-1", "replica-2"]
        base = argparse.Namespace(
            http_port=ports.http, grpc_port=ports.grpc, metrics_port=ports.metrics, run_dir=tmp_path
        )
        third = replica_arguments(base, 2)  # its ports, as `scale` gave them
        time.sleep(1.5)  # the pools publish their counters once a second
        before = kv_lookups(third.metrics_port)  # its warm-up chat
        # nine at once: the gateway opens new streams beside its pooled one, which HAProxy
        # spreads round robin over the three
        with ThreadPoolExecutor(9) as pool:
            list(pool.map(lambda i: ask(1), range(9)))
        time.sleep(1.5)
        assert kv_lookups(third.metrics_port) > before, "the replica added live took chats"

        pids = {i: int(pid_file(tmp_path / f"replica-{i}", "supervisor").read_text()) for i in (1, 2)}
        # scaled down under load: three clients chatting all along, none refused or cut
        stop, answered, failed = threading.Event(), [], []

        def chatting():
            while not stop.is_set():
                try:
                    ask(1)
                    answered.append(1)
                except Exception as e:  # noqa: BLE001 - every failure is reported below
                    failed.append(repr(e))

        load = [threading.Thread(target=chatting) for _ in range(3)]
        for t in load:
            t.start()
        try:
            fewer = run("scale", "--replicas", "1")
        finally:
            stop.set()
            for t in load:
                t.join(60)
        assert fewer.returncode == 0, fewer.stdout + fewer.stderr
        assert failed == [] and len(answered) > 10, (len(answered), failed[:3])
        assert "were cut" not in fewer.stdout, "drained before the deadline"
        assert "replica 2 stopped" in fewer.stdout and "replica 1 stopped" in fewer.stdout
        assert [r["name"] for r in json.loads((tmp_path / "replicas.json").read_text())] == ["replica-0"]
        assert not any(alive(pid) for pid in pids.values()), "the drained replicas' supervisors stopped"
        ask(3)  # replica 0 answers everything

        refused = run("scale", "--replicas", "0")
        assert refused.returncode == 1 and "from 1 to 16" in refused.stderr
    finally:
        down = run("down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not (tmp_path / "replicas.json").exists() and not (tmp_path / "fleet.json").exists()
    nothing = run("scale", "--replicas", "2")
    assert nothing.returncode == 1 and "is not running" in nothing.stderr

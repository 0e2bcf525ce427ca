"""Model rollout on a real server (switchboard/ops/rollout.py): a new version installed and
loaded through the operator-only model-repository API, a sticky canary share of sessions,
stats and metrics per version, automatic rollback of a canary that got slow, promotion of a
healthy one, a tampered artifact refused, KV never reused across versions. Each test runs its
own tritonserver on a copy of the repository (a rollout rewrites it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from switchboard.client import ChatClient, ChatError
from switchboard.ops.launch import OPERATOR_HEADER, Ports, Stack, operator_key
from switchboard.ops.rollout import Margins, Rollout, RolloutError, Server
from switchboard.repository.install import install_version
from switchboard.repository.versions import Repository
from switchboard.serving.canary import bucket
from switchboard.wire import CacheMiss

pytestmark = pytest.mark.integration
SESSIONS = [f"rollout-{i}" for i in range(40)]


@pytest.fixture
def private(artifacts, tmp_path):
    """A server on a copy of the repository (hard links for the artifacts) and its Rollout."""
    repo = tmp_path / "repo"
    shutil.copytree("model_repository", repo, copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    # A canary slowed down below answers from the FAQ within seconds, not the default ten.
    stack = Stack(
        Ports.free(), repository=repo, run_dir=tmp_path / "run", env={"SWITCHBOARD_ENGINE_FIRST_TOKEN_S": "3"}
    )
    stack.start()
    server = Server(f"http://127.0.0.1:{stack.ports.http}", f"http://127.0.0.1:{stack.ports.metrics}")
    lines: list[str] = []
    rollout = Rollout(repo, [server], operator_key(stack.run_dir), stack.run_dir, log=lines.append)
    yield stack, rollout, ChatClient(stack.grpc_url, timeout_s=60)
    stack.stop()


class Load:
    """Clients chatting without pause, each session in turn, every answer recorded."""

    def __init__(self, client: ChatClient, workers: int = 3):
        self.client, self.records, self.errors = client, [], []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(w, workers), daemon=True) for w in range(workers)]

    def _run(self, w: int, workers: int) -> None:
        turn = 0
        while not self._stop.is_set():
            for sid in SESSIONS[w::workers]:
                if self._stop.is_set():
                    return
                try:
                    reply = self.client.chat(
                        f"question {turn} about my order", session_id=sid, max_new_tokens=6, stream=False
                    )
                    self.records.append((time.monotonic(), sid, reply.stats))
                except ChatError as e:
                    self.errors.append((sid, str(e)))
            turn += 1

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(60)


def stub_pids(repo: Path, version: int) -> list[int]:
    """The Python-backend stubs serving ``version`` of the pools."""
    wanted = [str(repo / pool / str(version) / "model.py").encode() for pool in ("engine_short", "engine_long")]
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a in wanted for a in args):
                out.append(int(proc.name))
    return out


class Throttle:
    """The canary's stubs get a tenth of the time (SIGSTOP / SIGCONT): a version that is slow."""

    def __init__(self, pids: list[int]):
        self.pids, self._stop = pids, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _signal(self, sig) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            self._signal(signal.SIGSTOP)
            time.sleep(0.45)
            self._signal(signal.SIGCONT)
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self._signal(signal.SIGCONT)


def _timeline(rollout: Rollout) -> list[dict]:
    return [json.loads(line) for line in rollout.timeline.read_text().splitlines()]


def test_a_slow_canary_is_rolled_back_automatically_and_its_sessions_return_without_its_kv(private, artifacts):
    stack, rollout, client = private
    share = 0.3
    on_canary = {sid for sid in SESSIONS if bucket(sid) < share}
    assert 4 <= len(on_canary) <= 20  # the share holds over these 40 sessions
    t0 = time.time()
    with Load(client) as load:
        time.sleep(3)
        canary = rollout.start(artifacts, "fp32", share)
        assert canary == 2 and rollout.status()["served"] == [1, 2]
        t_canary = time.monotonic()
        time.sleep(4)  # the canary serves its share at full speed first
        with Throttle(stub_pids(stack.repository, canary)):
            verdict = rollout.watch(Margins(min_chats=8), watch_s=300, interval_s=1)
        t_back = time.monotonic()
        time.sleep(6)
    assert load.errors == []  # a slow canary costs FAQ answers at worst, never an error
    assert verdict.action == "rollback", verdict
    print(f"load: 3 clients over {len(SESSIONS)} sessions from 0 s; canary share {share}")
    for e in _timeline(rollout):  # the timeline, shown with `pytest -s`
        print(f"{e.pop('t') - t0:6.1f} s", json.dumps(e))
    events = [e["event"] for e in _timeline(rollout)]
    assert events[:2] == ["installed", "canary"] and events[-1] == "rolled_back" and "judged" in events

    during = [(sid, s) for t, sid, s in load.records if t_canary + 0.5 < t < t_back - 3]
    assert {sid for sid, s in during if s.model_version == canary} == on_canary  # the share, by session hash
    assert all(s.model_version == (canary if sid in on_canary else 1) for sid, s in during)  # sticky
    # (a chat that reached version 2 before the switch ends within the 3 s first-token deadline)
    after = [(sid, s) for t, sid, s in load.records if t > t_back + 3.5]
    assert after and all(s.model_version == 1 for _, s in after)
    # A session whose last answer came from version 2 reuses none of it on version 1: its next
    # turn finds a conversation of another model (blocks are keyed by version too).
    returns = []
    for sid in on_canary:
        turns = [s for _, x, s in load.records if x == sid]
        returns += [
            b for a, b in zip(turns, turns[1:]) if a.model_version == canary and not a.fallback and b.model_version == 1
        ]
    assert returns and all(s.cache_miss is CacheMiss.FINGERPRINT_CHANGED for s in returns)

    state = rollout.status()
    assert state["served"] == [1] and state["canary_version"] == 0 and state["installed"] == [1]
    assert not (stack.repository / "engine_short" / "2").exists()


def test_a_healthy_canary_is_promoted_and_then_serves_everyone(private, artifacts):
    stack, rollout, client = private
    with Load(client) as load:
        time.sleep(2)
        canary = rollout.start(artifacts, "fp32", 0.5)
        # A P99 over the canary's first handful of chats, on instances just loaded on a busy
        # 2-core machine, is noise (a clean-clone CI run rolled it back); the latency judge has
        # its own test above, with the default margins.
        verdict = rollout.watch(Margins(min_chats=5, ttft_p99_slack_s=0.5), watch_s=4, interval_s=1)
        t_promoted = time.monotonic()
        time.sleep(3)
    assert verdict.action == "promote" and load.errors == [], (verdict, load.errors[:3])
    assert rollout.status() == {
        "stable_version": canary,
        "canary_version": 0,
        "canary_share": 0.5,
        "served": [canary],
        "installed": [1, canary],
    }
    after = [s for t, _, s in load.records if t > t_promoted + 1]
    assert after and all(s.model_version == canary and not s.fallback for s in after)
    # the metrics say which version served
    text = urllib.request.urlopen(f"http://127.0.0.1:{stack.ports.metrics}/metrics").read().decode()
    assert 'switchboard_chat_requests_total{outcome="generated",pid=' in text and f'version="{canary}"' in text


def test_a_tampered_artifact_is_refused_and_the_stable_version_serves_on(private, artifacts, tmp_path):
    stack, rollout, client = private
    copy = tmp_path / "artifacts"
    shutil.copytree(artifacts, copy)
    with (copy / "model.onnx").open("r+b") as f:  # one byte of the weights
        f.seek(-100, os.SEEK_END)
        byte = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ValueError, match="do not match the manifest"):
        rollout.start(copy, "fp32", 0.1)
    assert rollout.status()["installed"] == [1]

    # Modified after the tool checked it: the pool's own check refuses to load it.
    repo = Repository(stack.repository)
    shutil.copytree(artifacts, copy, dirs_exist_ok=True)  # good bytes again
    install_version(repo, copy, 2, "fp32", tmp_path / "staging")
    with (stack.repository / "engine_short" / "2" / "model.onnx").open("r+b") as f:
        f.seek(-100, os.SEEK_END)
        f.write(b"\0")
    repo.set_served([1, 2])
    with pytest.raises(RolloutError, match="engine_short"):
        for pool in ("engine_short", "engine_long"):
            rollout.servers[0].load(pool, rollout.key)
    reply = client.chat("where is my order?", session_id="after-tamper", max_new_tokens=4, stream=False)
    assert reply.stats.model_version == 1 and not reply.stats.fallback


def test_the_model_repository_api_answers_only_the_operator_key(private):
    stack, rollout, _ = private
    url = f"http://127.0.0.1:{stack.ports.http}/v2/repository/models/chat/load"
    for headers in ({}, {OPERATOR_HEADER: "not-the-key"}):
        request = urllib.request.Request(url, data=b"{}", method="POST", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=10)
        assert e.value.code == 403 and b"restricted" in e.value.read()
    rollout.servers[0].load("chat", rollout.key)  # the key opens it

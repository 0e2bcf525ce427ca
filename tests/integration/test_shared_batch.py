"""Priority 1 in the shared batch (``priority_lane`` off, what a compute-bound model gets by
default) on the small default model, in a real server: priority 2 fills ``max_batch`` rows and
no more; priority 1 joins the same batch in the overflow row instead of a batch of its own."""

from __future__ import annotations

import threading
import time

import pytest

from perf.servertools import scrape
from switchboard.client import ChatClient
from switchboard.ops.launch import Ports, Stack

QUESTIONS = ("Where is my order?", "How do I get a refund?", "我的订单什么时候发货？", "Can I change my address?")


@pytest.fixture(scope="module")
def shared(artifacts, tmp_path_factory):
    env = {"SWITCHBOARD_PRIORITY_LANE": "off", "SWITCHBOARD_MAX_BATCH": "2", "SWITCHBOARD_PRIORITY_OVERFLOW_ROWS": "1"}
    s = Stack(Ports.free(), run_dir=tmp_path_factory.mktemp("shared"), env=env)
    s.start()
    yield s
    s.stop()


def batch_sizes(stack) -> dict[int, float]:
    out: dict[int, float] = {}
    for (name, labels), value in scrape(stack.ports.metrics, merge=("pid", "version", "model")).items():
        if name == "switchboard_engine_batch_steps_total" and value:
            out[int(dict(labels)["batch_size"])] = value
    return out


def load(stack, seconds: float, priorities: list[int]) -> list[Exception]:
    """One client thread per entry of ``priorities``, chatting without pause for ``seconds``."""
    errors: list[Exception] = []
    end = time.monotonic() + seconds

    def worker(i: int, priority: int) -> None:
        client = ChatClient(stack.grpc_url, timeout_s=60)
        k = 0
        while time.monotonic() < end:
            try:
                client.chat(QUESTIONS[(i + k) % len(QUESTIONS)], stream=False, priority=priority, max_new_tokens=48)
            except Exception as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)
            k += 1

    threads = [threading.Thread(target=worker, args=(i, p)) for i, p in enumerate(priorities)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_priority_one_takes_the_overflow_row_of_the_shared_batch(shared):
    assert not load(shared, 3.0, [2] * 6)
    alone = batch_sizes(shared)
    assert max(alone) == 2, f"priority 2 fills max_batch rows and no more: {alone}"
    assert not load(shared, 3.0, [2] * 6 + [1] * 2)
    mixed = batch_sizes(shared)
    assert max(mixed) == 3 and mixed[3] > 0, f"priority 1 decodes beside priority 2's full batch: {mixed}"

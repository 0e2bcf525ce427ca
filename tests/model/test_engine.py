"""The engine on the real exported default model (ONNX Runtime), driven step by step."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

from switchboard.artifact.manifest import Manifest
from switchboard.artifact.tokenizer import TextTokenizer
from switchboard.engine.runtime import OnnxDecoder
from switchboard.engine.scheduler import Engine, GenerationRequest


class Sink:
    def __init__(self, log=None, name=None):
        self.tokens, self.result, self.error = [], None, None
        self.log, self.name = log, name

    def on_tokens(self, ids):
        self.tokens += ids

    def on_finish(self, result):
        self.result = result
        if self.log is not None:
            self.log.append(self.name)

    def on_error(self, error):
        self.error = error

    def cancelled(self):
        return False


@pytest.fixture(scope="module")
def model(artifacts):
    manifest = Manifest.load(artifacts)
    return manifest, OnnxDecoder(artifacts, manifest, "fp32", threads=2), TextTokenizer(artifacts)


def engine(model, max_batch=8, priority_slots=0, preempt_steps=0, **kw):
    manifest, decoder, _ = model
    return Engine(
        decoder,
        max_batch=max_batch,
        max_waiting=64,
        stop_ids=set(manifest.eos_token_ids),
        priority_slots=priority_slots,
        preempt_steps=preempt_steps,
        **kw,
    )


def prompt(model, *turns):
    manifest, _, tok = model
    messages = [{"role": "system", "content": manifest.system_prompt}] if manifest.system_prompt else []
    messages += [{"role": r, "content": c} for r, c in turns]
    return tok.encode(tok.template.render(messages))


def run(e, requests):
    sinks = [Sink() for _ in requests]
    for r, s in zip(requests, sinks):
        e.submit(r, s)
    while any(s.result is None for s in sinks):
        e.step()
    return sinks


QUESTIONS = ["How do I return a damaged item?", "我的订单什么时候发货？", "Can I pay with PayPal?"]


def test_batched_generation_matches_each_sequence_alone(model):
    prompts = [prompt(model, ("user", q)) for q in QUESTIONS]
    alone = [run(engine(model), [GenerationRequest(p, 24)])[0].tokens for p in prompts]
    sinks = run(engine(model), [GenerationRequest(p, 24) for p in prompts])
    assert [s.tokens for s in sinks] == alone
    assert all(0 < s.result.prefill_ms < s.result.engine_ms for s in sinks)
    assert all(len(t) > 3 for t in alone)


def test_cached_prefix_gives_the_same_tokens_as_a_full_prefill(model):
    _, _, tok = model
    first = prompt(model, ("user", QUESTIONS[0]))
    sink = run(engine(model), [GenerationRequest(first, 32, return_cache=True)])[0]
    answer = tok.decode(sink.tokens)
    second = prompt(
        model, ("user", QUESTIONS[0]), ("assistant", answer), ("user", "And how long does the refund take?")
    )
    covered = first + sink.tokens[:-1]
    reused = 0
    while reused < min(len(covered), len(second)) and covered[reused] == second[reused]:
        reused += 1
    assert reused > len(first) // 2
    cache = np.ascontiguousarray(sink.result.cache[:, :, :, :reused])
    with_cache = run(engine(model), [GenerationRequest(second, 24, reused=reused, past=cache)])[0].tokens
    without = run(engine(model), [GenerationRequest(second, 24)])[0].tokens
    assert with_cache == without


def test_a_sequence_joining_a_running_batch_is_unaffected(model):
    p1, p2 = prompt(model, ("user", QUESTIONS[1])), prompt(model, ("user", QUESTIONS[2]))
    alone = run(engine(model), [GenerationRequest(p2, 20)])[0].tokens
    e = engine(model)
    first, late = Sink(), Sink()
    e.submit(GenerationRequest(p1, 40), first)
    for _ in range(5):
        e.step()
    e.submit(GenerationRequest(p2, 20), late)
    while late.result is None or first.result is None:
        e.step()
    assert late.tokens == alone


def test_priority_one_is_admitted_before_waiting_priority_two(model):
    order: list[str] = []
    e = engine(model, max_batch=1)
    p = prompt(model, ("user", QUESTIONS[0]))
    sinks = [Sink(order, f"p2-{i}") for i in range(3)] + [Sink(order, "p1")]
    for s in sinks:
        e.submit(GenerationRequest(p, 4, priority=1 if s.name == "p1" else 2), s)
    while any(s.result is None for s in sinks):
        e.step()
    assert order[0] == "p1"
    assert order[1:] == ["p2-0", "p2-1", "p2-2"]


def test_a_reserved_slot_lets_priority_one_start_while_priority_two_fills_the_batch(model):
    e = engine(model, max_batch=3, priority_slots=1)
    p = prompt(model, ("user", QUESTIONS[0]))
    background = [Sink(name=f"p2-{i}") for i in range(4)]
    for s in background:
        e.submit(GenerationRequest(p, 40), s)
    for _ in range(3):
        e.step()
    assert e.running() == 2 and e.waiting() == 2, "priority 2 may fill all but the reserved row"
    vip = Sink(name="p1")
    e.submit(GenerationRequest(p, 4, priority=1), vip)
    e.step()
    assert e.running() == 3 and e.waiting() == 2, "priority 1 starts at the next step"
    while vip.result is None:
        e.step()
    assert all(s.result is None for s in background), "the VIP finished before any priority-2 answer"


def test_priority_one_decodes_in_its_own_batch_while_priority_two_slows_but_advances(model):
    background_prompt, vip_prompt = prompt(model, ("user", QUESTIONS[0])), prompt(model, ("user", QUESTIONS[2]))
    alone = run(engine(model), [GenerationRequest(vip_prompt, 12)])[0].tokens
    e = engine(model, max_batch=4, priority_slots=1, preempt_steps=2)
    background = [Sink() for _ in range(3)]
    for s in background:
        e.submit(GenerationRequest(background_prompt, 80), s)
    e.step()  # one prefill for the three
    e.batch_sizes.clear()
    before = [len(s.tokens) for s in background]
    vip = Sink()
    e.submit(GenerationRequest(vip_prompt, 12, priority=1), vip)
    iterations = 0
    while vip.result is None:
        e.step()
        iterations += 1
    assert vip.tokens == alone, "its own batch, same tokens"
    assert set(e.batch_sizes) == {1, 3}, "priority 1 decoded alone, priority 2 in its own batch"
    vip_iterations = len(vip.tokens)  # its prefill, then one decode step per further token
    advanced = [len(s.tokens) - b for s, b in zip(background, before)]
    assert advanced == [iterations - vip_iterations] * 3
    assert advanced[0] >= (vip_iterations - 1) // 2, "one priority-2 step after every 2 of priority 1"
    assert all(s.result is None for s in background)


def test_priority_one_on_its_own_lane_never_waits_for_priority_two_rows(model):
    p = prompt(model, ("user", QUESTIONS[0]))
    e = engine(model, max_batch=3, priority_slots=1, preempt_steps=4)
    background = [Sink() for _ in range(3)]
    for s in background:
        e.submit(GenerationRequest(p, 60), s)
    e.step()
    assert e.running() == 2 and e.waiting() == 1, "priority 2 fills all but the reserved row"
    vips = [Sink() for _ in range(3)]
    for s in vips:
        e.submit(GenerationRequest(p, 8, priority=1), s)
    e.step()
    assert e.running() == 5 and e.waiting() == 1, "all three VIPs start at once, in their own lane's batch"
    while any(s.result is None for s in vips):
        e.step()
    assert all(s.result is None for s in background)


def test_priority_one_rows_count_against_priority_two(model):
    p = prompt(model, ("user", QUESTIONS[0]))
    e = engine(model, max_batch=3, priority_slots=1, preempt_steps=4)
    vips = [Sink() for _ in range(2)]
    for s in vips:
        e.submit(GenerationRequest(p, 12, priority=1), s)
    e.step()
    background = [Sink() for _ in range(2)]
    for s in background:
        e.submit(GenerationRequest(p, 12), s)
    while any(s.result is None for s in vips):
        assert e.running() == 2 and e.waiting() == 2, "priority 2 starts only below max_batch - priority_slots rows"
        e.step()
    while any(s.result is None for s in background):
        e.step()


def test_invalid_requests_are_refused_before_queueing(model):
    e = engine(model)
    with pytest.raises(ValueError, match="reused"):
        e.validate(GenerationRequest([1, 2, 3], 4, reused=3))
    with pytest.raises(ValueError, match="past KV shape"):
        e.validate(GenerationRequest([1, 2, 3], 4, reused=2, past=np.zeros((1, 2, 1, 2, 1), np.float32)))


def wait_for(sinks, timeout=60.0):
    deadline = time.monotonic() + timeout
    while any(s.result is None and s.error is None for s in sinks):
        assert time.monotonic() < deadline, "the engine's threads did not finish the sequences"
        time.sleep(0.01)


class RowWatch(Sink):
    """Records how many rows the engine holds each time a token arrives (any lane's thread)."""

    def __init__(self, e, rows):
        super().__init__()
        self.e, self.rows = e, rows

    def on_tokens(self, ids):
        super().on_tokens(ids)
        self.rows.append(self.e.running())


def test_lanes_on_threads_of_their_own_give_the_same_tokens_within_the_batch_limit(model):
    background_prompt, vip_prompt = prompt(model, ("user", QUESTIONS[0])), prompt(model, ("user", QUESTIONS[2]))
    vip_alone = run(engine(model), [GenerationRequest(vip_prompt, 12)])[0].tokens
    background_alone = run(engine(model), [GenerationRequest(background_prompt, 40)])[0].tokens
    e = engine(model, max_batch=3, priority_slots=1, preempt_steps=4, lane_threads=2, normal_nice=7)
    rows: list[int] = []
    background = [RowWatch(e, rows) for _ in range(4)]
    vips = [RowWatch(e, rows) for _ in range(2)]
    e.start()
    try:
        for s in background:
            e.submit(GenerationRequest(background_prompt, 40), s)
        for s in vips:
            e.submit(GenerationRequest(vip_prompt, 12, priority=1), s)
        threads = {t.name: t.native_id for t in threading.enumerate()}
        assert {"switchboard-engine-urgent", "switchboard-engine-normal"} <= set(threads)
        if sys.platform.startswith("linux"):
            own = os.getpriority(os.PRIO_PROCESS, 0)
            assert os.getpriority(os.PRIO_PROCESS, threads["switchboard-engine-normal"]) == min(own + 7, 19)
            assert os.getpriority(os.PRIO_PROCESS, threads["switchboard-engine-urgent"]) == own
        wait_for(background + vips)
    finally:
        e.stop()
    assert [s.tokens for s in vips] == [vip_alone] * 2
    assert [s.tokens for s in background] == [background_alone] * 4
    assert all(s.error is None for s in background + vips)
    assert max(rows) <= 2 + 2, "two lanes admitting at once: priority 2's two rows, the two VIPs' own"
    stats, sizes, waiting, running = e.snapshot()
    assert (waiting, running) == (0, 0) and stats["finished_length"] + stats["finished_stop"] == 6


class BrokenDecoder:
    def __init__(self, decoder):
        self.manifest, self.dtype = decoder.manifest, decoder.dtype

    def forward(self, *args):
        raise RuntimeError("device lost")


@pytest.mark.parametrize("lane_threads", [1, 2])
def test_a_failing_prefill_answers_the_sequences_it_admitted(model, lane_threads):
    manifest, decoder, _ = model
    e = Engine(
        BrokenDecoder(decoder),
        max_batch=4,
        max_waiting=8,
        stop_ids=set(manifest.eos_token_ids),
        priority_slots=1,
        preempt_steps=4,
        lane_threads=lane_threads,
    )
    sinks = [Sink() for _ in range(3)]
    e.start()
    try:
        for i, s in enumerate(sinks):
            e.submit(GenerationRequest(prompt(model, ("user", QUESTIONS[i])), 8, priority=1 + i % 2), s)
        wait_for(sinks, timeout=10)
        assert e.snapshot()[3] == 0
        ok = Sink()  # and the rows they took are free again
        e.submit(GenerationRequest(prompt(model, ("user", QUESTIONS[0])), 8), ok)
        wait_for([ok], timeout=10)
    finally:
        e.stop()
    assert all(isinstance(s.error, RuntimeError) for s in sinks + [ok])


class Timeline(Sink):
    """Records when each of its tokens arrived (any lane's thread)."""

    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def on_tokens(self, ids):
        super().on_tokens(ids)
        self.times.append(time.perf_counter())


def background_tokens_during_a_vip(model, hold_back_ms, vip_tokens, backlog):
    """How many tokens the first of priority 2's rows made while a priority-1 sequence of
    ``vip_tokens`` ran beside it on the lane threads, and the engine's held_back_s. Priority 2
    has 3 rows; ``backlog`` sequences more wait for one."""
    _, decoder, _ = model
    p = prompt(model, ("user", QUESTIONS[0]))
    # No stop tokens: every sequence runs to its max_new_tokens.
    e = Engine(
        decoder,
        max_batch=4,
        max_waiting=16,
        stop_ids=set(),
        priority_slots=1,
        preempt_steps=4,
        lane_threads=2,
        normal_nice=0,
        hold_back_ms=hold_back_ms,
    )
    background, vip = [Timeline() for _ in range(3 + backlog)], Timeline()
    e.start()
    try:
        for s in background:
            e.submit(GenerationRequest(p, 400), s)
        deadline = time.monotonic() + 30
        while len(background[0].times) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert e.waiting() == backlog
        e.submit(GenerationRequest(prompt(model, ("user", QUESTIONS[2])), vip_tokens, priority=1), vip)
        wait_for([vip])
    finally:
        e.stop()
    start, end = vip.times[0], vip.times[-1]
    return sum(start < t < end for t in background[0].times), e.snapshot()[0]["held_back_s"]


def test_a_backlogged_priority_two_waits_while_priority_one_decodes(model):
    during, held = background_tokens_during_a_vip(model, hold_back_ms=60_000, vip_tokens=16, backlog=1)
    assert during <= 1, "at most the step priority 2 was already in when the VIP arrived"
    assert held > 0
    during, held = background_tokens_during_a_vip(model, hold_back_ms=0, vip_tokens=16, backlog=1)
    assert during > 1 and held == 0, "without hold_back_ms the lanes decode side by side"


def test_priority_two_decodes_beside_priority_one_while_it_keeps_up(model):
    during, held = background_tokens_during_a_vip(model, hold_back_ms=60_000, vip_tokens=16, backlog=0)
    assert during > 1 and held == 0


def test_priority_two_still_steps_once_per_hold_back_while_priority_one_keeps_decoding(model):
    during, _ = background_tokens_during_a_vip(model, hold_back_ms=5, vip_tokens=120, backlog=1)
    assert during >= 2, "held back, never starved"

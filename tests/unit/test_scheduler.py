"""The engine's scheduler with a scripted decoder, no exported model: lanes, priority slots,
preemption, hold-back, cancellation, retirement, failures. (tests/model/test_engine.py runs the
same scheduler on the real model for what depends on the numbers: batched = alone, cached
prefixes.)"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from switchboard.engine.policy import Policy
from switchboard.engine.scheduler import Engine, GenerationRequest

VOCAB = 64
STOP = 63


class ScriptedDecoder:
    """A row's next token is its last input token + 1 (so a prompt ending in 10 generates 11,
    12, ...); the cache grows by the new columns. Each forward pass takes ``step_s`` (the lanes'
    threads overlap in it, as in ONNX Runtime, which releases the GIL)."""

    def __init__(self, step_s: float = 0.0, context_window: int = 256, fail: bool = False):
        self.manifest = SimpleNamespace(num_layers=2, num_kv_heads=1, head_dim=2, context_window=context_window)
        self.dtype = np.dtype(np.float32)
        self.step_s, self.fail = step_s, fail
        self.calls: list[tuple[int, int]] = []  # (rows, new tokens per row)
        self._lock = threading.Lock()

    def forward(self, ids, mask, pos, past):
        with self._lock:
            self.calls.append(ids.shape)
        if self.fail:
            raise RuntimeError("device lost")
        if self.step_s:
            time.sleep(self.step_s)
        rows, n = ids.shape
        assert past[0][0].shape[2] + n == mask.shape[1], "the cache and the mask disagree"
        logits = np.zeros((rows, n, VOCAB), np.float32)
        logits[np.arange(rows), -1, (ids[:, -1] + 1) % VOCAB] = 1.0
        new = np.zeros((rows, 1, n, 2), self.dtype)
        new[..., 0] = pos[:, None, :]  # the cache holds each column's position: checkable
        return logits, [(np.concatenate([k, new], 2), np.concatenate([v, new], 2)) for k, v in past]


class PackingDecoder(ScriptedDecoder):
    """``ScriptedDecoder`` that also takes packed passes (engine/packing.py); ``calls`` records
    one as ("packed", rows, tokens)."""

    packs = True

    def forward_packed(self, packed, past):
        rows, width = packed.attention_mask.shape[0], packed.width
        with self._lock:
            self.calls.append(("packed", rows, packed.tokens))
        assert past[0][0].shape[2] + width == packed.attention_mask.shape[1], "the cache and the mask disagree"
        logits = np.zeros((packed.logits_index.size, VOCAB), np.float32)
        logits[np.arange(packed.logits_index.size), (packed.input_ids[0, packed.logits_index] + 1) % VOCAB] = 1.0
        grid = np.zeros((rows * width, 2), self.dtype)
        grid[packed.token_index, 0] = packed.position_ids[0]  # each column's position, as ScriptedDecoder's
        new = grid.reshape(rows, 1, width, 2)
        return logits, [(np.concatenate([k, new], 2), np.concatenate([v, new], 2)) for k, v in past]


class Sink:
    def __init__(self, log=None, name=None, cancel_after=None):
        self.tokens, self.result, self.error, self.times, self.logprobs = [], None, None, [], []
        self.log, self.name, self.cancel_after = log, name, cancel_after

    def emit(self, ids, logprobs=None):
        self.tokens += ids
        self.times.append(time.perf_counter())
        self.logprobs.append(logprobs)

    def finish(self, result):
        self.result = result
        if self.log is not None:
            self.log.append(self.name)

    def fail(self, error):
        self.error = error

    def cancelled(self):
        return self.cancel_after is not None and len(self.tokens) >= self.cancel_after


def engine(decoder=None, max_batch=8, priority_slots=0, preempt_steps=0, stop_ids=(STOP,), **kw):
    return Engine(
        decoder or ScriptedDecoder(),
        max_batch=max_batch,
        max_waiting=64,
        stop_ids=set(stop_ids),
        priority_slots=priority_slots,
        preempt_steps=preempt_steps,
        **kw,
    )


def drain(e, sinks):
    while any(s.result is None and s.error is None for s in sinks):
        e.step()


def submit(e, sinks, prompt=(1, 2, 10), max_new=8, priority=2):
    for s in sinks:
        e.submit(GenerationRequest(list(prompt), max_new, priority=priority), s)
    return sinks


def test_planning_admits_without_running_the_model_and_applying_emits_and_retires():
    decoder = ScriptedDecoder()
    e = engine(decoder)
    [s] = submit(e, [Sink()], max_new=1)
    plan = e.schedule()
    assert [q.sink for q in plan.admitted] == [s] and not plan.decode
    assert decoder.calls == [] and e.running() == 0 and e.waiting() == 0  # a row taken, not yet running
    output = e.run(plan)
    assert decoder.calls == [(1, 3)] and s.tokens == []
    e.update_from_output(plan, output)
    assert s.tokens == [11] and s.result.reason == "length" and e.running() == 0


def test_banned_tokens_are_never_chosen_greedy_or_sampled():
    # The scripted model wants 11, 12, 13...; 12 and 13 are banned (control characters), so the
    # next best is chosen (all others tie at 0: the lowest id greedily, any other when sampled;
    # at temperature 0.05 the model's choice would win every draw).
    for temperature in (0.0, 0.05):
        e = engine(banned_ids={12, 13, STOP})
        s = Sink()
        e.submit(GenerationRequest([1, 2, 10], 6, temperature=temperature, seed=3), s)
        drain(e, [s])
        assert s.tokens[0] == 11 and not {12, 13} & set(s.tokens), s.tokens
    assert engine(banned_ids={12, STOP}).banned_ids.tolist() == [12], "an end of text is never banned"


def test_an_answer_never_ends_before_its_first_token():
    # A prompt ending in 62 makes the scripted model want STOP (63) first: it takes the next best
    # token instead; a stop token later in the answer still ends it.
    e = engine()
    first, later = Sink(), Sink()
    e.submit(GenerationRequest([1, 2, 62], 6), first)
    e.submit(GenerationRequest([1, 2, 61], 6), later)
    drain(e, [first, later])
    assert first.tokens and first.tokens[0] != STOP
    assert later.tokens == [62, STOP] and later.result.reason == "stop"


def test_an_iteration_prefills_what_it_admits_or_else_decodes_the_running_rows():
    decoder = ScriptedDecoder()
    e = engine(decoder)
    a, b = submit(e, [Sink(), Sink()], max_new=3)
    e.step()
    late = submit(e, [Sink()], prompt=(5, 6, 7, 20), max_new=2)[0]
    drain(e, [a, b, late])
    assert decoder.calls == [(2, 3), (1, 4), (3, 1), (2, 1)]  # prefill, the late one's prefill, decodes
    assert a.tokens == b.tokens == [11, 12, 13] and late.tokens == [21, 22]
    stats = e.snapshot()[0]
    assert stats["prefill_batches"] == 2 and stats["decode_steps"] == 2 and stats["finished_length"] == 3
    assert e.batch_sizes == {3: 1, 2: 1}


def test_rows_leave_on_a_stop_token_at_max_new_tokens_or_at_the_context_window():
    e = engine(ScriptedDecoder(context_window=8))
    stop, length, window = Sink(), Sink(), Sink()
    e.submit(GenerationRequest([1, STOP - 2], 10), stop)
    e.submit(GenerationRequest([1, 2], 2), length)
    e.submit(GenerationRequest([1, 2, 3, 4, 5, 6], 10), window)
    drain(e, [stop, length, window])
    assert stop.tokens == [STOP - 1, STOP] and stop.result.reason == "stop"
    assert length.tokens == [3, 4] and length.result.reason == "length"
    # positions 6 and 7 fill a window of 8; the token sampled from position 7 is the last
    assert len(window.tokens) == 3 and window.result.reason == "length"


def test_a_finished_row_returns_its_own_cache_when_asked():
    e = engine()
    short, long = Sink(), Sink()
    e.submit(GenerationRequest([4, 5], 2, return_cache=True), short)
    e.submit(GenerationRequest([1, 2, 3, 9], 4, return_cache=True), long)
    drain(e, [short, long])
    cache = short.result.cache  # [layers, 2, heads, prompt + tokens - 1, dim]: its real columns only
    assert cache.shape == (2, 2, 1, 3, 2) and cache[0, 0, 0, :, 0].tolist() == [0, 1, 2]
    assert long.result.cache[1, 1, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_a_cached_prefix_is_prefilled_on_top_of_not_again():
    decoder = ScriptedDecoder()
    e = engine(decoder)
    past = np.zeros((2, 2, 1, 3, 2), np.float32)
    [s] = [Sink()]
    e.submit(GenerationRequest([1, 2, 3, 4, 30], 2, reused=3, past=past), s)
    drain(e, [s])
    assert decoder.calls[0] == (1, 2) and s.tokens == [31, 32] and e.snapshot()[0]["prefill_tokens"] == 2


def test_invalid_requests_are_refused_before_queueing():
    e = engine(ScriptedDecoder(context_window=8))
    with pytest.raises(ValueError, match="empty prompt"):
        e.validate(GenerationRequest([], 4))
    with pytest.raises(ValueError, match="reused"):
        e.validate(GenerationRequest([1, 2, 3], 4, reused=3))
    with pytest.raises(ValueError, match="past KV shape"):
        e.validate(GenerationRequest([1, 2, 3], 4, reused=2, past=np.zeros((1, 2, 1, 2, 1), np.float32)))
    with pytest.raises(ValueError, match="context window 8"):
        e.validate(GenerationRequest(list(range(8)), 4))
    assert e.waiting() == 0


def test_priority_one_is_admitted_before_waiting_priority_two():
    order: list[str] = []
    e = engine(max_batch=1)
    sinks = [Sink(order, f"p2-{i}") for i in range(3)] + [Sink(order, "p1")]
    for s in sinks:
        e.submit(GenerationRequest([1, 2], 4, priority=1 if s.name == "p1" else 2), s)
    drain(e, sinks)
    assert order == ["p1", "p2-0", "p2-1", "p2-2"]


def test_the_engine_asks_its_policy_so_a_new_one_is_one_class():
    class Fifo(Policy):
        def rank(self, priority, order):
            return (order,)

    order: list[str] = []
    e = Engine(ScriptedDecoder(), max_batch=1, max_waiting=8, stop_ids={STOP}, policy=Fifo(1))
    sinks = [Sink(order, "p2"), Sink(order, "p1")]
    for s in sinks:
        e.submit(GenerationRequest([1, 2], 2, priority=int(s.name[1])), s)
    drain(e, sinks)
    assert order == ["p2", "p1"], "arrival order, whatever the priority"


def test_a_reserved_slot_lets_priority_one_start_while_priority_two_fills_the_batch():
    e = engine(max_batch=3, priority_slots=1)
    background = submit(e, [Sink() for _ in range(4)], max_new=40)
    for _ in range(3):
        e.step()
    assert e.running() == 2 and e.waiting() == 2, "priority 2 may fill all but the reserved row"
    vip = submit(e, [Sink()], max_new=4, priority=1)[0]
    e.step()
    assert e.running() == 3 and e.waiting() == 2, "priority 1 starts at the next step"
    drain(e, [vip])
    assert all(s.result is None for s in background), "the VIP finished before any priority-2 answer"


def test_in_one_shared_batch_priority_one_takes_an_overflow_row_past_a_full_batch():
    e = engine(max_batch=3, priority_overflow=1)
    background = submit(e, [Sink() for _ in range(5)], max_new=40)
    for _ in range(3):
        e.step()
    assert e.running() == 3 and e.waiting() == 2, "priority 2 fills max_batch, not the overflow row"
    vips = submit(e, [Sink(), Sink()], max_new=4, priority=1)
    e.step()
    assert e.running() == 4 and e.waiting() == 3, "one VIP starts at the next step, the second waits for a row"
    e.batch_sizes.clear()
    drain(e, vips[:1])
    assert max(e.batch_sizes) == 4, "the VIP decodes in the same batch as priority 2"
    assert all(s.result is None for s in background)


def test_overflow_rows_are_off_when_priority_one_has_its_own_lane():
    assert engine(max_batch=3, priority_overflow=2, preempt_steps=4).policy.priority_overflow == 0


def test_priority_one_decodes_in_its_own_batch_while_priority_two_slows_but_advances():
    e = engine(max_batch=4, priority_slots=1, preempt_steps=2)
    background = submit(e, [Sink() for _ in range(3)], max_new=60)
    e.step()  # one prefill for the three
    e.batch_sizes.clear()
    before = [len(s.tokens) for s in background]
    vip = submit(e, [Sink()], prompt=(7, 30), max_new=12, priority=1)[0]
    iterations = 0
    while vip.result is None:
        e.step()
        iterations += 1
    assert vip.tokens == list(range(31, 43))
    assert set(e.batch_sizes) == {1, 3}, "priority 1 decoded alone, priority 2 in its own batch"
    advanced = [len(s.tokens) - b for s, b in zip(background, before)]
    assert advanced == [iterations - len(vip.tokens)] * 3
    assert advanced[0] >= (len(vip.tokens) - 1) // 2, "one priority-2 step after every 2 of priority 1"
    assert all(s.result is None for s in background)


def test_without_preemption_all_priorities_share_one_lane():
    e = engine(max_batch=4)
    submit(e, [Sink() for _ in range(2)], max_new=10)
    e.step()
    submit(e, [Sink()], max_new=10, priority=1)
    e.step()
    e.batch_sizes.clear()
    e.step()
    assert e.batch_sizes == {3: 1}


def test_priority_one_on_its_own_lane_never_waits_for_priority_two_rows():
    e = engine(max_batch=3, priority_slots=1, preempt_steps=4)
    background = submit(e, [Sink() for _ in range(3)], max_new=60)
    e.step()
    assert e.running() == 2 and e.waiting() == 1, "priority 2 fills all but the reserved row"
    vips = submit(e, [Sink() for _ in range(3)], max_new=8, priority=1)
    e.step()
    assert e.running() == 5 and e.waiting() == 1, "all three VIPs start at once, in their own lane's batch"
    drain(e, vips)
    assert all(s.result is None for s in background)


def test_priority_one_rows_count_against_priority_two():
    e = engine(max_batch=3, priority_slots=1, preempt_steps=4)
    vips = submit(e, [Sink() for _ in range(2)], max_new=12, priority=1)
    e.step()
    background = submit(e, [Sink() for _ in range(2)], max_new=12)
    while any(s.result is None for s in vips):
        assert e.running() == 2 and e.waiting() == 2, "priority 2 starts only below max_batch - priority_slots rows"
        e.step()
    drain(e, background)


def test_a_sequence_cancelled_while_waiting_is_dropped_at_admission_and_frees_its_row():
    decoder = ScriptedDecoder()
    e = engine(decoder, max_batch=1)
    first, gone, last = Sink(), Sink(cancel_after=0), Sink()
    submit(e, [first, gone, last], max_new=2)
    drain(e, [first, gone, last])
    assert gone.result.reason == "cancelled" and gone.tokens == [] and gone.result.cache is None
    assert first.result.reason == last.result.reason == "length"
    assert [rows for rows, _ in decoder.calls] == [1, 1, 1, 1], "nobody ever computed the cancelled one"


def test_a_running_sequence_the_client_cancels_leaves_at_the_next_step():
    e = engine()
    stays, leaves = Sink(), Sink(cancel_after=3)
    submit(e, [stays, leaves], max_new=10)
    drain(e, [stays, leaves])
    assert leaves.result.reason == "cancelled" and len(leaves.tokens) == 3
    assert stays.result.reason == "length" and len(stays.tokens) == 10
    assert e.snapshot()[0]["finished_cancelled"] == 1 and e.running() == 0


class BrokenSink(Sink):
    def emit(self, ids, logprobs=None):
        raise ConnectionError("client gone")


def test_a_sink_that_raises_drops_its_sequence_not_the_batch():
    e = engine()
    ok, broken = Sink(), BrokenSink()
    submit(e, [broken, ok], max_new=4)
    drain(e, [ok])
    assert ok.tokens == [11, 12, 13, 14] and broken.result is None and broken.error is None
    assert e.running() == 0 and e.snapshot()[0]["finished_length"] == 1


def wait_for(sinks, timeout=20.0):
    deadline = time.monotonic() + timeout
    while any(s.result is None and s.error is None for s in sinks):
        assert time.monotonic() < deadline, "the engine's threads did not finish the sequences"
        time.sleep(0.002)


@pytest.mark.parametrize("prefill_budget", [0, 2])
@pytest.mark.parametrize("lane_threads", [1, 2])
def test_a_failing_prefill_answers_the_sequences_it_admitted_and_frees_their_rows(lane_threads, prefill_budget):
    decoder = ScriptedDecoder(fail=True)
    e = engine(
        decoder,
        max_batch=4,
        priority_slots=1,
        preempt_steps=4,
        lane_threads=lane_threads,
        prefill_budget=prefill_budget,
    )
    sinks = [Sink() for _ in range(3)]
    e.start()
    try:
        for i, s in enumerate(sinks):
            e.submit(GenerationRequest([1, 2, 3], 8, priority=1 + i % 2), s)
        wait_for(sinks)
        assert e.snapshot()[3] == 0
        decoder.fail = False
        ok = submit(e, [Sink()])[0]
        wait_for([ok])
    finally:
        e.stop()
    assert all(isinstance(s.error, RuntimeError) for s in sinks) and ok.result.reason == "length"


@pytest.mark.parametrize("prefill_budget", [0, 2])
def test_lanes_on_threads_of_their_own_run_at_their_nice_levels_within_the_batch_limit(prefill_budget):
    e = engine(
        ScriptedDecoder(step_s=0.001),
        max_batch=3,
        priority_slots=1,
        preempt_steps=4,
        lane_threads=2,
        normal_nice=7,
        prefill_budget=prefill_budget,  # 2: the 3-token prompts in two chunks
    )
    rows: list[int] = []

    class Rows(Sink):
        def emit(self, ids, logprobs=None):
            super().emit(ids, logprobs)
            rows.append(e.running())

    background, vips = [Rows() for _ in range(4)], [Rows() for _ in range(2)]
    e.start()
    try:
        submit(e, background, max_new=40)
        submit(e, vips, prompt=(7, 30), max_new=12, priority=1)
        threads = {t.name: t.native_id for t in threading.enumerate()}
        assert {"switchboard-engine-urgent", "switchboard-engine-normal"} <= set(threads)
        if sys.platform.startswith("linux"):
            own = os.getpriority(os.PRIO_PROCESS, 0)
            assert os.getpriority(os.PRIO_PROCESS, threads["switchboard-engine-normal"]) == min(own + 7, 19)
            assert os.getpriority(os.PRIO_PROCESS, threads["switchboard-engine-urgent"]) == own
        wait_for(background + vips)
    finally:
        e.stop()
    assert [s.tokens for s in vips] == [list(range(31, 43))] * 2
    assert [s.tokens for s in background] == [list(range(11, 51))] * 4
    assert max(rows) <= 2 + 2, "two lanes admitting at once: priority 2's two rows, the two VIPs' own"
    stats, _, waiting, running = e.snapshot()
    assert (waiting, running) == (0, 0) and stats["finished_length"] == 6


def background_tokens_during_a_vip(hold_back_ms, vip_tokens, backlog):
    """How many tokens the first of priority 2's rows made while a priority-1 sequence of
    ``vip_tokens`` ran beside it on the lane threads, and the engine's held_back_s. Priority 2
    has 3 rows; ``backlog`` sequences more wait for one."""
    e = engine(
        ScriptedDecoder(step_s=0.002),
        max_batch=4,
        stop_ids=(),
        priority_slots=1,
        preempt_steps=4,
        lane_threads=2,
        normal_nice=0,
        hold_back_ms=hold_back_ms,
    )
    background, vip = [Sink() for _ in range(3 + backlog)], Sink()
    e.start()
    try:
        submit(e, background, max_new=4000)
        deadline = time.monotonic() + 10
        while len(background[0].times) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert e.waiting() == backlog
        submit(e, [vip], max_new=vip_tokens, priority=1)
        wait_for([vip])
        # Priority 2 decodes again before the engine stops: a hold is counted when it ends, and
        # an engine stopped while the lane is still held would count none.
        resumed = len(background[0].times)
        while len(background[0].times) <= resumed:
            assert time.monotonic() < deadline + 10
            time.sleep(0.001)
    finally:
        e.stop()
    start, end = vip.times[0], vip.times[-1]
    return sum(start < t < end for t in background[0].times), e.snapshot()[0]["held_back_s"]


def test_a_backlogged_priority_two_waits_while_priority_one_decodes():
    during, held = background_tokens_during_a_vip(hold_back_ms=60_000, vip_tokens=16, backlog=1)
    assert during <= 1, "at most the step priority 2 was already in when the VIP arrived"
    assert held > 0
    during, held = background_tokens_during_a_vip(hold_back_ms=0, vip_tokens=16, backlog=1)
    assert during > 1 and held == 0, "without hold_back_ms the lanes decode side by side"


def test_priority_two_decodes_beside_priority_one_while_it_keeps_up():
    during, held = background_tokens_during_a_vip(hold_back_ms=60_000, vip_tokens=16, backlog=0)
    assert during > 1 and held == 0


def test_priority_two_still_steps_once_per_hold_back_while_priority_one_keeps_decoding():
    during, _ = background_tokens_during_a_vip(hold_back_ms=5, vip_tokens=120, backlog=1)
    assert during >= 2, "held back, never starved"


# -- chunked prefill: a budget of prompt positions per forward pass ------------------------------

LONG = [1] * 399 + [10]  # 400 tokens: generates 11, 12, ...


def chunked(budget, max_batch=8, **kw):
    decoder = ScriptedDecoder(context_window=1024, **kw)
    return decoder, engine(decoder, max_batch=max_batch, prefill_budget=budget)


def positions(cache):
    return cache[0, 0, 0, :, 0].tolist()  # ScriptedDecoder writes each column's position id


def test_a_long_prompt_is_prefilled_in_chunks_of_at_most_the_budget_with_the_same_tokens():
    results = {}
    for budget in (0, 64):
        decoder, e = chunked(budget)
        [s] = [Sink()]
        e.submit(GenerationRequest(LONG, 5, return_cache=True), s)
        drain(e, [s])
        results[budget] = s.tokens, positions(s.result.cache)
    # decoder, e and s are the budget-64 run's
    assert decoder.calls == [(1, 64)] * 6 + [(1, 16)] + [(1, 1)] * 4
    assert results[64] == results[0] == ([11, 12, 13, 14, 15], list(range(404)))
    stats = e.snapshot()[0]
    assert (stats["prefill_chunks"], stats["prefill_batches"]) == (7, 1), "seven passes, one group joined"
    assert stats["prefill_tokens"] == stats["prefill_padded_tokens"] == 400
    assert stats["prefill_s"] > 0 and stats["decode_s"] > 0 and stats["decode_steps"] == 4
    assert 0 < s.result.prefill_ms < s.result.engine_ms


def long_prompt_beside_a_decoding_row(budget, decoder=None):
    """The forward passes from a 400-token prompt's admission to its first token, and how many
    tokens a row that was already decoding got meanwhile."""
    decoder = decoder or ScriptedDecoder(context_window=1024)
    e = engine(decoder, prefill_budget=budget)
    short = submit(e, [Sink()], max_new=100)[0]
    e.step()  # its prefill
    e.step()  # a decode step
    before, calls = len(short.tokens), len(decoder.calls)
    long = Sink()
    e.submit(GenerationRequest(LONG, 4), long)
    while not long.tokens:
        e.step()
    return decoder.calls[calls:], len(short.tokens) - before


def test_a_decoding_row_gets_a_token_between_every_two_chunks_of_a_long_prompt():
    calls, tokens = long_prompt_beside_a_decoding_row(64)
    assert calls == [(1, 64), (1, 1)] * 6 + [(1, 16)], "a chunk, a decode step of the running row, ..."
    assert tokens == 6
    calls, tokens = long_prompt_beside_a_decoding_row(0)
    assert calls == [(1, 400)] and tokens == 0, "without a budget the row waits for the whole prefill"


@pytest.mark.parametrize("budget", [64, 0])
def test_on_a_packing_decoder_each_chunk_rides_in_the_decode_pass(budget):
    """A mixed pass: the running row's token and the long prompt's chunk in one packed pass, so
    the row gets a token in every pass and the prompt never waits for a decode step."""
    calls, tokens = long_prompt_beside_a_decoding_row(budget, PackingDecoder(context_window=1024))
    if budget:
        assert calls == [("packed", 2, 65)] * 6 + [("packed", 2, 17)]
    else:
        assert calls == [("packed", 2, 401)]
    assert tokens == len(calls)


def test_mixed_passes_give_the_tokens_and_caches_of_passes_apart():
    results = []
    for decoder in (ScriptedDecoder(context_window=1024), PackingDecoder(context_window=1024)):
        e = engine(decoder, prefill_budget=64)
        first = submit(e, [Sink()], max_new=30)[0]
        e.step()
        later = [Sink(), Sink()]
        e.submit(GenerationRequest(LONG[:150], 6, return_cache=True), later[0])
        e.submit(GenerationRequest([3, 4, 5], 6, return_cache=True), later[1])
        drain(e, [first, *later])
        results.append(
            [(s.tokens, positions(s.result.cache) if s.result.cache is not None else None) for s in [first, *later]]
        )
        if isinstance(decoder, PackingDecoder):
            assert e.snapshot()[0]["mixed_passes"] >= 3
    assert results[0] == results[1]


def test_short_prompts_share_a_pass_while_their_chunks_fit_the_budget():
    prompts = [[1] * 19 + [10 * i] for i in range(1, 5)]  # 20 tokens each
    decoder, e = chunked(64)
    sinks = [Sink() for _ in prompts]
    for p, s in zip(prompts, sinks):
        e.submit(GenerationRequest(p, 3), s)
    drain(e, sinks)
    assert decoder.calls[:3] == [(3, 20), (3, 1), (1, 20)], "3 x 20 fits 64, a fourth does not"
    assert [s.tokens for s in sinks] == [[10 * i + 1, 10 * i + 2, 10 * i + 3] for i in range(1, 5)]
    assert [s.result.batch_size_at_admission for s in sinks] == [3, 3, 3, 4]


def test_a_cached_prefix_plus_chunks_gives_the_tokens_and_cache_of_one_prefill():
    def past(n):
        kv = np.zeros((2, 2, 1, n, 2), np.float32)
        kv[..., 0] = np.arange(n)
        return kv

    def requests():  # remaining after the cached prefix: 20, 30, 110
        return [
            GenerationRequest([1] * 59 + [10], 3, reused=40, past=past(40), return_cache=True),
            GenerationRequest([1] * 29 + [20], 3, return_cache=True),
            GenerationRequest([1] * 129 + [30], 3, reused=20, past=past(20), return_cache=True),
        ]

    results = {}
    for budget in (0, 64):
        decoder, e = chunked(budget)
        sinks = [Sink() for _ in range(3)]
        for r, s in zip(requests(), sinks):
            e.submit(r, s)
        drain(e, sinks)
        results[budget] = [(s.tokens, positions(s.result.cache)) for s in sinks]
        assert e.snapshot()[0]["prefill_tokens"] == 20 + 30 + 110
    assert decoder.calls[:4] == [(2, 30), (2, 1), (1, 64), (2, 1)]
    assert decoder.calls[4] == (1, 46)
    assert results[64] == results[0]
    assert [p for _, p in results[64]] == [list(range(62)), list(range(32)), list(range(132))]


def test_a_priority_one_prompt_is_prefilled_before_a_long_priority_two_one_in_progress():
    decoder, e = chunked(64)
    background, vip = Sink(), Sink()
    e.submit(GenerationRequest(LONG, 4), background)
    e.step()
    e.submit(GenerationRequest([7, 30], 4, priority=1), vip)
    e.step()
    assert decoder.calls == [(1, 64), (1, 2)] and vip.tokens == [31]
    drain(e, [vip, background])
    assert background.tokens == [11, 12, 13, 14]


def test_a_sequence_cancelled_between_chunks_is_dropped_and_frees_its_row():
    decoder, e = chunked(64, max_batch=1)
    gone, next_ = Sink(), Sink()
    e.submit(GenerationRequest(LONG, 4), gone)
    submit(e, [next_], max_new=2)
    e.step()
    assert (e.running(), e.waiting()) == (1, 1)
    gone.cancel_after = 0  # the client leaves during the prefill
    drain(e, [gone, next_])
    assert gone.result.reason == "cancelled" and gone.tokens == [] and gone.error is None
    assert next_.tokens == [11, 12] and e.running() == 0
    assert decoder.calls == [(1, 64), (1, 3), (1, 1)], "nobody computed the cancelled prompt further"


def test_a_failing_chunk_answers_its_sequences_and_frees_their_rows():
    decoder, e = chunked(64, max_batch=2)
    first, second = Sink(), Sink()
    e.submit(GenerationRequest(LONG, 4), first)
    e.submit(GenerationRequest(LONG, 4), second)
    e.step()  # the first's first chunk: 400-token prompts go one at a time
    decoder.fail = True
    with pytest.raises(RuntimeError, match="device lost"):
        e.step()
    assert isinstance(first.error, RuntimeError) and e.running() == 1, "the second was not in that chunk"
    decoder.fail = False
    later = submit(e, [Sink()], max_new=2)[0]
    drain(e, [second, later])
    assert second.tokens == [11, 12, 13, 14] and later.tokens == [11, 12]
    assert first.tokens == [] and first.result is None and e.running() == 0


def test_stop_answers_sequences_in_the_middle_of_their_prefill():
    _, e = chunked(64, max_batch=2)
    decoding, prefilling, waiting = Sink(), Sink(), Sink()
    submit(e, [decoding], max_new=50)
    e.step()
    e.submit(GenerationRequest(LONG, 4), prefilling)
    e.submit(GenerationRequest(LONG, 4), waiting)
    e.step()
    e.step()
    assert (e.running(), e.waiting()) == (2, 1)
    e.stop()
    assert all(str(s.error) == "engine stopped" for s in (decoding, prefilling, waiting))
    assert prefilling.tokens == [] and e.snapshot()[2:] == (0, 0)


def test_a_priority_one_prompt_goes_right_after_a_priority_two_chunk_not_a_decode_step_later():
    decoder, e = chunked(64)
    row, background, vip = Sink(), Sink(), Sink()
    e.submit(GenerationRequest([1, 2, 10], 50), row)
    e.step()  # the row is decoding
    e.submit(GenerationRequest(LONG, 4), background)
    e.step()  # the row's decode step
    e.step()  # a priority-2 chunk: a decode step of the row would be next
    e.submit(GenerationRequest([1] * 99 + [30], 4, priority=1), vip)  # 100 tokens: two chunks
    calls = len(decoder.calls)
    while not vip.tokens:
        e.step()
    assert decoder.calls[calls:] == [(1, 64), (1, 1), (1, 36)], "its first chunk at once, then alternating"
    assert decoder.calls[calls - 1] == (1, 64) and vip.tokens == [31]
    drain(e, [row, background, vip])
    assert background.tokens == [11, 12, 13, 14] and row.tokens[:3] == [11, 12, 13]


class Spelled:
    """A constraint that allows exactly ``word``'s tokens, in order (a grammar's stand-in)."""

    def __init__(self, word):
        self.word, self.at, self.masked = list(word), 0, 0

    def mask(self, logits):
        self.masked += 1
        keep = logits[self.word[self.at]]
        logits[:] = -np.inf
        logits[self.word[self.at]] = keep
        return True

    cut = False

    def choose(self, token, budget):
        return token

    def accept(self, token):
        ok = token == self.word[self.at]
        self.at += 1
        return ok

    @property
    def finished(self):
        return self.at == len(self.word)


def test_a_constrained_row_samples_only_what_its_grammar_allows_and_ends_when_complete():
    e = engine()
    free, spelled = Sink(), Sink()
    constraint = Spelled([40, 41, 5])
    e.submit(GenerationRequest([1, 2, 10], 6), free)
    e.submit(GenerationRequest([1, 2, 10], 6, constraint=constraint), spelled)
    drain(e, [free, spelled])
    assert spelled.tokens == [40, 41, 5] and spelled.result.reason == "stop", "no stop token needed"
    assert free.tokens == [11, 12, 13, 14, 15, 16], "the other row in the batch is untouched"
    assert constraint.masked == 3


def test_a_grammar_that_allows_nothing_ends_the_row():
    class Nothing(Spelled):
        def mask(self, logits):
            return False

    e = engine()
    s = Sink()
    e.submit(GenerationRequest([1, 2, 10], 6, constraint=Nothing([1])), s)
    drain(e, [s])
    assert s.tokens == [STOP] and s.result.reason == "stop"


def test_logprobs_come_with_each_token_when_asked_and_only_then():
    class LogSink(Sink):
        def __init__(self):
            super().__init__()
            self.entries = []

        def emit(self, ids, logprobs=None):
            super().emit(ids, logprobs)
            self.entries += logprobs

    e = engine()
    asked, plain = LogSink(), Sink()
    e.submit(GenerationRequest([1, 2, 10], 3, logprobs=2), asked)
    e.submit(GenerationRequest([1, 2, 10], 3), plain)
    drain(e, [asked, plain])
    assert plain.logprobs == [None, None, None]
    assert asked.tokens == plain.tokens == [11, 12, 13] and len(asked.entries) == 3
    # ScriptedDecoder: logit 1 for the next token, 0 for the others; an answer's first token
    # is never the stop token, so it is out of the first distribution (what sampling saw)
    for i, (token, (lp, top)) in enumerate(zip(asked.tokens, asked.entries)):
        others = VOCAB - 1 - (i == 0)
        assert lp == pytest.approx(1 - np.log(np.e + others)) and top[0] == (token, pytest.approx(lp))
        assert len(top) == 2 and top[1][1] == pytest.approx(-np.log(np.e + others))


class Closing:
    """A grammar's stand-in that allows any token and is finished by ``end`` (two tokens), written
    once the budget leaves room for no more: what ``RowConstraint.choose`` does."""

    def __init__(self, end=(50, 51)):
        self.end, self.plan, self.budgets, self.cut, self.done = list(end), [], [], False, False

    def mask(self, logits):
        return True

    def choose(self, token, budget):
        self.budgets.append(budget)
        if not self.plan and budget - 1 < len(self.end):
            self.plan, self.cut = list(self.end), True
        return self.plan[0] if self.plan else token

    def accept(self, token):
        if self.plan:
            self.plan.pop(0)
            self.done = not self.plan
        return True

    @property
    def finished(self):
        return self.done


def test_a_constrained_row_is_finished_within_its_budget_and_ends_as_length():
    e = engine()
    s, c = Sink(), Closing()
    e.submit(GenerationRequest([1, 2, 10], 5, constraint=c), s)
    drain(e, [s])
    assert s.tokens == [11, 12, 13, 50, 51] and s.result.reason == "length", "the budget ended it, finished"
    assert c.budgets == [5, 4, 3, 2, 1], "each step: the tokens left, this one included"


def test_the_budget_a_constraint_gets_ends_where_the_context_window_does():
    e = engine(ScriptedDecoder(context_window=8))
    s, c = Sink(), Closing()
    e.submit(GenerationRequest([1, 2, 3, 4, 10], 50, constraint=c), s)
    drain(e, [s])
    assert c.budgets[0] == 4 and s.tokens == [11, 12, 50, 51] and s.result.reason == "length"


class Looping(ScriptedDecoder):
    """Every row's next token: 7 (logit 1.0) before 8 (0.5) before the rest (0): a model that loops."""

    def forward(self, ids, mask, pos, past):
        logits, present = super().forward(ids, mask, pos, past)
        logits[:] = 0.0
        logits[:, :, 7], logits[:, :, 8] = 1.0, 0.5
        return logits, present


@pytest.mark.parametrize(
    "presence, frequency, want",
    [
        (0.0, 0.0, [7, 7, 7, 7, 7]),
        (0.6, 0.0, [7, 8, 7, 7, 7]),  # 7 at 0.4 after its first: above 8's 0.5 - 0.6 once 8 appeared
        (0.0, 0.3, [7, 7, 8, 7, 8]),  # 7 at 1.0 - 0.3n, 8 at 0.5 - 0.3n
        (-0.6, 0.0, [7, 7, 7, 7, 7]),  # a negative penalty favours what was written
    ],
)
def test_presence_and_frequency_penalties_count_each_rows_own_tokens(presence, frequency, want):
    e = engine(Looping())
    penalized, free = Sink(), Sink()
    e.submit(GenerationRequest([1, 2, 10], 5, presence_penalty=presence, frequency_penalty=frequency), penalized)
    e.submit(GenerationRequest([1, 2, 10], 5), free)
    drain(e, [penalized, free])
    assert penalized.tokens == want
    assert free.tokens == [7] * 5, "a row in the same batch is untouched"


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [2.5, -2.01, float("nan")])
def test_a_penalty_outside_its_range_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=f"^{field}: .* is outside \\[-2, 2\\]"):
        engine().submit(GenerationRequest([1, 2, 10], 4, **{field: value}), Sink())

"""The engine on the real exported default model (ONNX Runtime): what depends on the numbers
(batched = alone, cached prefixes, lanes on threads). Scheduling itself is tested with a
scripted decoder in tests/unit/test_scheduler.py."""

from __future__ import annotations

import time

import numpy as np
import pytest

from switchboard.artifact.manifest import Manifest
from switchboard.artifact.tokenizer import TextTokenizer
from switchboard.engine.runtime import OnnxDecoder
from switchboard.engine.scheduler import Engine, GenerationRequest
from tests.unit.test_scheduler import Sink


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


def follow_up(model):
    """A second turn's prompt, and how much of it the first turn's cache covers (with that cache)."""
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
    return second, reused, np.ascontiguousarray(sink.result.cache[:, :, :, :reused])


def test_cached_prefix_gives_the_same_tokens_as_a_full_prefill(model):
    second, reused, cache = follow_up(model)
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


def test_chunked_prefill_gives_the_same_tokens_and_cache_as_whole_prompts(model):
    second, reused, cache = follow_up(model)
    reused //= 2  # a cached prefix, then a few chunks
    assert len(second) - reused > 2 * 16 and len(second) > 64

    def requests():
        return [GenerationRequest(prompt(model, ("user", q)), 24, return_cache=True) for q in QUESTIONS] + [
            GenerationRequest(second, 24, return_cache=True),
            GenerationRequest(second, 24, reused=reused, past=cache[:, :, :, :reused].copy(), return_cache=True),
        ]

    whole = run(engine(model), requests())
    e = engine(model, prefill_budget=16)
    chunked = run(e, requests())
    assert [s.tokens for s in chunked] == [s.tokens for s in whole]
    assert all(len(s.tokens) > 3 for s in whole)
    for c, w in zip(chunked, whole):
        np.testing.assert_allclose(c.result.cache, w.result.cache, atol=1e-4)
    stats = e.snapshot()[0]
    assert stats["prefill_chunks"] > len(second) // 16
    assert stats["prefill_tokens"] == sum(len(r.prompt) - r.reused for r in requests())


def test_a_sequence_joining_a_running_batch_in_chunks_is_unaffected(model):
    second, _, _ = follow_up(model)
    p1 = prompt(model, ("user", QUESTIONS[1]))
    first_alone = run(engine(model), [GenerationRequest(p1, 40)])[0].tokens
    late_alone = run(engine(model), [GenerationRequest(second, 20)])[0].tokens
    e = engine(model, prefill_budget=16)
    first, late = Sink(), Sink()
    e.submit(GenerationRequest(p1, 40), first)
    while len(first.tokens) < 5:
        e.step()
    e.submit(GenerationRequest(second, 20), late)
    while not late.tokens:
        e.step()
    assert len(first.tokens) >= 5 + len(second) // 16, "the running row decoded between the chunks"
    while late.result is None or first.result is None:
        e.step()
    assert late.tokens == late_alone and first.tokens == first_alone


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

    def emit(self, ids, logprobs=None):
        super().emit(ids, logprobs)
        self.rows.append(self.e.running())


def test_lanes_on_threads_of_their_own_give_the_same_tokens_as_alone(model):
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
        wait_for(background + vips)
    finally:
        e.stop()
    assert [s.tokens for s in vips] == [vip_alone] * 2
    assert [s.tokens for s in background] == [background_alone] * 4
    assert all(s.error is None for s in background + vips)
    assert max(rows) <= 2 + 2, "two lanes admitting at once: priority 2's two rows, the two VIPs' own"
    stats, sizes, waiting, running = e.snapshot()
    assert (waiting, running) == (0, 0) and stats["finished_length"] + stats["finished_stop"] == 6


def speculation(model, served: list[list[int]] = ()):
    """Drafts from the answers the export shipped (and ``served``), every row drafting."""
    from switchboard.engine.draft import ANSWERS, Drafter, DraftLength, Speculation, SuffixIndex, load_answers

    manifest, decoder, _ = model
    corpus = SuffixIndex()
    for answer in load_answers(decoder.path.parent / ANSWERS):
        corpus.add(answer)
    answers = SuffixIndex(capacity=64)
    for answer in served:
        answers.add(answer)
    return Speculation(Drafter(answers, corpus), DraftLength(cost=0.05, cap=6, prior=1.0))


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_drafted_answers_are_token_identical_to_plain_decoding(model, sampled):
    """The exported graph verifies a draft's positions in one pass: the answers, the reasons they
    end and their log-probabilities are those of decoding one token a pass, greedy or sampled
    with a seed, while most tokens come from accepted drafts (the corpus's answers, the
    conversation, an answer served before)."""
    manifest, decoder, tok = model
    assert decoder.verifies, "the export's graph returns every position's logits (logits_index)"
    second, _, _ = follow_up(model)
    kw = dict(temperature=0.8, top_p=0.95, seed=11, logprobs=1) if sampled else {}

    def requests():
        return [GenerationRequest(prompt(model, ("user", q)), 40, **kw) for q in QUESTIONS] + [
            GenerationRequest(second, 40, **kw)
        ]

    plain = run(engine(model), requests())
    e = engine(model, speculation=speculation(model, [s.tokens for s in plain[:1]]))
    drafted = run(e, requests())
    assert [s.tokens for s in drafted] == [s.tokens for s in plain]
    assert [s.result.reason for s in drafted] == [s.result.reason for s in plain]
    if sampled:
        for a, b in zip(drafted, plain):
            np.testing.assert_allclose(
                [lp for entry in a.logprobs for lp, _ in entry],
                [lp for entry in b.logprobs for lp, _ in entry],
                atol=1e-4,
            )
    stats = e.snapshot()[0]
    assert stats["accepted_tokens"] > 0 and stats["verify_steps"] < sum(len(s.tokens) for s in plain)

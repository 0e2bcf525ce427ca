"""Sampling: greedy is the argmax; temperature and top-p draw from the short candidate list."""

from __future__ import annotations

import numpy as np

from switchboard.engine.sampling import CANDIDATES, Counts, penalize, sample


def test_temperature_zero_is_the_argmax():
    logits = np.random.default_rng(0).normal(size=151936).astype(np.float32)
    assert sample(logits, 0.0, 1.0, np.random.default_rng(1)) == int(np.argmax(logits))


def test_draws_follow_the_softmax_on_a_small_vocabulary():
    logits = np.log(np.asarray([0.5, 0.3, 0.2], np.float32))
    rng = np.random.default_rng(0)
    counts = np.bincount([sample(logits, 1.0, 1.0, rng) for _ in range(4000)], minlength=3) / 4000
    assert np.abs(counts - [0.5, 0.3, 0.2]).max() < 0.03


def test_a_large_vocabulary_is_sampled_among_its_most_likely_tokens_only():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=151936).astype(np.float32)
    top = set(np.argsort(-logits)[:CANDIDATES].tolist())
    drawn = {sample(logits, 100.0, 1.0, rng) for _ in range(300)}  # nearly uniform over the candidates
    assert drawn <= top and len(drawn) > CANDIDATES // 2


def test_top_p_keeps_the_smallest_set_reaching_it():
    logits = np.log(np.asarray([0.6, 0.25, 0.1, 0.05], np.float32))
    rng = np.random.default_rng(0)
    assert {sample(logits, 1.0, 0.5, rng) for _ in range(200)} == {0}
    assert {sample(logits, 1.0, 0.8, rng) for _ in range(400)} == {0, 1}


def test_penalties_take_openais_amounts_off_the_tokens_seen_only():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=262144).astype(np.float32)  # Gemma 3's vocabulary
    logits[9] = -np.inf
    before = logits.copy()
    penalize(logits, Counts.of({5: 1, 7: 3, 9: 2}), presence=0.5, frequency=0.25)
    assert logits[5] == np.float32(before[5] - np.float32(0.25) - np.float32(0.5))
    assert logits[7] == np.float32(before[7] - np.float32(0.75) - np.float32(0.5))
    assert np.isneginf(logits[9]), "a token the grammar or the bans forbid stays forbidden"
    others = np.setdiff1d(np.arange(logits.size), [5, 7, 9])
    assert np.array_equal(logits[others], before[others]), "tokens not written are untouched, bit for bit"


def test_a_negative_penalty_raises_what_was_written():
    logits = np.zeros(8, np.float32)
    penalize(logits, Counts.of({3: 2}), presence=-1.0, frequency=-0.5)
    assert logits[3] == 2.0 and sample(logits, 0.0, 1.0, np.random.default_rng(0)) == 3


def test_counts_grow_past_their_first_arrays_and_keep_every_token():
    counts = Counts()
    for t in list(range(100)) + [7, 7]:
        counts.add(t * 2621)  # ids across a 262k vocabulary
    assert counts.size == 100 and dict(zip(counts.ids[:100].tolist(), counts.n[:100].tolist()))[7 * 2621] == 3.0
    logits = np.zeros(262144, np.float32)
    penalize(logits, counts, 0.0, 1.0)
    assert logits.sum() == -102.0 and logits[7 * 2621] == -3.0

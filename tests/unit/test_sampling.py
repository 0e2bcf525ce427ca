"""Sampling: greedy is the argmax; temperature and top-p draw from the short candidate list."""

from __future__ import annotations

import numpy as np

from switchboard.engine.sampling import CANDIDATES, sample


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

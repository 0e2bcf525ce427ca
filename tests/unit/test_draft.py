"""Drafts from past text (switchboard/engine/draft.py): the longest match wins, its most frequent
continuation is followed while likely enough, a row drafts from its own conversation and from
served answers, and the draft length follows a row's acceptance."""

from __future__ import annotations

import itertools
import threading

import pytest

from switchboard.engine.draft import (
    ANSWERS,
    NONE,
    Drafter,
    DraftLength,
    SuffixIndex,
    build,
    expected_tokens,
    load_answers,
    save_answers,
)


def test_the_continuation_of_the_longest_match_is_drafted():
    index = SuffixIndex()
    index.add([1, 2, 3, 4, 5, 6])
    index.add([9, 3, 4, 7, 8])
    # "2 3 4" matched three tokens in the first answer, one more than "9 3 4"
    assert index.propose([0, 2, 3, 4], 2) == index.propose([2, 3, 4], 2)
    assert index.propose([0, 2, 3, 4], 2).tokens == (5, 6)
    assert index.propose([5, 9, 3, 4], 8).tokens == (7, 8)


def test_a_draft_is_no_longer_than_factor_times_the_match_nor_the_budget():
    index = SuffixIndex(factor=1.0)
    index.add(list(range(20)))
    assert index.propose([0, 1], 10).tokens == (2, 3)
    assert index.propose([3, 4, 5, 6], 10).tokens == (7, 8, 9, 10)
    assert index.propose([3, 4, 5, 6], 3).tokens == (7, 8, 9)
    assert index.propose([3, 4, 5, 6], 0) is NONE
    capped = SuffixIndex(factor=2.0, max_depth=2)
    capped.add(list(range(20)))
    assert capped.propose([3, 4, 5, 6], 10).tokens == (7, 8, 9, 10), "a match counts up to max_depth"


def test_the_most_frequent_continuation_is_followed_while_likely_enough():
    index = SuffixIndex(factor=4.0, min_prob=0.5)
    for answer in ([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 7, 7]):
        index.add(answer)
    draft = index.propose([1, 2], 8)
    # after "1 2": 3 three times in four (0.75), then 4 twice in those three (0.5): kept
    assert draft.tokens == (3, 4) and draft.match == 2
    assert draft.score == pytest.approx(0.75 + 0.5)
    index.min_prob = 0.6
    assert index.propose([1, 2], 8).tokens == (3,)


def test_nothing_matches_nothing_is_drafted():
    index = SuffixIndex()
    index.add([1, 2, 3])
    assert index.propose([7, 8], 4) is NONE
    assert index.propose([], 4) is NONE
    assert index.propose([3], 4) is NONE, "the last token of a sequence has no continuation yet"


def test_the_oldest_answers_leave_at_capacity_and_their_ngrams_are_purged():
    index = SuffixIndex(capacity=2)
    index.add([1, 2, 3])
    index.add([4, 5, 6])
    index.add([7, 8, 9])
    assert len(index) == 2 and index.propose([1, 2], 4) is NONE
    assert index.propose([4, 5], 4).tokens == (6,)
    index.add([10, 11])
    assert index.propose([4, 5], 4) is NONE
    assert (1,) not in index._at and (4, 5) not in index._at, "purged after a capacity's worth of evictions"


def test_a_row_drafts_from_its_own_conversation_and_from_served_answers():
    drafter = Drafter(SuffixIndex(capacity=8))
    order = [50, 51, 52, 53, 54, 55]
    row = drafter.start([10, 11, *order, 12, 13])
    row.accept([20, 50, 51])  # the answer starts copying the order number
    assert row.propose(8).tokens == (52, 53)  # the row's own prompt (match of 2, factor 1)
    row.accept([52, 53, 54])
    assert row.propose(8).tokens == (55, 12, 13, 20, 50)
    row.finish()
    other = drafter.start([1, 2, 20, 50, 51])  # a later conversation: the served answer
    assert other.propose(3).tokens == (52, 53, 54)


def test_the_shared_answers_take_rows_from_two_threads():
    drafter = Drafter(SuffixIndex(capacity=64))
    errors = []

    def serve(base):
        try:
            for i in range(300):
                row = drafter.start([base, i % 7, 3])
                row.accept([4, 5, base, i % 5])
                row.propose(4)
                row.finish()
        except Exception as e:  # noqa: BLE001 - any error fails the test below
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(b,)) for b in (100, 200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(drafter.answers) == 64


def test_the_draft_length_grows_with_acceptance_and_shrinks_with_cost():
    cheap, dear = DraftLength(cost=0.05, cap=8), DraftLength(cost=0.6, cap=8)
    assert cheap.best(0.0) == 0 and cheap.best(1.0) == 8
    assert [cheap.best(a) for a in (0.3, 0.6, 0.9)] == sorted(cheap.best(a) for a in (0.3, 0.6, 0.9))
    assert cheap.best(0.9) > dear.best(0.9) > 0
    assert dear.best(0.3) == 0, "at a pass cost of 0.6 a token, a draft accepted 30% of the time does not pay"
    length = DraftLength(cost=0.1, prior=0.5, memory=0.5)
    assert length.update(0.5, 4, 4) == pytest.approx(0.75)
    assert length.update(0.5, 4, 0) == pytest.approx(0.25)
    assert length.update(0.5, 0, 0) == 0.5
    assert 0.1 < length.idle(0.1) < 0.5 and length.idle(0.5) == 0.5
    with pytest.raises(ValueError):
        DraftLength(cost=-1)


def test_a_pass_verifies_one_width_weighed_over_every_row():
    """Every row of a verifying pass pays for its widest draft: one row's long draft is cut to
    what the whole batch gains from it, and a pass costs more per column the more rows it has."""
    length = DraftLength(cost=0.37, cost_batch_1=0.004, cap=8)  # Gemma 3 270M's, measured
    assert length.cost_at(1) == pytest.approx(0.004) and length.cost_at(8) == pytest.approx(0.37)
    assert length.cost_at(4) == pytest.approx(0.004 + 0.366 * 3 / 7) and length.cost_at(40) == 1.0
    assert length.best(0.9, rows=1) == 8 > length.best(0.9, rows=8) > 0
    assert length.width([(8, 0.9)]) == 8, "alone, a long draft costs almost nothing"
    assert length.width([(8, 0.9)] + [(0, 0.5)] * 7) == 0, "seven rows would pay for one row's draft"
    assert 3 <= length.width([(8, 0.9)] * 8) <= 5, "all rows gain: the width where tokens per cost peak"
    assert length.width([(2, 0.9)] * 8) == 2 and length.width([]) == 0
    assert DraftLength(cost=0.0).width([(6, 0.2), (0, 0.5)]) == 6, "free columns: the whole draft"


def test_the_answers_a_model_ships_with_are_drafted_from_and_never_evicted(tmp_path):
    shipped = [[1, 2, 3, 4, 5], [], [7, 8, 9]]
    save_answers(tmp_path / ANSWERS, shipped)
    assert load_answers(tmp_path / ANSWERS) == shipped
    spec = build(tmp_path, cost=0.1, cap=4, capacity=1)
    row = spec.drafter.start([0, 1, 2, 3])
    assert row.propose(4).tokens == (4, 5) and spec.length.cap == 4
    for answer in ([20, 21, 22], [30, 31, 32]):
        other = spec.drafter.start([0])
        other.accept(answer)
        other.finish()
    assert len(spec.drafter.answers) == 1 and spec.drafter.start([7, 8]).propose(4).tokens == (9,)
    assert spec.drafter.start([30, 31]).propose(4).tokens == (32,)
    none_served = build(tmp_path / "nothing", cost=0.1, cap=4, capacity=0).drafter
    assert none_served.corpus is None and none_served.answers is None
    row = none_served.start([5, 6, 5])
    row.finish()
    assert row.propose(2).tokens == (6,), "its own conversation still drafts"


def test_an_answers_file_that_does_not_add_up_is_refused(tmp_path):
    import numpy as np

    np.savez(tmp_path / ANSWERS, tokens=np.arange(5), lengths=np.array([2, 2]))
    with pytest.raises(ValueError, match="do not add up"):
        load_answers(tmp_path / ANSWERS)


def test_a_packed_pass_weighs_every_rows_draft_length_together():
    """In a packed pass a row's draft costs its own tokens: the lengths that give the pass the most
    tokens per cost, found over every combination of a small case; rows alike draft as ``best``."""
    length = DraftLength(cost=0.37, cost_batch_1=0.004, cap=5)

    def rate(ks, accs):
        per_token = length.cost_at(len(accs)) / len(accs)
        return sum(expected_tokens(k, a) for k, a in zip(ks, accs)) / (1 + per_token * sum(ks))

    for accs in ([0.9, 0.1, 0.5], [0.95, 0.95, 0.0], [0.3, 0.3, 0.3], [1.0, 0.0, 0.0], [0.6, 0.75, 0.85]):
        best = max(rate(ks, accs) for ks in itertools.product(range(6), repeat=3))
        assert rate(length.packed(accs), accs) == pytest.approx(best, rel=1e-12), accs
    assert length.packed([0.7] * 8) == [length.best(0.7, rows=8)] * 8
    assert length.packed([0.45] * 3) == [length.best(0.45, rows=3)] * 3
    mixed = length.packed([0.95] + [0.2] * 7)
    assert mixed[0] > length.width([(5, 0.95)] + [(0, 0.2)] * 7) == 0, "packed, the keen row drafts alone"
    assert mixed[1:] == [0] * 7 and length.packed([]) == []

"""Speculative decoding in the engine with a scripted model, no exported one: drafts are verified
in one pass, answers are token-identical with and without them (greedy, sampled with a seed,
constrained, penalized, with log-probabilities), rejected tokens leave the cache, and the counts
say what was drafted and kept. (tests/model/ runs the same on a real checkpoint.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from switchboard.engine.draft import Drafter, DraftLength, Speculation, SuffixIndex
from switchboard.engine.scheduler import Engine, GenerationRequest

VOCAB = 32
STOP = 31


class HistoryDecoder:
    """Logits that depend on a row's last two tokens and its position, from a fixed random table.
    The cache holds each column's position and token, and every pass checks that a row's real
    columns are its whole text, in order: a rejected draft token left in the cache, or a hole
    in the wrong place, fails the test. A pass's logits for a position are the same whether the
    position comes alone or with a draft (as for a real model, up to rounding)."""

    def __init__(self, seed: int = 0, context_window: int = 512, peaked: float = 4.0):
        self.manifest = SimpleNamespace(num_layers=1, num_kv_heads=1, head_dim=2, context_window=context_window)
        self.dtype = np.dtype(np.float32)
        rng = np.random.default_rng(seed)
        self.table = rng.standard_normal((VOCAB, VOCAB, VOCAB)).astype(np.float32) * peaked
        self.table[:, :, STOP] -= 2.0  # answers run a while before they stop
        self.passes: list[tuple[int, int]] = []  # (rows, positions)
        self.texts: dict[int, list[int]] = {}

    def forward(self, ids, mask, pos, past, keep=1):
        rows, n = ids.shape
        self.passes.append((rows, n))
        key = past[0][0]
        assert key.shape[2] + n == mask.shape[1], "the cache and the mask disagree"
        logits = np.zeros((rows, n, VOCAB), np.float32)
        new = np.zeros((rows, 1, n, 2), np.float32)
        for r in range(rows):
            real = np.flatnonzero(mask[r, : key.shape[2]])
            positions = key[r, 0, real, 0].astype(int).tolist()
            assert positions == list(range(len(real))), f"row {r}'s cache is not its text in order: {positions}"
            text = key[r, 0, real, 1].astype(int).tolist()
            for j in range(n):
                if not mask[r, key.shape[2] + j]:
                    continue
                assert pos[r, j] == len(text), "a new token's position follows the row's text"
                text.append(int(ids[r, j]))
                prev = text[-2] if len(text) > 1 else 0
                logits[r, j] = self.table[prev, text[-1]] + 0.01 * (pos[r, j] % 7)
            new[r, 0, :, 0] = pos[r]
            new[r, 0, :, 1] = ids[r]
        present = [(np.concatenate([past[0][0], new], axis=2), np.concatenate([past[0][1], new], axis=2))]
        return logits[:, n - keep :], present


class Sink:
    def __init__(self):
        self.tokens, self.logprobs, self.result, self.error = [], [], None, None

    def emit(self, ids, logprobs=None):
        self.tokens += ids
        if logprobs is not None:
            self.logprobs += logprobs

    def finish(self, result):
        self.result = result

    def fail(self, error):
        self.error = error

    def cancelled(self):
        return False


class FixedDrafter(Drafter):
    """Always drafts ``tokens`` (right or wrong), whatever the text."""

    def __init__(self, tokens):
        super().__init__(SuffixIndex())
        self.tokens = tuple(tokens)

    def start(self, prompt):
        row = super().start(prompt)
        row.propose = lambda k: SimpleNamespace(tokens=self.tokens[:k])
        return row


def speculation(drafter=None, cost=0.05, cap=6, prior=1.0):
    return Speculation(drafter or Drafter(SuffixIndex(capacity=64)), DraftLength(cost=cost, cap=cap, prior=prior))


def run(requests, spec=None, decoder=None, max_batch=8):
    decoder = decoder or HistoryDecoder()
    e = Engine(decoder, max_batch=max_batch, max_waiting=64, stop_ids={STOP}, speculation=spec)
    sinks = [Sink() for _ in requests]
    for req, sink in zip(requests, sinks):
        e.submit(req, sink)
    while any(s.result is None and s.error is None for s in sinks):
        e.step()
    assert not any(s.error for s in sinks), [s.error for s in sinks]
    return sinks, e, decoder


def requests(**kw):
    prompts = ([3, 4, 5, 6, 7, 8], [9, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5])
    return [GenerationRequest(list(p), 40, **kw) for p in prompts]


def test_greedy_answers_are_the_same_with_drafts_in_fewer_passes():
    plain, _, _ = run(requests())
    answers = SuffixIndex(capacity=64)
    for s in plain:
        answers.add(s.tokens)  # the deployment has served these answers before
    spec = speculation(Drafter(answers))
    drafted, e, decoder = run(requests(), spec)
    assert [s.tokens for s in drafted] == [s.tokens for s in plain]
    assert [s.result.reason for s in drafted] == [s.result.reason for s in plain]
    stats = e.snapshot()[0]
    assert stats["verify_steps"] > 0 and stats["accepted_tokens"] > 0
    assert sum(s.result.accepted for s in drafted) == stats["accepted_tokens"]
    assert sum(s.result.drafted for s in drafted) == stats["drafted_tokens"] >= stats["accepted_tokens"]
    decode_passes = len(decoder.passes) - 1  # one prefill pass for the four prompts
    assert decode_passes < max(len(s.tokens) for s in plain) - 1, "fewer passes than tokens"


class OneRowDrafter(Drafter):
    """Drafts from ``answers`` for the row whose prompt starts with ``first`` only (the
    requests' prompts start with distinct tokens)."""

    def __init__(self, answers, first):
        super().__init__(answers)
        self.first = first

    def start(self, prompt):
        row = super().start(prompt)
        if prompt[0] != self.first:
            row.propose = lambda k: SimpleNamespace(tokens=())
        return row


@pytest.mark.parametrize("cost", [0.0, 0.6])
def test_one_rows_draft_widens_the_pass_only_where_the_batch_gains(cost):
    """One row drafts (right), the others have nothing to draft. With free columns the pass
    verifies its draft beside the other rows; where every row's extra columns cost 0.6 of a
    pass, it verifies only once that row runs alone. The answers are the same either way."""

    def asked():  # the drafting row (prompt [3, ...]) asks for the longest answer: it ends alone
        return [GenerationRequest(r.prompt, 40 if r.prompt[0] == 3 else 16) for r in requests()]

    plain, _, _ = run(asked())
    answers = SuffixIndex(capacity=64)
    for s in plain:
        answers.add(s.tokens)
    spec = Speculation(OneRowDrafter(answers, first=3), DraftLength(cost=cost, prior=0.9))
    drafted, e, decoder = run(asked(), spec)
    assert [s.tokens for s in drafted] == [s.tokens for s in plain]
    shared = [rows for rows, n in decoder.passes[1:] if n > 1 and rows > 1]
    assert bool(shared) == (cost == 0.0), decoder.passes
    assert e.snapshot()[0]["accepted_tokens"] > 0


@pytest.mark.parametrize("draft", [(0, 0, 0, 0, 0), (5, 6, 7)], ids=["wrong", "mixed"])
def test_rejected_drafts_leave_the_cache_and_the_answers_unchanged(draft):
    """Every draft is (mostly) wrong: the verifying passes mask the rejected tokens' columns,
    which the model checks at every pass, and the cache is compacted as holes pile up."""
    plain, _, _ = run(requests())
    drafted, e, _ = run(requests(), speculation(FixedDrafter(draft), cost=0.0, prior=1.0))
    assert [s.tokens for s in drafted] == [s.tokens for s in plain]
    stats = e.snapshot()[0]
    assert stats["drafted_tokens"] > stats["accepted_tokens"] and stats["compactions"] > 0


def test_seeded_sampling_penalties_and_logprobs_are_the_same_with_drafts():
    kw = dict(temperature=0.9, top_p=0.95, seed=7, presence_penalty=0.5, frequency_penalty=0.3, logprobs=2)
    plain, _, _ = run(requests(**kw))
    answers = SuffixIndex(capacity=64)
    for s in plain:
        answers.add(s.tokens)
    drafted, e, _ = run(requests(**kw), speculation(Drafter(answers)))
    assert [s.tokens for s in drafted] == [s.tokens for s in plain]
    assert [s.logprobs for s in drafted] == [s.logprobs for s in plain]
    assert e.snapshot()[0]["accepted_tokens"] > 0


class Spelled:
    """A constraint that allows exactly ``word``'s tokens, in order (a grammar's stand-in)."""

    cut = False

    def __init__(self, word):
        self.word, self.at = list(word), 0

    def mask(self, logits):
        keep = logits[self.word[self.at]]
        logits[:] = -np.inf
        logits[self.word[self.at]] = keep
        return True

    def choose(self, token, budget):
        return token

    def accept(self, token):
        self.at += 1
        return token == self.word[self.at - 1]

    @property
    def finished(self):
        return self.at == len(self.word)


def test_a_constrained_row_keeps_only_the_drafted_tokens_its_grammar_allows():
    word = [7, 8, 9, 10, 11, 12]
    drafter = FixedDrafter([8, 9, 4, 4])  # right twice, then outside the grammar
    [s], e, _ = run([GenerationRequest([1, 2], 20, constraint=Spelled(word))], speculation(drafter))
    assert s.tokens == word and s.result.reason == "stop"
    assert e.snapshot()[0]["accepted_tokens"] >= 2


def test_drafts_stop_at_the_token_limit_and_the_context_window():
    decoder = HistoryDecoder(context_window=24)
    plain, _, _ = run([GenerationRequest(list(range(1, 15)), 30)], decoder=HistoryDecoder(context_window=24))
    [s], e, d = run([GenerationRequest(list(range(1, 15)), 30)], speculation(FixedDrafter([0] * 9)), decoder)
    assert s.tokens == plain[0].tokens and s.result.reason == "length"
    assert 14 + len(s.tokens) <= 24 + 1
    [s], _, _ = run([GenerationRequest([1, 2, 3], 5)], speculation(FixedDrafter([0] * 9)))
    assert len(s.tokens) == 5


def test_without_speculation_a_pass_decodes_one_token_a_row():
    _, e, decoder = run(requests())
    assert {n for _, n in decoder.passes[1:]} == {1} and e.snapshot()[0]["verify_steps"] == 0

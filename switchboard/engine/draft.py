"""Drafts for speculative decoding, from text the deployment has already seen.

A customer-service answer repeats what came before: the FAQ's sentences, the order page's
phrases, the caller's own order number, the hand-over line. So the next tokens are drafted by
looking up the end of the row's text in two indexes, as SuffixDecoding does (arXiv 2411.04975;
vLLM's ``suffix`` method): the row's own conversation (prompt lookup: a copied order number or
product name) and the deployment's answers (the corpus's, shipped with the model, and the ones
served since). The model then checks the whole draft in one forward pass
(switchboard/engine/scheduler.py); a draft only changes how many passes an answer takes, never
which tokens it has.

``SuffixIndex`` finds where the longest suffix of the row's text (up to ``max_depth`` tokens)
occurred before, then follows the continuation those occurrences most often took, a token at a
time, while its share of them (the draft token's estimated probability) stays above
``min_prob``. A longer match drafts further: at most ``factor`` tokens per matched token, as
SuffixDecoding limits its drafts. Occurrences are found through the n-grams (up to ``anchor``
tokens) that end each position, the most recent ``occurrences`` of each kept; a match is then
extended backwards to its full length.

``DraftLength`` picks each row's draft length from its recent acceptance: with ``a`` the chance
that a drafted token is accepted and ``cost`` the extra cost of a verified token relative to a
one-token pass, ``k`` drafted tokens yield ``(1 - a**(k+1)) / (1 - a)`` tokens a pass for
``1 + cost * k``; the ``k`` that maximizes their ratio is the row's next cap.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...] = ()
    score: float = 0.0  # the sum of the draft tokens' estimated probabilities
    match: int = 0  # how many tokens of the row's text the draft's source matched


NONE = Draft()


class SuffixIndex:
    """Token sequences, indexed so that the end of any text finds where it occurred in them.

    ``capacity`` > 0 keeps the most recent that many sequences (the oldest leave first); 0
    keeps every one (a row's own conversation, the corpus's answers)."""

    def __init__(
        self,
        max_depth: int = 32,
        anchor: int = 3,
        occurrences: int = 64,
        capacity: int = 0,
        min_prob: float = 0.1,
        factor: float = 1.0,
        offset: float = 0.0,
    ):
        if max_depth < 1 or anchor < 1 or occurrences < 1:
            raise ValueError("max_depth, anchor and occurrences must be at least 1")
        self.max_depth, self.anchor, self.occurrences = max_depth, min(anchor, max_depth), occurrences
        self.capacity, self.min_prob, self.factor, self.offset = capacity, min_prob, factor, offset
        self._seqs: dict[int, list[int]] = {}
        self._next_id = 0
        # n-gram (1..anchor tokens) -> where it ended: (sequence id, index of its last token)
        self._at: dict[tuple[int, ...], deque[tuple[int, int]]] = {}
        self._added_since_purge = 0

    def __len__(self) -> int:
        return len(self._seqs)

    def add(self, tokens: Iterable[int]) -> int:
        """Index a sequence; its id, for ``extend``."""
        sid = self._next_id
        self._next_id += 1
        self._seqs[sid] = []
        self.extend(sid, tokens)
        if self.capacity and len(self._seqs) > self.capacity:
            del self._seqs[min(self._seqs)]  # ids grow: the smallest is the oldest
            self._added_since_purge += 1
            if self._added_since_purge >= self.capacity:
                self._purge()
        return sid

    def extend(self, sid: int, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to sequence ``sid`` (a row's conversation grows as it decodes)."""
        seq = self._seqs[sid]
        for token in tokens:
            seq.append(int(token))
            end = len(seq) - 1
            for n in range(1, min(self.anchor, len(seq)) + 1):
                key = tuple(seq[end - n + 1 :])
                found = self._at.get(key)
                if found is None:
                    found = self._at[key] = deque(maxlen=self.occurrences)
                found.append((sid, end))

    def _purge(self) -> None:
        """Forget n-grams whose every occurrence is in a sequence that left."""
        self._added_since_purge = 0
        live = self._seqs
        for key in [k for k, found in self._at.items() if all(sid not in live for sid, _ in found)]:
            del self._at[key]

    def propose(self, text: Sequence[int], max_tokens: int) -> Draft:
        """The likeliest continuation of ``text`` (at most ``max_tokens``), or an empty draft."""
        if max_tokens <= 0 or not text:
            return NONE
        for n in range(min(self.anchor, len(text)), 0, -1):
            found = self._at.get(tuple(text[-n:]))
            if found:
                draft = self._follow(text, n, found, max_tokens)
                if draft.tokens:
                    return draft
        return NONE

    def _follow(self, text: Sequence[int], n: int, found: Iterable[tuple[int, int]], max_tokens: int) -> Draft:
        """Among ``found`` (occurrences of ``text``'s last ``n`` tokens), those with the longest
        match, then their most frequent continuation."""
        best, cands = 0, []
        for sid, end in found:
            seq = self._seqs.get(sid)
            if seq is None or end + 1 >= len(seq):
                continue  # a sequence that left, or nothing after it yet (the row's own last token)
            m = n
            limit = min(self.max_depth, len(text), end + 1)
            while m < limit and seq[end - m] == text[-1 - m]:
                m += 1
            if m > best:
                best, cands = m, [(seq, end + 1)]
            elif m == best:
                cands.append((seq, end + 1))
        if not cands:
            return NONE
        limit = min(max_tokens, int(self.factor * best + self.offset))
        tokens: list[int] = []
        score, p = 0.0, 1.0
        while len(tokens) < limit and cands:
            if len(cands) == 1:  # one source left: its next tokens, at the same probability
                seq, at = cands[0]
                rest = seq[at : at + limit - len(tokens)]
                tokens += rest
                score += p * len(rest)
                break
            counts = Counter(seq[at] for seq, at in cands if at < len(seq))
            if not counts:
                break
            token, c = counts.most_common(1)[0]
            p *= c / len(cands)
            if p < self.min_prob:
                break
            tokens.append(token)
            score += p
            cands = [(seq, at + 1) for seq, at in cands if at < len(seq) and seq[at] == token]
        return Draft(tuple(tokens), score, best)


class Drafter:
    """A row's drafts: from its own conversation, from the answers the model shipped with
    (``corpus``, never evicted) and from those served since (``answers``, the oldest leave at its
    capacity); the draft with the highest score (SuffixDecoding's choice between its request and
    global trees). The served answers are shared by the rows of an engine (both lanes' threads:
    behind a lock); ``RowDrafts.finish`` adds one."""

    def __init__(self, answers: SuffixIndex | None, corpus: SuffixIndex | None = None, **row_options):
        self.answers, self.corpus = answers, corpus
        self._row_options = row_options
        self._lock = threading.Lock()

    def shared(self, text: Sequence[int], max_tokens: int) -> Draft:
        shipped = self.corpus.propose(text, max_tokens) if self.corpus is not None else NONE  # read-only
        if self.answers is None:
            return shipped
        with self._lock:
            served = self.answers.propose(text, max_tokens)
        return shipped if shipped.score >= served.score else served

    def learn(self, answer: Sequence[int]) -> None:
        if self.answers is not None:
            with self._lock:
                self.answers.add(answer)

    def start(self, prompt: Sequence[int]) -> RowDrafts:
        return RowDrafts(self, prompt)


class RowDrafts:
    """One row's conversation, growing with its accepted tokens."""

    def __init__(self, drafter: Drafter, prompt: Sequence[int]):
        self._drafter = drafter
        self.own = SuffixIndex(**drafter._row_options)
        self._sid = self.own.add(prompt)
        self.text: list[int] = list(prompt)
        self.answer: list[int] = []

    def accept(self, tokens: Sequence[int]) -> None:
        self.text += tokens
        self.answer += tokens
        self.own.extend(self._sid, tokens)

    def propose(self, max_tokens: int) -> Draft:
        own = self.own.propose(self.text, max_tokens)
        shared = self._drafter.shared(self.text, max_tokens)
        return own if own.score >= shared.score else shared

    def finish(self) -> None:
        """The answer is done: later rows may draft from it."""
        if self.answer:
            self._drafter.learn(self.answer)


COST_BATCH = 8  # the rows of the pass whose cost per verified token ``cost`` is (the export's)


def expected_tokens(k: int, acceptance: float) -> float:
    """Tokens a row gets from a pass verifying ``k`` drafted tokens, each kept with probability
    ``acceptance`` while the ones before it were: the kept prefix and one more."""
    return k + 1.0 if acceptance >= 1 else (1 - acceptance ** (k + 1)) / (1 - acceptance)


class DraftLength:
    """A row's draft cap from its recent acceptance (an exponential average over its passes), the
    width of a padded pass that verifies several rows' drafts, and each row's length in a packed one."""

    def __init__(
        self, cost: float, cap: int = 8, prior: float = 0.5, memory: float = 0.7, cost_batch_1: float | None = None
    ):
        """``cost``: a verified token's extra cost relative to a one-token pass of ``COST_BATCH``
        rows (a pass of ``1 + k`` tokens a row costs ``1 + cost * k``); ``cost_batch_1``: the same
        for one row (default: ``cost``). Between and beyond the two it is linear in the rows (at
        most 1: a column costs no more than a pass). ``prior``: the acceptance a new row starts from."""
        cost_batch_1 = cost if cost_batch_1 is None else cost_batch_1
        if min(cost, cost_batch_1) < 0 or cap < 0 or not 0 <= prior <= 1 or not 0 <= memory < 1:
            raise ValueError("cost >= 0, cap >= 0, prior in [0, 1], memory in [0, 1)")
        self.cost, self.cost_batch_1, self.cap, self.prior, self.memory = cost, cost_batch_1, cap, prior, memory
        self._best: dict[int, list[int]] = {}  # by rows, by acceptance in steps of 0.05

    def cost_at(self, rows: int) -> float:
        """A verified token's cost relative to a one-token pass of ``rows`` rows."""
        slope = (self.cost - self.cost_batch_1) / (COST_BATCH - 1)
        return min(1.0, max(0.0, self.cost_batch_1 + slope * (max(rows, 1) - 1)))

    def _argmax(self, a: float, cost: float) -> int:
        return max(range(self.cap + 1), key=lambda k: (expected_tokens(k, a) / (1 + cost * k), -k))

    def best(self, acceptance: float, rows: int = COST_BATCH) -> int:
        """The draft length that yields the most tokens per unit of pass cost, in a pass of ``rows``."""
        table = self._best.get(rows)
        if table is None:
            cost = self.cost_at(rows)
            table = self._best[rows] = [self._argmax(i / 20, cost) for i in range(21)]
        return table[round(min(max(acceptance, 0.0), 1.0) * 20)]

    def width(self, rows: Sequence[tuple[int, float]]) -> int:
        """How many drafted tokens a pass verifies for each row, its rows' (draft length,
        acceptance) given: the width whose expected tokens, over all rows, per unit of pass cost
        are the most. Every row pays for the widest draft, so a long draft only one row has is
        cut to what the whole pass gains from it; 0: a plain decode step."""
        cost = self.cost_at(len(rows))
        longest = max((k for k, _ in rows), default=0)

        def rate(w: int) -> float:
            return sum(expected_tokens(min(w, k), a) for k, a in rows) / (1 + cost * w)

        return max(range(longest + 1), key=lambda w: (rate(w), -w))

    def packed(self, acceptances: Sequence[float]) -> list[int]:
        """Each row's draft length in a packed pass, its rows' acceptances given: the lengths whose
        expected tokens, over all rows, per unit of pass cost are the most. A row's draft costs its
        own tokens only, each ``cost_at(rows) / rows`` of a one-token pass (the share of a padded
        column's cost one row's token bears), so a row that keeps its drafts drafts long beside
        rows that draft nothing; rows alike get ``best`` each. Dinkelbach's iteration: at the
        pass's rate so far, each row takes the length whose tokens beat what its cost could buy
        at that rate; the rate rises until no row changes (a few rounds). Acceptances are taken
        in steps of 0.05, as ``best`` takes them, so rows alike are weighed once."""
        if not acceptances:
            return []
        per_token = self.cost_at(len(acceptances)) / len(acceptances)
        grid = [round(min(max(a, 0.0), 1.0) * 20) for a in acceptances]
        rows = Counter(grid)  # grid point -> rows there
        tokens = {g: [expected_tokens(k, g / 20) for k in range(self.cap + 1)] for g in rows}
        length = dict.fromkeys(rows, 0)
        rate = float(len(acceptances))  # a plain decode step: one token a row
        while True:
            price = rate * per_token  # what a drafted token's cost could buy at the rate so far
            step = {g: max(range(self.cap + 1), key=lambda k, e=tokens[g]: (e[k] - price * k, -k)) for g in rows}
            drafted = sum(n * step[g] for g, n in rows.items())
            gained = sum(n * tokens[g][step[g]] for g, n in rows.items()) / (1 + per_token * drafted)
            if gained <= rate + 1e-12:
                return [length[g] for g in grid]
            length, rate = step, gained

    def idle(self, acceptance: float) -> float:
        """The row's acceptance after a pass without a draft: a step back towards the prior, so
        that a row whose drafts stopped paying tries again later."""
        return acceptance + (self.prior - acceptance) * (1 - self.memory) / 4

    def update(self, acceptance: float, drafted: int, accepted: int) -> float:
        """The row's acceptance after a pass that verified ``drafted`` tokens and kept ``accepted``."""
        if drafted <= 0:
            return acceptance
        return self.memory * acceptance + (1 - self.memory) * accepted / drafted


@dataclass
class Speculation:
    """What an engine speculates with: the drafts' sources and each row's draft length."""

    drafter: Drafter
    length: DraftLength


# A verified token's cost relative to a one-token pass where the export measured none: a
# 5-token pass at batch 8 costs 1.64x a 1-token one at 0.5B on CPU (docs/benchmarks.md).
DEFAULT_COST = 0.16

ANSWERS = "answers.npz"  # the corpus's answers in the model's tokens, written by the export


def save_answers(path: Path, answers: Sequence[Sequence[int]]) -> None:
    """``answers`` as two flat arrays (no pickles: a repository's file is read, never executed)."""
    lengths = np.asarray([len(a) for a in answers], np.int64)
    tokens = np.asarray([t for a in answers for t in a], np.int64)
    np.savez_compressed(path, tokens=tokens, lengths=lengths)


def load_answers(path: Path) -> list[list[int]]:
    with np.load(path, allow_pickle=False) as f:
        tokens, lengths = f["tokens"], f["lengths"]
    if lengths.ndim != 1 or tokens.ndim != 1 or int(lengths.sum()) != tokens.size or (lengths < 0).any():
        raise ValueError(f"{path}: answers' lengths do not add up to their tokens")
    ends = np.cumsum(lengths)
    return [tokens[e - n : e].tolist() for e, n in zip(ends, lengths)]


def build(directory: Path, cost: float, cap: int, capacity: int, cost_batch_1: float | None = None) -> Speculation:
    """The speculation of a pool serving the model version in ``directory``: the answers it
    shipped with (if the export wrote them), ``capacity`` served ones, drafts up to ``cap``
    tokens, a verified token costing ``cost`` of a pass (``cost_batch_1`` of one row's)."""
    corpus = None
    path = Path(directory) / ANSWERS
    if path.is_file():
        corpus = SuffixIndex()
        for answer in load_answers(path):
            corpus.add(answer)
    served = SuffixIndex(capacity=capacity) if capacity else None
    return Speculation(Drafter(served, corpus), DraftLength(cost=cost, cap=cap, cost_batch_1=cost_batch_1))

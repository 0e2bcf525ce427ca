"""Next-token choice from logits: greedy at temperature 0, else temperature plus top-p over a
short candidate list.

Sampling works on the ``CANDIDATES`` most likely tokens only (top-k before top-p, as serving
engines do): one linear pass picks them, and the softmax, sort and draw cost the same at a
152k vocabulary as at 4k. Past the 64th token the probability mass is negligible at the
temperatures a support chat uses.

Presence and frequency penalties (``penalize``) change a row's logits before its grammar masks
them and before this choice, as OpenAI defines them.
"""

from __future__ import annotations

import numpy as np

CANDIDATES = 64


def sample(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    """``logits``: one row of vocabulary scores."""
    if temperature <= 0.0:
        return int(np.argmax(logits))
    ids = np.argpartition(logits, -CANDIDATES)[-CANDIDATES:] if logits.shape[0] > CANDIDATES else np.arange(len(logits))
    z = logits[ids].astype(np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    ids, z = ids[order], z[order]
    probs = np.exp(z - z[0])
    probs /= probs.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), top_p)) + 1  # smallest set reaching top_p
        probs = probs[:keep] / probs[:keep].sum()
    return int(ids[rng.choice(len(probs), p=probs)])


class Counts:
    """The tokens a row generated, counted: the distinct ids and their counts as arrays that
    grow with the answer (a few hundred entries), never a vocabulary-sized one (262k for Gemma 3)."""

    __slots__ = ("ids", "n", "size", "_slot")

    def __init__(self):
        self.ids = np.empty(32, np.int64)
        self.n = np.empty(32, np.float32)
        self.size = 0
        self._slot: dict[int, int] = {}

    def add(self, token: int) -> None:
        i = self._slot.get(token)
        if i is None:
            i = self._slot[token] = self.size
            if i == len(self.ids):
                self.ids, self.n = np.resize(self.ids, 2 * i), np.resize(self.n, 2 * i)
            self.ids[i], self.n[i] = token, 0.0
            self.size += 1
        self.n[i] += 1.0

    @classmethod
    def of(cls, counts: dict[int, int]) -> Counts:
        out = cls()
        for token, k in counts.items():
            for _ in range(k):
                out.add(token)
        return out


def penalize(logits: np.ndarray, counts: Counts, presence: float, frequency: float) -> None:
    """OpenAI's repetition control, in place: ``logit[t] -= frequency * count[t] + presence``
    for each token ``t`` the row generated ``count[t] > 0`` times; a step costs the distinct
    tokens the answer used, not the vocabulary."""
    k = counts.size
    if k:
        logits[counts.ids[:k]] -= np.float32(frequency) * counts.n[:k] + np.float32(presence)

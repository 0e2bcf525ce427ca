"""Next-token choice from logits: greedy at temperature 0, else temperature plus top-p over a
short candidate list.

Sampling works on the ``CANDIDATES`` most likely tokens only (top-k before top-p, as serving
engines do): one linear pass picks them, and the softmax, sort and draw cost the same at a
152k vocabulary as at 4k. Past the 64th token the probability mass is negligible at the
temperatures a support chat uses.
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

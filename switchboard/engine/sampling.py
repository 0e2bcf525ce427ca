"""Next-token choice from logits: greedy at temperature 0, else temperature plus top-p."""

from __future__ import annotations

import numpy as np


def sample(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    """``logits``: one row of vocabulary scores."""
    if temperature <= 0.0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    probs = np.exp(z)
    probs /= probs.sum()
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cumulative, top_p)) + 1]  # smallest set reaching top_p
        mask = np.zeros_like(probs)
        mask[keep] = probs[keep]
        probs = mask / mask.sum()
    return int(rng.choice(probs.shape[0], p=probs))

"""The optimizer and learning-rate schedule the trainers share: AdamW that decays matrices only
(norms and biases keep their scale), and a linear warm-up into a cosine down to a floor."""

from __future__ import annotations

import math


def adamw(params, lr: float, weight_decay: float):
    """AdamW over ``params``, ``weight_decay`` on the matrices, none on vectors; betas (0.9, 0.95)."""
    import torch

    params = list(params)
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.95),
    )


def warmup_cosine(step: int, lr: float, warmup: int, steps: int, floor: float) -> float:
    """The rate at ``step``: linear up to ``lr`` over ``warmup`` steps, then a cosine from ``lr``
    down to ``floor * lr`` at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))

"""Attention masks from positions, for models whose layers see different windows (Gemma 3).

The engine's batch layout (engine/batch.py) has masked columns on a row's left and, after a
prefill on top of a cached prefix, between the prefix and the new tokens. A column's index is
then not its position, so a sliding window counted in columns, as transformers counts it,
would reach too far back on such a row. Here the window is counted in positions: a key's
position is the number of real columns before it (rows hold their tokens from position 0, in
order), a query's is its ``position_ids`` entry, and a query at ``q`` sees the real keys at
``k`` with ``q - window < k <= q`` (global layers: ``k <= q``). The KV cache keeps every
position of every layer, so a cached block means the same thing whichever layer reads it.

Both the ONNX export (export/onnx_export.py) and ``runtime: torch`` (engine/torch_runtime.py)
pass these to the model as its per-layer-type mask mapping.
"""

from __future__ import annotations

import torch


def windowed(config) -> int | None:
    """The sliding window of a model that mixes sliding and global layers (else None)."""
    types = getattr(config, "layer_types", None) or ()
    window = getattr(config, "sliding_window", None)
    return int(window) if window and "sliding_attention" in types else None


def unslide(config) -> None:
    """A model whose every layer slides (Mistral) attends to every real column instead.

    Its context is capped at the window (switchboard/artifact/geometry.py), so within it the
    window excludes nothing by position. Counted in columns, as transformers counts it, it would:
    a row's columns also hold masked holes (a cached prefix's gap, a rejected draft's tokens), so
    a row could span more columns than positions and lose its first tokens."""
    types = getattr(config, "layer_types", None) or ()
    if getattr(config, "sliding_window", None) and "full_attention" not in types:
        config.sliding_window = None


def position_masks(attention_mask: torch.Tensor, position_ids: torch.Tensor, window: int, dtype) -> dict:
    """``{"full_attention", "sliding_attention"}`` -> additive masks [B, 1, Q, K].

    ``attention_mask`` [B, K]: 1 where a column holds a real token; ``position_ids`` [B, Q]."""
    real = attention_mask > 0
    keys = (attention_mask.cumsum(-1) - 1)[:, None, :]  # [B, 1, K]
    queries = position_ids[:, :, None]  # [B, Q, 1]
    causal = real[:, None, :] & (keys <= queries)
    sliding = causal & (keys > queries - window)
    low = torch.finfo(dtype).min  # not -inf: a padding query that sees nothing stays finite

    def additive(allowed: torch.Tensor) -> torch.Tensor:
        zero = torch.zeros((), dtype=dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.full((), low, dtype=dtype, device=allowed.device))[:, None]

    return {"full_attention": additive(causal), "sliding_attention": additive(sliding)}

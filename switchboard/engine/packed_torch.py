"""A checkpoint's packed pass in PyTorch (engine/packing.py says what packing is).

The model runs as transformers builds it on the N packed tokens, [1, N]; two pieces put the
attention in the padded [B, S] grid of the batch layout instead:

- ``GridCache`` stands where transformers' cache stands: a layer's new keys and values [1, G, N, D]
  go to their slots of a [B, G, S, D] grid (``token_index``), after the row's cached columns
  [B, G, T, D], so the grown cache is the batch layout's [B, G, T + S, D];
- ``packed_attention`` (registered as an attention implementation) puts the queries in the same
  grid, attends there under the masks of engine/masks.py (windows counted in positions), and
  takes each token's output back out of it.

Masked slots of the grid hold zeros: their keys are masked for every query, and their queries'
outputs are never taken out. The arithmetic of every real token is the padded pass's.
"""

from __future__ import annotations

import torch

from switchboard.engine.masks import position_masks

PACKED = "switchboard_packed"  # the attention implementation's name


class GridCache:
    """Each layer's past [B, G, T, D] and its new columns in the [B, S] grid (module doc)."""

    is_compileable = False

    def __init__(self, past: list[tuple[torch.Tensor, torch.Tensor]], token_index: torch.Tensor, rows: int, width: int):
        self.past, self.token_index, self.rows, self.width = past, token_index, rows, width
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []

    def to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """[1, heads, N, D] packed -> [B, heads, S, D], zeros in the slots no token takes."""
        heads, dim = x.shape[1], x.shape[3]
        grid = x.new_zeros((self.rows * self.width, heads, dim))
        grid = grid.index_copy(0, self.token_index, x[0].transpose(0, 1))
        return grid.view(self.rows, self.width, heads, dim).transpose(1, 2)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        past_k, past_v = self.past[layer_idx]
        k = torch.cat([past_k, self.to_grid(key)], dim=2)
        v = torch.cat([past_v, self.to_grid(value)], dim=2)
        self.layers.append((k, v))
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.past[layer_idx][0].shape[2]) if self.past else 0


def packed_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Attention for packed ``query`` [1, H, N, D] over the grid's ``key``/``value`` [B, G, K, D]
    (``GridCache``) under ``attention_mask`` [B, 1, S, K] (additive); the query heads of one KV
    head are stacked as rows of one product, as export/onnx_export.py's ``grouped_attention``.
    Returns [1, N, H, D]."""
    cache: GridCache = kwargs["grid"]
    b, g, _, d = key.shape
    h = query.shape[1]
    r, s = h // g, cache.width
    q = cache.to_grid(query)  # [B, H, S, D]
    scores = torch.matmul(q.reshape(b, g, r * s, d), key.transpose(2, 3)) * scaling
    k = scores.shape[-1]
    scores = (scores.view(b, g, r, s, k) + attention_mask[:, :, None]).view(b, g, r * s, k)
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value).view(b, h, s, d).transpose(1, 2).reshape(b * s, h, d)
    return out.index_select(0, cache.token_index)[None], None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(PACKED, packed_attention)
    AttentionMaskInterface.register(PACKED, eager_mask)


def grid_masks(attention_mask: torch.Tensor, position_ids: torch.Tensor, token_index, width: int, window, dtype):
    """The masks of the grid's queries [B, 1, S, T + S] from the cache's ``attention_mask``
    [B, T + S] and the packed tokens' positions: one tensor, or by layer type where some layers
    slide (``window``). A slot no token takes gets position 0: it is never read."""
    rows = attention_mask.shape[0]
    grid = position_ids.new_zeros(rows * width).index_copy(0, token_index, position_ids[0]).view(rows, width)
    masks = position_masks(attention_mask, grid, window if window is not None else 1 << 30, dtype)
    return masks if window is not None else masks["full_attention"]


def packed_forward(model, window, input_ids, attention_mask, position_ids, token_index, logits_index, past):
    """Logits [K, V] of the packed tokens ``logits_index`` names, and each layer's cache grown by
    the grid's S columns [B, G, T + S, D]. ``model`` uses ``PACKED`` attention (``register``);
    ``window``: engine/masks.windowed of its config."""
    rows = attention_mask.shape[0]
    width = attention_mask.shape[1] - past[0][0].shape[2]
    cache = GridCache(past, token_index, rows, width)
    masks = grid_masks(attention_mask, position_ids, token_index, width, window, past[0][0].dtype)
    hidden = model.model(
        input_ids=input_ids, attention_mask=masks, position_ids=position_ids, past_key_values=cache, grid=cache
    ).last_hidden_state
    logits = model.lm_head(hidden[0, logits_index])
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # Gemma
        logits = torch.tanh(logits / cap) * cap
    return logits, cache.layers

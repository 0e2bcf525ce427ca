"""A checkpoint's packed pass in PyTorch (engine/packing.py says what packing is).

The model runs as transformers builds it on the N packed tokens, [1, N]; two pieces put the
attention in the batch layout's rows instead:

- ``GridCache`` stands where transformers' cache stands: a layer's new keys and values [1, G, N, D]
  go to their slots of a [B, G, S, D] grid (``token_index``), after the row's cached columns
  [B, G, T, D], so the grown cache is the batch layout's [B, G, T + S, D];
- ``packed_attention`` (registered as an attention implementation) attends in two lanes: the
  widest row's queries over that row's keys alone, the other rows' queries in a narrow [B, s]
  grid over theirs, each under the masks of engine/masks.py (windows counted in positions), and
  puts each token's output back in its packed place.

Masked slots of the grids hold zeros: their keys are masked for every query, and their queries'
outputs are never taken out. The arithmetic of every real token is the padded pass's.
"""

from __future__ import annotations

import torch

from switchboard.engine.masks import position_masks

PACKED = "switchboard_packed"  # the attention implementation's name
# A model that runs both passes (engine/torch_runtime.py): SDPA in a padded pass, the two lanes
# in a packed one (which hands the attention its ``grid``)
EITHER = "switchboard_padded_or_packed"


class GridCache:
    """Each layer's past [B, G, T, D] and its new columns in the [B, S] grid, and the lanes the
    attention runs in (module doc)."""

    is_compileable = False

    def __init__(self, past, token_index, rows: int, width: int, lanes: dict, masks: dict):
        self.past, self.token_index, self.rows, self.width = past, token_index, rows, width
        self.lanes = lanes  # packing.LANES' tensors
        self.masks = masks  # "full" / "sliding" -> (the narrow lane's [B, 1, s, K], the wide one's [1, 1, C, K])
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        past_k, past_v = self.past[layer_idx]
        k = torch.cat([past_k, _to_grid(key[0].transpose(0, 1), self.token_index, self.rows, self.width)], dim=2)
        v = torch.cat([past_v, _to_grid(value[0].transpose(0, 1), self.token_index, self.rows, self.width)], dim=2)
        self.layers.append((k, v))
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.past[layer_idx][0].shape[2]) if self.past else 0


def _to_grid(x: torch.Tensor, slots: torch.Tensor, rows: int, width) -> torch.Tensor:
    """[n, heads, D] tokens -> [rows, heads, width, D], each in its slot (row * width + column),
    zeros where none is."""
    heads, dim = x.shape[1], x.shape[2]
    grid = x.new_zeros((rows * width, heads, dim)).index_copy(0, slots, x)
    return grid.view(rows, width, heads, dim).transpose(1, 2)


def _attend(q, key, value, mask, scaling):
    """Grouped attention, [b, H, q, D] over [b, G, K, D] under an additive [b, 1, q, K] mask: each
    KV head's query heads stacked as rows of one product (export/onnx_export.py's
    ``grouped_attention``). Returns [b, H, q, D]."""
    b, h, n, d = q.shape
    g = key.shape[1]
    r = h // g
    scores = torch.matmul(q.reshape(b, g, r * n, d), key.transpose(2, 3)) * scaling
    k = scores.shape[-1]
    scores = (scores.view(b, g, r, n, k) + mask[:, :, None]).view(b, g, r * n, k)
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, value).view(b, h, n, d)


def packed_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Attention for packed ``query`` [1, H, N, D] over the grid's ``key``/``value`` [B, G, K, D]
    (``GridCache``), in its two lanes; ``attention_mask`` is unused (the lanes' masks are the
    cache's). Returns [1, N, H, D]."""
    cache: GridCache = kwargs["grid"]
    lanes = cache.lanes
    narrow_mask, wide_mask = cache.masks["sliding" if getattr(module, "is_sliding", False) else "full"]
    q = query[0].transpose(0, 1)  # [N, H, D]
    rows, s = key.shape[0], lanes["narrow_positions"].shape[1]
    narrow = _to_grid(q.index_select(0, lanes["narrow_tokens"]), lanes["narrow_slot"], rows, s)
    narrow = _attend(narrow, key, value, narrow_mask, scaling)  # [B, H, s, D]
    narrow = narrow.transpose(1, 2).reshape(rows * s, q.shape[1], q.shape[2]).index_select(0, lanes["narrow_slot"])
    wide = q.index_select(0, lanes["wide_tokens"]).transpose(0, 1)[None]  # [1, H, C, D]
    at = lanes["wide_row"]
    wide = _attend(wide, key.index_select(0, at), value.index_select(0, at), wide_mask, scaling)
    out = q.new_zeros(q.shape).index_copy(0, lanes["narrow_tokens"], narrow)
    return out.index_copy(0, lanes["wide_tokens"], wide[0].transpose(0, 1))[None], None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    AttentionInterface.register(PACKED, packed_attention)
    AttentionMaskInterface.register(PACKED, eager_mask)

    def either(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if "grid" in kwargs:
            return packed_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)

    AttentionInterface.register(EITHER, either)
    AttentionMaskInterface.register(EITHER, sdpa_mask)  # a padded pass's masks: transformers' SDPA path


def lane_masks(attention_mask, position_ids, lanes: dict, window, dtype) -> dict:
    """``{"full", "sliding"}`` -> (the narrow lane's masks [B, 1, s, T + S], the wide lane's
    [1, 1, C, T + S]) from the cache's ``attention_mask`` [B, T + S] and the lanes' positions;
    without ``window`` both names hold the full masks. A narrow slot no token takes has position
    0: its output is never read."""
    wide_pos = position_ids[0].index_select(0, lanes["wide_tokens"])[None]
    span = window if window is not None else 1 << 30
    narrow = position_masks(attention_mask, lanes["narrow_positions"], span, dtype)
    wide = position_masks(attention_mask.index_select(0, lanes["wide_row"]), wide_pos, span, dtype)
    full = (narrow["full_attention"], wide["full_attention"])
    sliding = (narrow["sliding_attention"], wide["sliding_attention"]) if window is not None else full
    return {"full": full, "sliding": sliding}


def packed_forward(model, window, input_ids, attention_mask, position_ids, token_index, logits_index, past, lanes):
    """Logits [K, V] of the packed tokens ``logits_index`` names, and each layer's cache grown by
    the grid's S columns [B, G, T + S, D]. ``lanes``: engine/packing.py's ``LANES``' tensors (engine/packing.py's
    ``Packed`` has each). ``model`` uses ``PACKED`` attention (``register``);
    ``window``: engine/masks.windowed of its config."""
    rows = attention_mask.shape[0]
    width = attention_mask.shape[1] - past[0][0].shape[2]
    dtype = past[0][0].dtype
    masks = lane_masks(attention_mask, position_ids, lanes, window, dtype)
    cache = GridCache(past, token_index, rows, width, lanes, masks)
    # transformers' own mask is not used: a 4D placeholder (a dict of them where layers slide)
    # keeps it from building one
    placeholder = torch.zeros((1, 1, 1, 1), dtype=dtype)
    if window is not None:
        placeholder = {"full_attention": placeholder, "sliding_attention": placeholder}
    hidden = model.model(
        input_ids=input_ids, attention_mask=placeholder, position_ids=position_ids, past_key_values=cache, grid=cache
    ).last_hidden_state
    # [1, K, hidden] into the head, as the padded graph's: a 2-D input exports as Gemm, which
    # ONNX Runtime's dynamic quantizer rewrites without updating the shapes it inferred
    logits = model.lm_head(hidden.index_select(1, logits_index))[0]
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # Gemma
        logits = torch.tanh(logits / cap) * cap
    return logits, cache.layers

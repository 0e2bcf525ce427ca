"""A packed pass: every row's new tokens side by side in one sequence, none padded.

A pass over the batch layout (engine/batch.py) feeds ``input_ids`` [B, S]: every row padded to
the widest row's new tokens. When the rows differ (a prompt's 64-token chunk beside decode rows
of one token each, drafts of different lengths), the padded slots cost as much as real tokens in
every dense layer (the projections, the MLP, the head), which is most of a pass. A packed pass
feeds the N real tokens as one row [1, N] and ``token_index`` [N], where each token sits in the
padded [B, S] grid (row * S + column): the dense layers run on the N tokens, and only attention,
whose cost is in the keys, works in the grid, so the cache keeps its layout and its rows.

Columns are right-aligned as in the batch layout: row ``i``'s ``n_i`` new tokens take the last
``n_i`` of its ``S`` new columns, and the columns left of them are masked.

Attention runs in two lanes, so no query pays for another row's width either: the row with the
most new tokens (a prompt's chunk) attends alone, over its own row of the cache (the wide lane);
the other rows' tokens (decode steps, drafts) attend in a narrow grid [B, s], s the widest of
them. In one grid of [B, S] every row would attend with the chunk's S query slots.

``pack`` lays out the inputs here in NumPy; engine/packed_torch.py runs a checkpoint on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the attention lanes' inputs of a packed pass (each a field of ``Packed``)
LANES = ("narrow_tokens", "narrow_slot", "narrow_positions", "wide_tokens", "wide_row")
# the packed pass's inputs but the past, in the graph's order (export/onnx_export.py's
# ``export_packed``): each a field of ``Packed``
INPUTS = ("input_ids", "attention_mask", "position_ids", "token_index", "logits_index", *LANES)


@dataclass(frozen=True)
class Packed:
    input_ids: np.ndarray  # [1, N] int64: every row's new tokens, row after row
    position_ids: np.ndarray  # [1, N] int64: each token's position in its row
    token_index: np.ndarray  # [N] int64: each token's slot in the [B, S] grid, row * S + column
    attention_mask: np.ndarray  # [B, T + S] int64: the batch's mask and the new columns'
    logits_index: np.ndarray  # [K] int64: the packed tokens whose logits the pass returns
    logits_rows: np.ndarray  # [K] int64: the row of each of them
    width: int  # S: the new columns every row's cache grows by
    narrow_tokens: np.ndarray  # [N - C] int64: the packed tokens of every row but the widest
    narrow_slot: np.ndarray  # [N - C] int64: their slots in the narrow [B, s] grid, row * s + column
    wide_tokens: np.ndarray  # [C] int64: the widest row's packed tokens (it attends alone)
    wide_row: np.ndarray  # [1] int64: that row
    narrow_positions: np.ndarray  # [B, s] int64: the narrow grid's positions (0 where no token is)

    @property
    def narrow_width(self) -> int:
        """s: the new tokens of the widest row but the widest."""
        return int(self.narrow_positions.shape[1])

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def inputs(self) -> dict[str, np.ndarray]:
        """``INPUTS`` by name: a packed graph's feed, but the past."""
        return {name: getattr(self, name) for name in INPUTS}

    def padded_tokens(self) -> int:
        """The tokens a padded pass over the same rows would feed: B * S."""
        return int(self.attention_mask.shape[0]) * self.width


def pack(new: list[list[int]], next_pos: np.ndarray, mask: np.ndarray, keep: list[int] | None = None) -> Packed:
    """The packed inputs for row ``i`` taking ``new[i]`` (possibly none) at positions from
    ``next_pos[i]`` on, over a batch whose cache mask is ``mask`` [B, T]; ``keep[i]``: how many of
    row ``i``'s last new tokens need logits (default 1 for a row with tokens, 0 without)."""
    b = len(new)
    if not b:
        raise ValueError("a pass needs at least one row")
    if mask.shape[0] != b or len(next_pos) != b:
        raise ValueError(f"{b} rows of tokens for a batch of {mask.shape[0]} rows")
    counts = np.asarray([len(t) for t in new], np.int64)
    width = int(counts.max()) if b else 0
    keep = [1 if n else 0 for n in counts] if keep is None else list(keep)
    if any(k < 0 or k > n for k, n in zip(keep, counts)):
        raise ValueError(f"logits asked of {keep} tokens, rows have {counts.tolist()}")
    ids = np.fromiter((t for row in new for t in row), np.int64, int(counts.sum()))
    rows = np.repeat(np.arange(b, dtype=np.int64), counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    offset = np.arange(ids.size, dtype=np.int64) - np.repeat(starts, counts)  # j: a token's place in its row
    column = width - np.repeat(counts, counts) + offset
    new_mask = np.zeros((b, width), np.int64)
    new_mask[rows, column] = 1
    ends = starts + counts
    logits_index = np.concatenate([np.arange(e - k, e) for e, k in zip(ends, keep)]).astype(np.int64)
    wide = int(counts.argmax())
    narrow = rows != wide
    others = np.delete(counts, wide)
    s = int(others.max()) if others.size else 0
    narrow_column = s - np.repeat(counts, counts)[narrow] + offset[narrow]
    positions = np.repeat(np.asarray(next_pos, np.int64), counts) + offset
    narrow_positions = np.zeros(b * s, np.int64)
    narrow_positions[rows[narrow] * s + narrow_column] = positions[narrow]
    return Packed(
        input_ids=ids[None, :],
        position_ids=positions[None, :],
        token_index=rows * width + column,
        attention_mask=np.concatenate([mask.astype(np.int64), new_mask], axis=1),
        logits_index=logits_index,
        logits_rows=rows[logits_index],
        width=width,
        narrow_tokens=np.flatnonzero(narrow).astype(np.int64),
        narrow_slot=rows[narrow] * s + narrow_column,
        wide_tokens=np.flatnonzero(~narrow).astype(np.int64),
        wide_row=np.array([wide], np.int64),
        narrow_positions=narrow_positions.reshape(b, s),
    )


def from_padded(
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    position_ids: np.ndarray,
    keep: int = 1,
    only_if_padded: bool = True,
) -> Packed | None:
    """The packed inputs of a padded pass (``input_ids`` and ``position_ids`` [B, N], rows
    right-aligned; ``attention_mask`` [B, T + N]) whose logits are the last ``keep`` positions of
    each row; None when a row is not right-aligned, or (``only_if_padded``) when no slot is
    padding (nothing to save)."""
    b, n = input_ids.shape
    new_mask = attention_mask[:, -n:].astype(bool)
    counts = new_mask.sum(axis=1)
    if (only_if_padded and counts.min() == n) or counts.max() < n:  # no padding; no row fills the new columns
        return None
    if any(not new_mask[i, n - c :].all() for i, c in enumerate(counts)):
        return None
    new = [input_ids[i, n - c :].tolist() for i, c in enumerate(counts)]
    starts = np.asarray([position_ids[i, n - c] if c else 0 for i, c in enumerate(counts)], np.int64)
    return pack(new, starts, attention_mask[:, :-n], [min(keep, int(c)) for c in counts])


def spread(logits: np.ndarray, packed: Packed, keep: int) -> np.ndarray:
    """A packed pass's logits [K, V] laid out as the padded pass's [B, keep, V]: each row's on
    its right, zeros where the row had fewer than ``keep`` tokens."""
    b = packed.attention_mask.shape[0]
    out = np.zeros((b, keep, logits.shape[-1]), logits.dtype)
    kept = np.bincount(packed.logits_rows, minlength=b)
    column = keep - np.repeat(kept, kept) + (np.arange(kept.sum()) - np.repeat(np.cumsum(kept) - kept, kept))
    out[packed.logits_rows, column] = logits
    return out

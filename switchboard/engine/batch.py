"""KV cache of a batch of sequences that started at different times.

Rows are aligned on the right: column j holds the same step for every row. A row that joined
later, or reused a shorter cached prefix, has masked columns on its left (and, after a
prefill on top of a cached prefix, masked columns between its prefix and its new tokens).
Position ids are explicit per row, so masked columns never shift a row's positions, and a
row's real tokens are simply its unmasked columns. This layout lets sequences join and leave
between decode steps (iteration-level batching) with one concatenation.

The cache is the runtime's: NumPy arrays (ONNX Runtime), or tensors on the runtime's device
(``runtime: torch``), which stay there between steps. Only a row's cache handed out
(``row_cache``: a session's store, a chunked prefill) comes back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KV = list[tuple[np.ndarray, np.ndarray]]  # per layer: key, value [B, H, T, D] (or torch tensors)


def _zeros(like, shape: tuple) -> np.ndarray:
    """Zeros of ``like``'s dtype, on its device."""
    return np.zeros(shape, like.dtype) if isinstance(like, np.ndarray) else like.new_zeros(shape)


def _concat(a, b):
    """``a`` and ``b`` one after the other along the rows (``b`` from the host, ``a`` a device's:
    on ``a``'s device, in its dtype)."""
    if isinstance(a, np.ndarray):
        return np.concatenate([a, b])
    if isinstance(b, np.ndarray):
        b = a.new_tensor(b)
    out = a.new_empty((a.shape[0] + b.shape[0], *a.shape[1:]))
    out[: a.shape[0]], out[a.shape[0] :] = a, b
    return out


@dataclass
class KVBatch:
    kv: KV
    mask: np.ndarray  # [B, T] int64, 1 where a column holds a real token of that row
    next_pos: np.ndarray  # [B] int64, the position id of each row's next token

    @property
    def size(self) -> int:
        return self.mask.shape[0]

    @property
    def width(self) -> int:
        return self.mask.shape[1]

    def padding_fraction(self) -> float:
        return 1.0 - float(self.mask.mean()) if self.mask.size else 0.0

    def select(self, rows: list[int]) -> "KVBatch":
        idx = np.asarray(rows, dtype=np.int64)
        at = idx if not self.kv or isinstance(self.kv[0][0], np.ndarray) else list(rows)  # a tensor's index
        out = KVBatch([(k[at], v[at]) for k, v in self.kv], self.mask[idx], self.next_pos[idx])
        return out.trimmed()

    def trimmed(self) -> "KVBatch":
        """Drop leading columns that no row uses any more."""
        used = np.flatnonzero(self.mask.any(axis=0))
        start = int(used[0]) if used.size else self.width
        if start == 0:
            return self
        return KVBatch([(k[:, :, start:], v[:, :, start:]) for k, v in self.kv], self.mask[:, start:], self.next_pos)

    def holes(self) -> int:
        """Masked columns right of each row's first real one: a verified draft's rejected tokens
        (their cache columns stay, masked), not the padding on a row's left."""
        if not self.mask.size:
            return 0
        real = self.mask.astype(bool)
        first = np.where(real.any(axis=1), real.argmax(axis=1), self.width)
        return int((self.width - first).sum() - real.sum())

    def compacted(self) -> "KVBatch":
        """The same rows with each row's real columns moved together on its right: no holes, and
        the width the longest row needs (a copy of the cache)."""
        counts = self.mask.sum(axis=1)
        width = int(counts.max()) if counts.size else 0
        mask = (np.arange(width)[None, :] >= (width - counts)[:, None]).astype(self.mask.dtype)
        kv = []
        for k, v in self.kv:
            pair = []
            for a in (k, v):
                out = _zeros(a, tuple(a.shape[:2]) + (width,) + tuple(a.shape[3:]))
                for row in range(self.size):
                    cols = np.flatnonzero(self.mask[row])
                    at = cols if isinstance(a, np.ndarray) else cols.tolist()
                    out[row, :, width - cols.size :] = a[row][:, at]
                pair.append(out)
            kv.append(tuple(pair))
        return KVBatch(kv, mask, self.next_pos)

    def left_pad(self, width: int) -> "KVBatch":
        extra = width - self.width
        if extra <= 0:
            return self

        def pad(a: np.ndarray) -> np.ndarray:
            out = _zeros(a, tuple(a.shape[:2]) + (width,) + tuple(a.shape[3:]))
            out[:, :, extra:] = a
            return out

        mask = np.zeros((self.size, width), self.mask.dtype)
        mask[:, extra:] = self.mask
        return KVBatch([(pad(k), pad(v)) for k, v in self.kv], mask, self.next_pos)

    def merge(self, other: "KVBatch") -> "KVBatch":
        if self.size == 0:
            return other
        width = max(self.width, other.width)
        a, b = self.left_pad(width), other.left_pad(width)
        return KVBatch(
            [(_concat(ka, kb), _concat(va, vb)) for (ka, va), (kb, vb) in zip(a.kv, b.kv)],
            np.concatenate([a.mask, b.mask]),
            np.concatenate([a.next_pos, b.next_pos]),
        )

    def row_cache(self, row: int, dtype: np.dtype | None = None) -> np.ndarray:
        """[layers, 2, H, T_row, D] on the host: the row's real columns, contiguous, for a
        session store; a device's cache comes back as ``dtype`` (None: float32)."""
        cols = np.flatnonzero(self.mask[row])
        if isinstance(self.kv[0][0], np.ndarray):
            return np.stack([np.stack([k[row][:, cols], v[row][:, cols]]) for k, v in self.kv])
        at = cols.tolist()
        cache = np.stack([a[row][:, at].float().cpu().numpy() for kv in self.kv for a in kv])  # a copy per tensor
        return cache.reshape((len(self.kv), 2) + cache.shape[1:]).astype(dtype or np.float32, copy=False)


def prefill_inputs(
    prompts: list[list[int]],
    reused: list[int],
    pasts: list[np.ndarray | None],
    num_layers: int,
    kv_heads: int,
    head_dim: int,
    dtype: np.dtype,
    pad_id: int = 0,
):
    """Inputs that prefill ``prompt[reused:]`` of each row on top of its cached prefix.

    ``pasts[i]``: [layers, 2, H, reused[i], D] or None when ``reused[i] == 0``.
    Returns (input_ids, attention_mask, position_ids, past KV, next_pos).
    """
    b = len(prompts)
    new = [len(p) - r for p, r in zip(prompts, reused)]
    p_max, n_max = max(reused), max(new)
    past = [
        (np.zeros((b, kv_heads, p_max, head_dim), dtype), np.zeros((b, kv_heads, p_max, head_dim), dtype))
        for _ in range(num_layers)
    ]
    ids = np.full((b, n_max), pad_id, np.int64)
    mask = np.zeros((b, p_max + n_max), np.int64)
    pos = np.zeros((b, n_max), np.int64)
    for i, (prompt, r, n, cache) in enumerate(zip(prompts, reused, new, pasts)):
        if r:
            for layer, (k, v) in enumerate(past):
                k[i, :, p_max - r :] = cache[layer, 0]
                v[i, :, p_max - r :] = cache[layer, 1]
            mask[i, p_max - r : p_max] = 1
        ids[i, n_max - n :] = prompt[r:]
        mask[i, p_max + n_max - n :] = 1
        pos[i, n_max - n :] = np.arange(r, r + n)
    next_pos = np.asarray([len(p) for p in prompts], np.int64)
    return ids, mask, pos, past, next_pos

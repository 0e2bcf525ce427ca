"""What the scheduler needs of a model: a forward pass over a batch with its KV cache.

``OnnxDecoder`` (ONNX Runtime) and ``TorchDecoder`` (PyTorch) implement it, and the packed
pass of ``PackingDecoder`` (engine/packing.py): the PyTorch one always, the ONNX one on a packed
graph. The unit tests of the scheduler use a scripted one, so scheduling is tested with no
exported model. The cache a
decoder returns is its own (NumPy arrays, or tensors on its device) and comes back to it as it
is; a past it is handed from the host (a stored prefix) is NumPy in ``dtype``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from switchboard.artifact.manifest import Manifest
from switchboard.engine.batch import KV
from switchboard.engine.packing import Packed


class Decoder(Protocol):
    manifest: Manifest  # geometry: num_layers, num_kv_heads, head_dim, context_window
    dtype: np.dtype  # of the KV cache
    verifies: bool  # ``keep`` > 1 works: speculative decoding can verify drafts with it

    def forward(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, past: KV, keep: int = 1
    ) -> tuple[np.ndarray, KV]:
        """Logits of the last ``keep`` positions [B, keep, V] for ``input_ids`` [B, N] and the cache
        grown by N columns."""
        ...


class PackingDecoder(Decoder, Protocol):
    """A decoder that also runs packed passes (engine/packing.py): ``packs`` is True."""

    packs: bool

    def forward_packed(self, packed: Packed, past: KV) -> tuple[np.ndarray, KV]:
        """Logits [K, V] of the packed tokens ``packed.logits_index`` names and the cache grown by
        ``packed.width`` columns: ``forward``'s over the same rows padded."""
        ...

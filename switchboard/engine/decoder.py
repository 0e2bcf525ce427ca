"""What the scheduler needs of a model: a forward pass over a batch with its KV cache.

``OnnxDecoder`` (ONNX Runtime) and ``TorchDecoder`` (PyTorch) implement it; the unit tests of
the scheduler use a scripted one, so scheduling is tested with no exported model. The cache a
decoder returns is its own (NumPy arrays, or tensors on its device) and comes back to it as it
is; a past it is handed from the host (a stored prefix) is NumPy in ``dtype``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from switchboard.artifact.manifest import Manifest
from switchboard.engine.batch import KV


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

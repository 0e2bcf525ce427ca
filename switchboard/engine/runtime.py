"""The chat model's exported graph on ONNX Runtime (session, threads and prepared weights:
switchboard/runtime/onnx.py).

One graph serves prefill and decode: ``input_ids`` [B, N], ``attention_mask`` [B, P+N],
``position_ids`` [B, N], ``past_key_values.{i}.key|value`` [B, H, P, D] in; ``logits``
[B, 1, V] (the last position only) and ``present.{i}.key|value`` [B, H, P+N, D] out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from switchboard.artifact.manifest import Manifest
from switchboard.runtime import onnx


class OnnxDecoder:
    def __init__(
        self,
        directory: Path,
        manifest: Manifest,
        precision: str = "fp32",
        threads: int = 2,
        providers: list[str] | None = None,
        weights_cache: Path | None = None,
    ):
        """``weights_cache``: where the shared pre-packed copy of the weights lives (``onnx.prepared``);
        None loads the graph as it is, with a private pre-packed copy."""
        self.manifest = manifest
        variant = manifest.variant(precision)
        path = Path(directory) / variant["file"]
        providers = providers or onnx.CPU
        self.path = onnx.shared_weights(path, variant.get("fingerprint", precision), weights_cache, providers)
        self.session = onnx.session(self.path, threads, providers)
        self.dtype = np.dtype(manifest.kv_dtype)
        n = manifest.num_layers
        self._past_names = [(f"past_key_values.{i}.key", f"past_key_values.{i}.value") for i in range(n)]
        self._outputs = ["logits"] + [name for i in range(n) for name in (f"present.{i}.key", f"present.{i}.value")]

    def empty_past(self, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        shape = (batch, self.manifest.num_kv_heads, 0, self.manifest.head_dim)
        return [(np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)) for _ in self._past_names]

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[tuple[np.ndarray, np.ndarray]],
    ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        feed = {
            "input_ids": input_ids.astype(np.int64, copy=False),
            "attention_mask": attention_mask.astype(np.int64, copy=False),
            "position_ids": position_ids.astype(np.int64, copy=False),
        }
        for (kname, vname), (k, v) in zip(self._past_names, past):
            feed[kname], feed[vname] = k, v
        out = self.session.run(self._outputs, feed)
        present = [(out[1 + 2 * i], out[2 + 2 * i]) for i in range(len(self._past_names))]
        return out[0], present

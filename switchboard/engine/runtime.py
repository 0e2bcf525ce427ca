"""The chat model's exported graph on ONNX Runtime (session, threads and prepared weights:
switchboard/runtime/onnx.py).

One graph serves prefill and decode: ``input_ids`` [B, N], ``attention_mask`` [B, P+N],
``position_ids`` [B, N], ``past_key_values.{i}.key|value`` [B, H, P, D] in; ``logits``
[B, K, V] and ``present.{i}.key|value`` [B, H, P+N, D] out. ``logits_index`` [K] picks the
positions (default ``[-1]``, the last); a graph exported before it had no such input returns
the last position only, and such a repository does not speculate (``verifies``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from switchboard.artifact.manifest import Manifest
from switchboard.engine import packing
from switchboard.runtime import onnx

LOGITS_INDEX = "logits_index"  # the graph's input naming the positions whose logits it returns


class OnnxDecoder:
    def __init__(
        self,
        directory: Path,
        manifest: Manifest,
        precision: str = "fp32",
        threads: int = 2,
        providers: list[str] | None = None,
        weights_cache: Path | None = None,
        pack: bool = True,
    ):
        """``weights_cache``: where the shared pre-packed copy of the weights lives (``onnx.prepared``);
        None loads the graph as it is, with a private pre-packed copy. ``pack``: the variant's packed
        graph where the export chose it (``Manifest.graph``); False: the padded graph."""
        self.manifest = manifest
        variant = manifest.graph(precision, pack)
        path = Path(directory) / variant["file"]
        providers = providers or onnx.CPU
        self.path = onnx.shared_weights(path, variant.get("fingerprint", precision), weights_cache, providers)
        self.session = onnx.session(self.path, threads, providers)
        self.dtype = np.dtype(manifest.kv_dtype)
        n = manifest.num_layers
        self._past_names = [(f"past_key_values.{i}.key", f"past_key_values.{i}.value") for i in range(n)]
        self._outputs = ["logits"] + [name for i in range(n) for name in (f"present.{i}.key", f"present.{i}.value")]
        names = {x.name for x in self.session.get_inputs()} | {
            x.name for x in self.session.get_overridable_initializers()
        }
        self.verifies = LOGITS_INDEX in names  # several positions' logits a pass: drafts can be verified
        self.packs = "token_index" in names  # the packed pass's graph (export_packed): forward_packed

    def empty_past(self, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        shape = (batch, self.manifest.num_kv_heads, 0, self.manifest.head_dim)
        return [(np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)) for _ in self._past_names]

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[tuple[np.ndarray, np.ndarray]],
        keep: int = 1,
    ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """Logits of the last ``keep`` positions [B, keep, V] and the cache grown by N columns."""
        if self.packs:  # the packed graph runs a padded pass too: every row's tokens packed
            packed = packing.from_padded(input_ids, attention_mask, position_ids, keep, only_if_padded=False)
            if packed is None:
                raise ValueError("a padded pass's rows must be right-aligned (engine/batch.py)")
            logits, present = self.forward_packed(packed, past)
            return packing.spread(logits, packed, keep), present
        feed = {
            "input_ids": input_ids.astype(np.int64, copy=False),
            "attention_mask": attention_mask.astype(np.int64, copy=False),
            "position_ids": position_ids.astype(np.int64, copy=False),
        }
        if keep != 1:
            if not self.verifies:
                raise ValueError(f"{self.path} returns the last position's logits only (exported before logits_index)")
            feed[LOGITS_INDEX] = np.arange(-keep, 0, dtype=np.int64)
        for (kname, vname), (k, v) in zip(self._past_names, past):
            feed[kname], feed[vname] = k, v
        out = self.session.run(self._outputs, feed)
        present = [(out[1 + 2 * i], out[2 + 2 * i]) for i in range(len(self._past_names))]
        return out[0], present

    def forward_packed(self, packed: packing.Packed, past: list[tuple[np.ndarray, np.ndarray]]):
        """Logits [K, V] of ``packed.logits_index``'s tokens and the cache grown by
        ``packed.width`` columns, as ``forward`` over the same rows padded (engine/packing.py)."""
        feed = packed.inputs()
        for (kname, vname), (k, v) in zip(self._past_names, past):
            feed[kname], feed[vname] = k, v
        out = self.session.run(self._outputs, feed)
        return out[0], [(out[1 + 2 * i], out[2 + 2 * i]) for i in range(len(self._past_names))]

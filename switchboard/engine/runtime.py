"""ONNX Runtime session for a decoder exported with KV-cache inputs and outputs.

One graph serves prefill and decode: ``input_ids`` [B, N], ``attention_mask`` [B, P+N],
``position_ids`` [B, N], ``past_key_values.{i}.key|value`` [B, H, P, D] in; ``logits``
[B, N, V] and ``present.{i}.key|value`` [B, H, P+N, D] out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from switchboard.artifact.manifest import Manifest


def session_options(threads: int) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Several sessions share two cores here (two pools, perf tools): spinning threads
    # would burn the cores the other sessions need.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


class OnnxDecoder:
    def __init__(
        self,
        directory: Path,
        manifest: Manifest,
        precision: str = "fp32",
        threads: int = 2,
        providers: list[str] | None = None,
    ):
        self.manifest = manifest
        path = Path(directory) / manifest.variant(precision)["file"]
        self.session = ort.InferenceSession(
            str(path), session_options(threads), providers=providers or ["CPUExecutionProvider"]
        )
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

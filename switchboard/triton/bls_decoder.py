"""A decoder that runs on a native Triton model (onnxruntime or tensorrt_plan backend) over BLS.

Same interface as ``switchboard.engine.runtime.OnnxDecoder``, so the engine's scheduler,
batching and KV handling are identical whether the graph runs in-process (this machine) or on
the GPU in NVIDIA's container.
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from switchboard.artifact.manifest import Manifest


class BlsDecoder:
    verifies = False  # the native model's config feeds no logits_index: the last position only

    def __init__(self, model_name: str, manifest: Manifest):
        self.model_name = model_name
        self.manifest = manifest
        self.dtype = np.dtype(manifest.kv_dtype)
        n = manifest.num_layers
        self._past_names = [(f"past_key_values.{i}.key", f"past_key_values.{i}.value") for i in range(n)]
        self._outputs = ["logits"] + [name for i in range(n) for name in (f"present.{i}.key", f"present.{i}.value")]

    def empty_past(self, batch: int):
        shape = (batch, self.manifest.num_kv_heads, 0, self.manifest.head_dim)
        return [(np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)) for _ in self._past_names]

    def forward(self, input_ids, attention_mask, position_ids, past, keep=1):
        if keep != 1:
            raise ValueError(f"{self.model_name}: a native model returns the last position's logits only")
        inputs = [
            pb_utils.Tensor("input_ids", input_ids.astype(np.int64, copy=False)),
            pb_utils.Tensor("attention_mask", attention_mask.astype(np.int64, copy=False)),
            pb_utils.Tensor("position_ids", position_ids.astype(np.int64, copy=False)),
        ]
        for (kname, vname), (k, v) in zip(self._past_names, past):
            inputs += [pb_utils.Tensor(kname, np.ascontiguousarray(k)), pb_utils.Tensor(vname, np.ascontiguousarray(v))]
        response = pb_utils.InferenceRequest(
            model_name=self.model_name, inputs=inputs, requested_output_names=self._outputs
        ).exec()
        if response.has_error():
            raise RuntimeError(f"{self.model_name}: {response.error().message()}")
        out = [pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in self._outputs]
        return out[0], [(out[1 + 2 * i], out[2 + 2 * i]) for i in range(len(self._past_names))]

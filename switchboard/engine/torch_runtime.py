"""The Hugging Face checkpoint in PyTorch behind the ONNX graph's interface.

``runtime: torch:cuda`` in a pool's config runs the engine on an NVIDIA GPU where TensorRT and
onnxruntime-gpu are absent (FP16 weights on CUDA); ``torch:cpu`` is the same path on the CPU,
which the tests use to check it against ONNX Runtime. Inputs and logits are numpy arrays laid
out exactly like ``OnnxDecoder``'s, so the scheduler does not change.

The KV cache stays on the device between steps, in the model's dtype, as the recognizer's
does (asr/torch_runtime.py): ``forward`` returns the grown cache as tensors, and the batch
layout (engine/batch.py) selects, pads and joins rows on the device. Only a past handed in
from the host (a session's stored prefix, a chunked prefill's) is copied there, and only a
row's cache handed out (``KVBatch.row_cache``) comes back. Copying every layer's cache to the
host and back at every step cost two transfers of the whole cache per token.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from switchboard.artifact.geometry import geometry, mismatches
from switchboard.artifact.manifest import Manifest


class TorchDecoder:
    def __init__(self, checkpoint: Path, manifest: Manifest, device: str = "cpu", threads: int = 2):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from switchboard.engine import heads, packed_torch
        from switchboard.engine.masks import unslide, windowed
        from switchboard.runtime import pytorch

        self.torch = torch
        self.manifest = manifest
        self.device = pytorch.device(device, threads)
        self.model_dtype = pytorch.dtype("auto", self.device)
        config = AutoConfig.from_pretrained(str(checkpoint))
        differ = mismatches(geometry(config), manifest)
        if differ:  # before the weights are read
            raise ValueError(
                f"checkpoint {checkpoint} is not the model the repository was exported from "
                f"({', '.join(differ)}; checkpoint != manifest)"
            )
        self.model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=self.model_dtype)
        heads.restrict(self.model, checkpoint)  # the graph's head, where the checkpoint lists one
        packed_torch.register()
        self.model.set_attn_implementation(packed_torch.EITHER)  # padded passes as SDPA, packed ones too
        self.window = windowed(config)
        if self.window is None:
            unslide(self.model.config)  # as the exported graph
        self.model.to(self.device).eval()
        self.dtype = np.dtype(manifest.kv_dtype)  # of a cache on the host (prefixes in, row_cache out)

    def empty_past(self, batch: int) -> list:
        shape = (batch, self.manifest.num_kv_heads, 0, self.manifest.head_dim)
        zeros = self.torch.zeros
        return [
            (
                zeros(shape, dtype=self.model_dtype, device=self.device),
                zeros(shape, dtype=self.model_dtype, device=self.device),
            )
            for _ in range(self.manifest.num_layers)
        ]

    def _on_device(self, a, dtype=None):
        """``a`` on the device: an array from the host copied there, a tensor already there as it is."""
        if isinstance(a, np.ndarray):
            return self.torch.from_numpy(np.ascontiguousarray(a)).to(self.device, dtype)
        return a

    verifies = True  # several positions' logits a pass: drafts can be verified
    packs = True  # forward_packed: a pass over rows of different lengths without padding

    def forward(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, past: list, keep: int = 1
    ):
        """Logits [B, keep, V] of the last ``keep`` positions on the host, and the cache grown by
        N columns on the device (``past``: arrays from the host or this decoder's tensors)."""
        torch = self.torch
        from transformers import DynamicCache

        from switchboard.engine.masks import position_masks

        with torch.inference_mode():
            cache = DynamicCache()
            if past and past[0][0].shape[2]:
                for i, (k, v) in enumerate(past):
                    cache.update(self._on_device(k, self.model_dtype), self._on_device(v, self.model_dtype), i)
            mask, positions = self._on_device(attention_mask, torch.long), self._on_device(position_ids, torch.long)
            if self.window is not None:
                mask = position_masks(mask, positions, self.window, self.model_dtype)
            out = self.model(
                input_ids=self._on_device(input_ids, torch.long),
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=keep,  # the last positions only, as the exported graph
            )
            logits = out.logits.float().cpu().numpy()
            present = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        return logits, present

    def forward_packed(self, packed, past: list):
        """Logits [K, V] of ``packed.logits_index``'s tokens on the host and the cache grown by
        ``packed.width`` columns on the device, as ``forward`` over the same rows padded
        (engine/packing.py)."""
        torch = self.torch
        from switchboard.engine.packed_torch import packed_forward
        from switchboard.engine.packing import LANES

        t = {name: self._on_device(a, torch.long) for name, a in packed.inputs().items()}
        with torch.inference_mode():
            past = [(self._on_device(k, self.model_dtype), self._on_device(v, self.model_dtype)) for k, v in past]
            logits, present = packed_forward(
                self.model, self.window, t["input_ids"], t["attention_mask"], t["position_ids"],
                t["token_index"], t["logits_index"], past, {name: t[name] for name in LANES},
            )  # fmt: skip
            return logits.float().cpu().numpy(), present

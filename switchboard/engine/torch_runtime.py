"""The Hugging Face checkpoint in PyTorch behind the ONNX graph's interface.

``runtime: torch:cuda`` in a pool's config runs the engine on an NVIDIA GPU where TensorRT and
onnxruntime-gpu are absent (FP16 weights on CUDA); ``torch:cpu`` is the same path on the CPU,
which the tests use to check it against ONNX Runtime. Inputs and outputs are numpy arrays
laid out exactly like ``OnnxDecoder``'s, so the scheduler and the KV batch layout do not change.
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

        from switchboard.engine import heads
        from switchboard.engine.masks import windowed
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
        self.window = windowed(config)
        self.model.to(self.device).eval()
        self.dtype = np.dtype(manifest.kv_dtype)  # what the batch layout keeps between steps

    def empty_past(self, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        shape = (batch, self.manifest.num_kv_heads, 0, self.manifest.head_dim)
        return [(np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)) for _ in range(self.manifest.num_layers)]

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[tuple[np.ndarray, np.ndarray]],
    ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        torch = self.torch
        from transformers import DynamicCache

        from switchboard.engine.masks import position_masks

        def dev(a, dtype=None):
            return torch.from_numpy(np.ascontiguousarray(a)).to(self.device, dtype)

        with torch.inference_mode():
            cache = DynamicCache()
            if past and past[0][0].shape[2]:
                for i, (k, v) in enumerate(past):
                    cache.update(dev(k, self.model_dtype), dev(v, self.model_dtype), i)
            mask, positions = dev(attention_mask, torch.long), dev(position_ids, torch.long)
            if self.window is not None:
                mask = position_masks(mask, positions, self.window, self.model_dtype)
            out = self.model(
                input_ids=dev(input_ids, torch.long),
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,  # the last position only, as the exported graph
            )
            logits = out.logits.float().cpu().numpy()
            present = [
                (
                    layer.keys.float().cpu().numpy().astype(self.dtype, copy=False),
                    layer.values.float().cpu().numpy().astype(self.dtype, copy=False),
                )
                for layer in out.past_key_values.layers
            ]
        return logits, present

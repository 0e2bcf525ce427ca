"""The recognizer's graphs run in PyTorch: the ASR pool on a GPU where ONNX Runtime has no CUDA.

``TorchWhisper`` is the same runtime as ``runtime.OnnxWhisper`` (``encode``, ``empty_past``,
``decode``; what ``model.AsrModel`` needs) over the very modules the ONNX graphs are exported
from (``graphs.py``), so the two cannot drift apart: the export's parity check holds those
modules to transformers' Whisper, and tests/export/test_asr_export.py and
tests/integration/test_asr_torch_runtime.py hold this runtime to the ONNX graphs.

Attention goes through PyTorch's fused kernels, flash and memory-efficient only: cuDNN's builds
a plan for every new shape, and decoding makes one per step (the cache grows by a position).

The caches stay on the device between steps as torch tensors (``AsrModel._keep`` slices them
as it slices NumPy arrays); only each step's last-position logits ([B, V]) come back to the
host, where ``AsrModel`` suppresses tokens and picks the next ones. On CUDA the weights run in
float16 unless ``dtype`` says otherwise; on the CPU in float32.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from switchboard.asr.runtime import KV, AsrManifest

DTYPES = ("float16", "bfloat16", "float32")


class TorchWhisper:
    def __init__(
        self, model, manifest: AsrManifest, device: str = "cuda", dtype: str | None = None, fused: bool = True
    ):
        """``model``: a transformers ``WhisperForConditionalGeneration``; ``dtype``: float32,
        float16 or bfloat16 (default: float16 on CUDA, float32 elsewhere); ``fused``: attention
        through ``scaled_dot_product_attention`` (else the exported graphs' plain products)."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from switchboard.asr.graphs import modules

        self.manifest = manifest
        self.device = torch.device(device)
        name = dtype or ("float16" if self.device.type == "cuda" else "float32")
        if name not in DTYPES:
            raise ValueError(f"dtype {name!r}: expected {', '.join(DTYPES)}")
        self.dtype = getattr(torch, name)
        model = model.to(device=self.device, dtype=self.dtype).eval()
        encoder_graph, decoder_graph = modules(fused=fused)
        self.encoder, self.decoder = encoder_graph(model).eval(), decoder_graph(model).eval()
        self._torch = torch
        backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        self._kernels = functools.partial(sdpa_kernel, backends)

    @classmethod
    def load(cls, checkpoint: Path, manifest: AsrManifest, device: str = "cuda", dtype: str | None = None, **kw):
        from transformers import WhisperForConditionalGeneration

        return cls(WhisperForConditionalGeneration.from_pretrained(checkpoint), manifest, device, dtype, **kw)

    def encode(self, features: np.ndarray) -> KV:
        torch = self._torch
        with torch.inference_mode(), self._kernels():
            out = self.encoder(torch.from_numpy(np.ascontiguousarray(features)).to(self.device, self.dtype))
        n = self.manifest.num_layers
        return list(zip(out[:n], out[n:]))

    def empty_past(self, batch: int) -> KV:
        m = self.manifest
        shape = (batch, m.num_heads, 0, m.head_dim)
        zeros = self._torch.zeros
        return [
            (zeros(shape, device=self.device, dtype=self.dtype), zeros(shape, device=self.device, dtype=self.dtype))
            for _ in range(m.num_layers)
        ]

    def decode(self, input_ids: np.ndarray, past: KV, cross: KV) -> tuple[np.ndarray, KV]:
        torch = self._torch
        ids = torch.from_numpy(np.asarray(input_ids, np.int64)).to(self.device)
        with torch.inference_mode(), self._kernels():
            out = self.decoder(ids, *(t for kv in past for t in kv), *(t for kv in cross for t in kv))
        return out[0].float().cpu().numpy(), list(zip(out[1::2], out[2::2]))

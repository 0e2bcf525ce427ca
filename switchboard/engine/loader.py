"""Which runtime runs a pool's model, and how: its ``runtime``, ``threads``, ``weights_cache``
and ``checkpoint`` parameters, checked, then the decoder they name.

- ``onnxruntime``: the exported graph in-process (``runtime.OnnxDecoder``), its pre-packed
  weights shared through ``weights_cache``;
- ``torch[:cpu|cuda]``: the Hugging Face checkpoint in PyTorch (``torch_runtime.TorchDecoder``),
  for a GPU without TensorRT; on a Triton GPU instance ``cuda`` is that instance's device;
- ``triton:<model>``: a native Triton model over BLS (NVIDIA's container). Only the Triton glue
  can build that decoder, so it passes its constructor in as ``native``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from switchboard.artifact.manifest import Manifest
from switchboard.engine.decoder import Decoder
from switchboard.engine.runtime import OnnxDecoder, auto_threads, weights_cache

ONNXRUNTIME, TORCH, TRITON = "onnxruntime", "torch", "triton"


@dataclass(frozen=True)
class RuntimeChoice:
    kind: str  # ONNXRUNTIME, TORCH or TRITON
    target: str  # torch: its device; triton: the native model's name
    threads: int  # ONNX Runtime's (or PyTorch's CPU) threads
    weights_cache: Path | None  # onnxruntime: where the shared pre-packed weights live
    checkpoint: str  # torch: the Hugging Face checkpoint

    @property
    def reads_graph(self) -> bool:
        """Whether this runtime serves the version's exported graph (``torch`` loads the
        checkpoint instead and checks its shape against the manifest)."""
        return self.kind != TORCH

    @classmethod
    def parse(cls, runtime: str, threads: int, cache: str, checkpoint: str, model_bytes: int) -> RuntimeChoice:
        """The pool's settings, checked; ValueError names the parameter that is wrong.
        ``threads`` 0 is automatic for a model of ``model_bytes``."""
        threads = threads or auto_threads(model_bytes)
        if runtime == ONNXRUNTIME:
            return cls(ONNXRUNTIME, "", threads, weights_cache(cache), checkpoint)
        if runtime.startswith(TRITON + ":"):
            return cls(TRITON, runtime.split(":", 1)[1], threads, None, checkpoint)
        if runtime.split(":", 1)[0] == TORCH:
            if not checkpoint:
                raise ValueError(
                    f"runtime {runtime!r} needs parameter 'checkpoint' "
                    "(the Hugging Face checkpoint the repository was exported from)"
                )
            device = runtime.split(":", 1)[1] if ":" in runtime else "cpu"
            return cls(TORCH, device, threads, None, checkpoint)
        raise ValueError(f"parameter 'runtime' = {runtime!r}: expected onnxruntime, torch[:cpu|cuda] or triton:<model>")

    def load(
        self,
        directory: Path,
        manifest: Manifest,
        precision: str,
        gpu: str | None = None,
        native: Callable[[str, Manifest], Decoder] | None = None,
    ) -> Decoder:
        """The decoder for the model version in ``directory``. ``gpu``: the device id of the GPU
        the Triton instance runs on, if it does; ``native``: how to reach a native Triton model."""
        if self.kind == ONNXRUNTIME:
            return OnnxDecoder(directory, manifest, precision, threads=self.threads, weights_cache=self.weights_cache)
        if self.kind == TRITON:
            if native is None:
                raise ValueError(f"runtime 'triton:{self.target}' runs only inside Triton")
            return native(self.target, manifest)
        from switchboard.engine.torch_runtime import TorchDecoder  # torch only where it is chosen

        device = f"cuda:{gpu}" if self.target == "cuda" and gpu is not None else self.target
        return TorchDecoder(self.checkpoint, manifest, device, threads=self.threads)

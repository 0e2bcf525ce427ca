"""A chat pool's runtime: its ``runtime``, ``threads``, ``weights_cache`` and ``checkpoint``
parameters, checked (switchboard/runtime/choice.py has the vocabulary), then the decoder they
name:

- ``onnxruntime``: the exported graph in-process (``runtime.OnnxDecoder``);
- ``torch[:cpu|cuda]``: the Hugging Face checkpoint in PyTorch (``torch_runtime.TorchDecoder``);
- ``triton:<model>``: a native Triton model over BLS (NVIDIA's container). Only the Triton glue
  can build that decoder, so it passes its constructor in as ``native``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from switchboard.artifact.manifest import Manifest
from switchboard.engine.decoder import Decoder
from switchboard.engine.runtime import OnnxDecoder
from switchboard.engine.sizing import MANY_THREADS_FROM_BYTES
from switchboard.runtime.choice import ONNXRUNTIME, TORCH, TRITON, RuntimeChoice
from switchboard.runtime.onnx import auto_threads


def pool_runtime(runtime: str, threads: int, cache: str, checkpoint: str, model_bytes: int) -> RuntimeChoice:
    """The pool's settings, checked; ValueError names the parameter that is wrong.
    ``threads`` 0 is automatic for a model of ``model_bytes``."""
    choice = RuntimeChoice.parse(
        runtime, threads or auto_threads(model_bytes, MANY_THREADS_FROM_BYTES), cache, checkpoint
    )
    if choice.kind == TORCH and not checkpoint:
        raise ValueError(
            f"runtime {runtime!r} needs parameter 'checkpoint' "
            "(the Hugging Face checkpoint the repository was exported from)"
        )
    return choice


def load_decoder(
    choice: RuntimeChoice,
    directory: Path,
    manifest: Manifest,
    precision: str,
    gpu: str | None = None,
    native: Callable[[str, Manifest], Decoder] | None = None,
    pack: bool = True,
) -> Decoder:
    """The decoder for the model version in ``directory``. ``gpu``: the device id of the GPU
    the Triton instance runs on, if it does; ``native``: how to reach a native Triton model;
    ``pack``: the graph exported packed where the export chose it (``packed_passes``)."""
    if choice.kind == ONNXRUNTIME:
        return OnnxDecoder(
            directory, manifest, precision, threads=choice.threads, weights_cache=choice.weights_cache, pack=pack
        )
    if choice.kind == TRITON:
        if native is None:
            raise ValueError(f"runtime '{TRITON}:{choice.target}' runs only inside Triton")
        return native(choice.target, manifest)
    from switchboard.engine.torch_runtime import TorchDecoder  # torch only where it is chosen

    return TorchDecoder(choice.checkpoint, manifest, choice.device(gpu), threads=choice.threads)

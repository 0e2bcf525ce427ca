"""Which runtime runs a model, in one vocabulary for the chat pools and the recognizer:

- ``onnxruntime``: the exported graph in-process (switchboard/runtime/onnx.py: session
  options, threads, pre-packed weights shared through ``weights_cache``);
- ``torch:cpu`` | ``torch:cuda[:N]``: the Hugging Face checkpoint in PyTorch
  (switchboard/runtime/pytorch.py: device, dtype, CUDA graphs), for a GPU where ONNX Runtime
  has no CUDA provider; on a Triton GPU instance ``cuda`` is that instance's device;
- ``triton:<model>``: a native Triton model over BLS (chat pools only; only the Triton glue
  can reach it).

What a runtime builds (a chat decoder, a recognizer) is its channel's: engine/loader.py and
asr/model.py. The recognizer's config keeps its older parameters (``runtime onnx|torch``,
``device``, ``torch_dtype``, ``torch_steps``); ``recognizer`` maps them onto this choice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from switchboard.runtime.onnx import weights_cache

ONNXRUNTIME, TORCH, TRITON = "onnxruntime", "torch", "triton"
DTYPES = ("float16", "bfloat16", "float32")  # torch; "auto": float16 on CUDA, float32 on the CPU
# How a torch model's decoding steps run: graphs (one replayed CUDA graph per step over
# fixed-size buffers), static (the same buffers, no graphs), growing (a cache that grows by a
# position a step); auto: graphs on CUDA, growing on the CPU.
STEPS = ("auto", "graphs", "static", "growing")
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class RuntimeChoice:
    kind: str  # ONNXRUNTIME, TORCH or TRITON
    target: str = ""  # torch: its device; triton: the native model's name
    threads: int = 0  # ONNX Runtime's (or PyTorch's CPU) threads; 0: every usable core
    weights_cache: Path | None = None  # onnxruntime: where the shared pre-packed weights live
    checkpoint: str = ""  # torch: the Hugging Face checkpoint
    dtype: str = "auto"  # torch: one of DTYPES or auto
    steps: str = "auto"  # torch: one of STEPS

    @property
    def reads_graph(self) -> bool:
        """Whether this runtime serves the version's exported graph (``torch`` loads the
        checkpoint instead and checks its shape against the manifest)."""
        return self.kind != TORCH

    @property
    def on_gpu(self) -> bool:
        return self.kind == TORCH and self.target.startswith("cuda")

    def device(self, gpu: str | None = None) -> str:
        """torch: the device to run on; ``gpu``: the device id of the GPU a Triton instance runs
        on, if it does (``cuda`` then means that one)."""
        return f"cuda:{gpu}" if self.target == "cuda" and gpu is not None else self.target

    def torch_dtype(self) -> str:
        """torch: the dtype's name, ``auto`` resolved for the device."""
        if self.dtype != "auto":
            return self.dtype
        return "float16" if self.on_gpu else "float32"

    def torch_steps(self) -> str:
        """torch: how decoding steps run, ``auto`` resolved for the device."""
        if self.steps != "auto":
            return self.steps
        return "graphs" if self.on_gpu else "growing"

    @classmethod
    def parse(
        cls, runtime: str, threads: int = 0, cache: str = "off", checkpoint: str = "", device: str = "cpu"
    ) -> RuntimeChoice:
        """A ``runtime`` setting, checked; ValueError names the parameter that is wrong.
        ``device``: where plain ``torch`` runs; ``cache``: the ``weights_cache`` setting."""
        if runtime == ONNXRUNTIME:
            return cls(ONNXRUNTIME, "", threads, weights_cache(cache), checkpoint)
        if runtime.startswith(TRITON + ":") and runtime.split(":", 1)[1]:
            return cls(TRITON, runtime.split(":", 1)[1], threads, None, checkpoint)
        kind, _, target = runtime.partition(":")
        if kind == TORCH and _DEVICE.fullmatch(target or device):
            return cls(TORCH, target or device, threads, None, checkpoint)
        raise ValueError(f"parameter 'runtime' = {runtime!r}: expected onnxruntime, torch[:cpu|cuda] or triton:<model>")

    @classmethod
    def recognizer(
        cls, runtime: str, device: str, threads: int, checkpoint: str = "", dtype: str = "auto", steps: str = "auto"
    ) -> RuntimeChoice:
        """The recognizer's parameters (asr/config.pbtxt: ``runtime`` onnx or torch, ``device``,
        ``torch_dtype``, ``torch_steps``) as a choice; ValueError names the parameter."""
        if runtime in ("onnx", ONNXRUNTIME):
            return cls(ONNXRUNTIME, "", threads)
        if runtime.partition(":")[0] != TORCH:
            raise ValueError(f"parameter 'runtime' = {runtime!r}: expected onnx or torch")
        if ":" not in runtime and not _DEVICE.fullmatch(device):
            raise ValueError(f"parameter 'device' = {device!r}: expected cpu, cuda or cuda:N")
        choice = cls.parse(runtime, threads, checkpoint=checkpoint, device=device)
        if dtype not in ("auto", *DTYPES):
            raise ValueError(f"parameter 'torch_dtype' = {dtype!r}: expected auto or {', '.join(DTYPES)}")
        if steps not in STEPS:
            raise ValueError(f"parameter 'torch_steps' = {steps!r}: expected {', '.join(STEPS)}")
        if steps == "graphs" and not choice.on_gpu:
            raise ValueError(f"torch_steps graphs needs a CUDA device, not {choice.target!r}")
        return cls(TORCH, choice.target, threads, None, checkpoint, dtype, steps)

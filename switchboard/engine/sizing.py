"""What a model's size decides, without importing a runtime (``chat`` reads it too)."""

from __future__ import annotations

# Below this a model is small enough that Python and the server, not the runtime, take the
# cores: one intra-op thread serves it best (docs/benchmarks.md).
MANY_THREADS_FROM_BYTES = 256 << 20


def compute_bound(model_bytes: int, runtime: str) -> bool:
    """Whether the model's forward passes, not Python and the server, take the cores: a model
    of 256 MB or more on the CPU. There every batch streams all the weights per step, so
    priority 1 shares the batch rather than decoding in one of its own (the pools'
    ``priority_lane`` auto), and ``chat`` admits about as many chats as the pools have rows
    (its ``max_inflight`` auto)."""
    on_cpu = runtime == "onnxruntime" or runtime in ("torch", "torch:cpu")
    return on_cpu and model_bytes >= MANY_THREADS_FROM_BYTES

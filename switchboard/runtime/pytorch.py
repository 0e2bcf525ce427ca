"""PyTorch for every model the pools serve: the device, the dtype and CUDA graphs.

Imported only where a ``torch:`` runtime is chosen (switchboard/runtime/choice.py): the
server's image need not have torch.
"""

from __future__ import annotations

import torch

from switchboard.runtime.choice import DTYPES


def device(name: str, threads: int = 0) -> torch.device:
    """The device ``name`` (cpu, cuda, cuda:N); on the CPU, PyTorch's intra-op threads set to
    ``threads`` (0: PyTorch's own default)."""
    dev = torch.device(name)
    if dev.type == "cpu" and threads:
        torch.set_num_threads(threads)
    return dev


def dtype(name: str | None, on: torch.device) -> torch.dtype:
    """The weights' dtype: ``name`` (one of DTYPES), or for None / auto float16 on CUDA and
    float32 on the CPU."""
    if name in (None, "auto"):
        name = "float16" if on.type == "cuda" else "float32"
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r}: expected {', '.join(DTYPES)}")
    return getattr(torch, name)


def capture(run, on: torch.device, pool=None):
    """``run`` as a CUDA graph, and what it returned (tensors the graph's replays write): two
    runs on a side stream first (allocations, autotuning), then the capture, its working memory
    from ``pool`` (a ``graph_pool_handle``; None: a pool of its own). One capture at a time:
    the caller serializes them."""
    side = torch.cuda.Stream(on)
    side.wait_stream(torch.cuda.current_stream(on))
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
    torch.cuda.current_stream(on).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        out = run()
    return graph, out

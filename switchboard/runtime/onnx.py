"""ONNX Runtime for every model the pools serve: session options, threads, prepared weights.

One copy of the weights per machine: ONNX Runtime's CPU kernels "pre-pack" every weight
matrix into their own layout at load, a private copy per process (each pool held 2.1 GB for a
1.98 GB model). ``prepared`` has the runtime write the optimized graph with the pre-packed
weights as external data once per model, runtime version and CPU, in a cache directory; every
pool then memory-maps that file, so the pages are the page cache's, shared by all the pools.
Loading the plain graph without pre-packing would share the weights too, but packs them on
every call instead: 1.7x slower at batch 8 (docs/benchmarks.md).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
from pathlib import Path

import onnxruntime as ort

from switchboard import paths

log = logging.getLogger(__name__)

CPU = ["CPUExecutionProvider"]


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def auto_threads(work: float, many_from: float, cores: int | None = None) -> int:
    """A model's ``threads`` 0: every usable core (or ``cores``) for a model whose ``work`` (its
    bytes, its FLOPs: each channel says what it measures) reaches ``many_from``, else one. Below
    it the threads' handoffs cost more than they split, and Python and the server, not the
    runtime, take the cores (docs/benchmarks.md)."""
    return (cores or usable_cores()) if work >= many_from else 1


def session_options(threads: int) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Several sessions share the cores (two pools, perf tools): spinning threads would burn
    # the cores the other sessions need.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # Errors only: the graph's logits_index is an input with a default (an initializer), which
    # ONNX Runtime warns about in color at every load, into the server's log.
    opts.log_severity_level = 3
    return opts


def _machine_key(source: Path, fingerprint: str) -> str:
    """What the pre-packed layout depends on: the weights, the runtime and the CPU's features."""
    flags = ""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    h = hashlib.sha256(f"{fingerprint}:{source.name}:{ort.__version__}:{flags}".encode())
    return h.hexdigest()[:16]


def weights_cache(setting: str) -> Path | None:
    """A pool's ``weights_cache`` parameter as a directory; None for 'off'."""
    if setting.strip().lower() == "off":
        return None
    return Path(setting) if setting.strip() else paths.BUILD / "cache" / "weights"


def prepared(source: Path, fingerprint: str, cache: Path) -> Path:
    """The graph at ``source`` optimized for this machine, its pre-packed weights in an external
    file, under ``cache`` (built once: the first process builds it under a lock while the others
    wait, then all map it). Raises OSError or a runtime error when it cannot be built."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{source.stem}-{_machine_key(source, fingerprint)}"
    ready = target / "model.onnx"
    if ready.exists():
        return ready
    with open(cache / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if ready.exists():  # built by another pool meanwhile
            return ready
        building = cache / f"{target.name}.building"
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir()
        opts = session_options(1)
        opts.optimized_model_filepath = str(building / "model.onnx")
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "model.onnx.data")
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "4096")
        opts.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
        log.info("preparing %s for this machine in %s", source.name, target)
        ort.InferenceSession(str(source), opts, providers=CPU)
        building.rename(target)
    return ready


def shared_weights(path: Path, fingerprint: str, cache: Path | None, providers: list[str]) -> Path:
    """The graph to load for ``path``: its prepared copy under ``cache`` on the CPU provider,
    else ``path`` itself (no cache, another provider, or a cache that cannot be written)."""
    if cache is None or providers != CPU:
        return path
    try:
        return prepared(path, fingerprint, cache)
    except Exception:  # a full disk must not stop the pool: it only costs memory
        log.exception("could not prepare shared weights in %s; loading a private copy", cache)
        return path


def session(path: Path, threads: int, providers: list[str] | None = None) -> ort.InferenceSession:
    """An inference session on ``threads`` intra-op threads (0: every usable core)."""
    return ort.InferenceSession(str(path), session_options(threads or usable_cores()), providers=providers or CPU)

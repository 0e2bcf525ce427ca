"""ONNX Runtime session for a decoder exported with KV-cache inputs and outputs.

One graph serves prefill and decode: ``input_ids`` [B, N], ``attention_mask`` [B, P+N],
``position_ids`` [B, N], ``past_key_values.{i}.key|value`` [B, H, P, D] in; ``logits``
[B, 1, V] (the last position only) and ``present.{i}.key|value`` [B, H, P+N, D] out.

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

import numpy as np
import onnxruntime as ort

from switchboard import paths
from switchboard.artifact.manifest import Manifest
from switchboard.engine.sizing import MANY_THREADS_FROM_BYTES

log = logging.getLogger(__name__)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def auto_threads(model_bytes: int) -> int:
    return usable_cores() if model_bytes >= MANY_THREADS_FROM_BYTES else 1


def session_options(threads: int) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Several sessions share the cores (two pools, perf tools): spinning threads would burn
    # the cores the other sessions need.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
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
    """The engine's ``weights_cache`` parameter as a directory; None for 'off'."""
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
        opts.log_severity_level = 3  # the warning that the graph is for this machine only: it is
        log.info("preparing %s for this machine in %s", source.name, target)
        ort.InferenceSession(str(source), opts, providers=["CPUExecutionProvider"])
        building.rename(target)
    return ready


class OnnxDecoder:
    def __init__(
        self,
        directory: Path,
        manifest: Manifest,
        precision: str = "fp32",
        threads: int = 2,
        providers: list[str] | None = None,
        weights_cache: Path | None = None,
    ):
        """``weights_cache``: where the shared pre-packed copy of the weights lives (``prepared``);
        None loads the graph as it is, with a private pre-packed copy."""
        self.manifest = manifest
        variant = manifest.variant(precision)
        path = Path(directory) / variant["file"]
        providers = providers or ["CPUExecutionProvider"]
        if weights_cache is not None and providers == ["CPUExecutionProvider"]:
            try:
                path = prepared(path, variant.get("fingerprint", precision), weights_cache)
            except Exception:  # a full disk must not stop the pool: it only costs memory
                log.exception("could not prepare shared weights in %s; loading a private copy", weights_cache)
        self.path = path
        self.session = ort.InferenceSession(str(path), session_options(threads), providers=providers)
        self.dtype = np.dtype(manifest.kv_dtype)
        n = manifest.num_layers
        self._past_names = [(f"past_key_values.{i}.key", f"past_key_values.{i}.value") for i in range(n)]
        self._outputs = ["logits"] + [name for i in range(n) for name in (f"present.{i}.key", f"present.{i}.value")]

    def empty_past(self, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        shape = (batch, self.manifest.num_kv_heads, 0, self.manifest.head_dim)
        return [(np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)) for _ in self._past_names]

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[tuple[np.ndarray, np.ndarray]],
    ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        feed = {
            "input_ids": input_ids.astype(np.int64, copy=False),
            "attention_mask": attention_mask.astype(np.int64, copy=False),
            "position_ids": position_ids.astype(np.int64, copy=False),
        }
        for (kname, vname), (k, v) in zip(self._past_names, past):
            feed[kname], feed[vname] = k, v
        out = self.session.run(self._outputs, feed)
        present = [(out[1 + 2 * i], out[2 + 2 * i]) for i in range(len(self._past_names))]
        return out[0], present

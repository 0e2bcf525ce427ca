"""TensorRT engines from the exported ONNX: ``python -m switchboard.export.tensorrt``.

TensorRT 10/11 style: a strongly typed network, so precision comes from the graph itself:
FP16 from an FP16 copy of the graph (I/O kept FP32), INT8 from the static Q/DQ graph that
``switchboard.export`` calibrated (no deprecated INT8 calibrators). One engine, so one copy
of the weights on the GPU, with an optimization profile per routing pool whose shape ranges
match that pool (batch, prompt length, context), in ``POOLS`` order: Triton's TensorRT backend
runs each request on the profile that fits its shapes best. A timing cache makes rebuilds fast;
the engine's fingerprint (plan hash, TensorRT version, GPU) goes into the manifest.
``python -m switchboard.repository.render --target ngc-tensorrt`` then renders a repository that
serves it with Triton's ``tensorrt_plan`` backend as ``decoder``. Building needs an NVIDIA GPU
and the ``tensorrt`` package.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from switchboard.artifact.manifest import Manifest
from switchboard.repository.models import POOLS, Pool

log = logging.getLogger("switchboard.export.tensorrt")


@dataclass(frozen=True)
class Profile:
    """min / opt / max shape of every input."""

    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


def pool_profile(pool: Pool, manifest: Manifest) -> Profile:
    """Shapes the pool's engine feeds: prefills of up to ``max_prompt`` new tokens and one-token
    decode steps, for up to ``engine_batch`` sequences, within the context window."""
    b, ctx = pool.engine_batch, manifest.context_window
    new_max = min(pool.max_prompt, ctx)
    opt_b, opt_past = max(1, b // 2), min(ctx - 1, 2 * pool.max_prompt if pool.name == "short" else ctx // 2)
    h, d = manifest.num_kv_heads, manifest.head_dim
    shapes = {
        "input_ids": ((1, 1), (opt_b, 1), (b, new_max)),
        "position_ids": ((1, 1), (opt_b, 1), (b, new_max)),
        "attention_mask": ((1, 1), (opt_b, opt_past + 1), (b, ctx)),
    }
    for i in range(manifest.num_layers):
        for kind in ("key", "value"):
            shapes[f"past_key_values.{i}.{kind}"] = ((1, h, 0, d), (opt_b, h, opt_past, d), (b, h, ctx - 1, d))
    return Profile(shapes)


def fp16_graph(src: Path, dst: Path) -> Path:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(model, str(dst), save_as_external_data=dst.stat().st_size > (1 << 30) if dst.exists() else False)
    return dst


PLAN = "model.plan"


def build_engine(onnx_path: Path, plan_path: Path, profiles: list[Profile], timing_cache: Path) -> dict:
    import tensorrt as trt  # noqa: PLC0415  (optional; only on GPU machines)

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise SystemExit(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.exists() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    for profile in profiles:  # profile i serves POOLS[i]
        opt = builder.create_optimization_profile()
        for name, (lo, mid, hi) in profile.shapes.items():
            opt.set_shape(name, lo, mid, hi)
        config.add_optimization_profile(opt)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise SystemExit(f"TensorRT failed to build {plan_path.name}")
    plan_path.write_bytes(bytes(serialized))
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))
    return {
        "file": plan_path.name,
        "sha256": hashlib.sha256(plan_path.read_bytes()).hexdigest(),
        "tensorrt": trt.__version__,
        "profiles": [{k: list(map(list, v)) for k, v in p.shapes.items()} for p in profiles],
    }


def gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.export.tensorrt", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifacts", type=Path, required=True, help="directory written by switchboard.export")
    p.add_argument(
        "--precision", default="fp16", help="fp16, or an exported static INT8 variant (int8-percentile, ...)"
    )
    p.add_argument("--timing-cache", type=Path, default=Path("build/trt/timing.cache"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        import tensorrt  # noqa: F401, PLC0415
    except ImportError:
        raise SystemExit(
            "TensorRT is not installed here (pip install tensorrt on a machine with an NVIDIA GPU)"
        ) from None
    gpu = gpu_name()
    if gpu is None:
        raise SystemExit("no NVIDIA GPU: TensorRT builds engines for the GPU it runs on")
    manifest = Manifest.load(args.artifacts)
    if args.precision == "fp16":
        graph = fp16_graph(args.artifacts / "model.onnx", args.artifacts / "model.fp16.onnx")
    else:
        variant = manifest.variant(args.precision)
        if args.precision == "int8-dynamic":
            raise SystemExit("int8-dynamic has no Q/DQ nodes; TensorRT needs a static variant (int8-percentile, ...)")
        graph = args.artifacts / variant["file"]
    plan = args.artifacts / PLAN
    log.info("building %s (%s) on %s, profiles: %s", plan.name, args.precision, gpu, ", ".join(p.name for p in POOLS))
    info = build_engine(graph, plan, [pool_profile(pool, manifest) for pool in POOLS], args.timing_cache)
    info["fingerprint"] = hashlib.sha256(f"{info['sha256']}:{info['tensorrt']}:{gpu}".encode()).hexdigest()[:24]
    info["gpu"], info["precision"] = gpu, args.precision
    info["profile_of_pool"] = {pool.name: i for i, pool in enumerate(POOLS)}
    data = json.loads((args.artifacts / "manifest.json").read_text())
    data.setdefault("source", {})["tensorrt_engine"] = info
    (args.artifacts / "manifest.json").write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    log.info("engine: %s", plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())

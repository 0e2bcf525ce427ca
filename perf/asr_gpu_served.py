"""The asr pool served by tritonserver on a GPU machine without one installed:
``python -m perf.asr_gpu_served``.

``asr_gpu`` measures the pool in process, because the GPU machines this project is lent have a
Python with PyTorch but no tritonserver, and the nvidia-pytriton wheel is more than a lease
carries. What serving needs of that wheel (tritonserver, its libraries, the Python backend and
the stub for the GPU machine's Python) packs into about 24 MB:

- ``python -m tools.gpu_pack server`` (here) writes ``tritonserver.tar.xz`` from this
  environment's nvidia-pytriton;
- ``run`` (there) unpacks it (``SWITCHBOARD_TRITONSERVER``: ``install_backend``), installs each
  model's recognizer into a repository of its own (``asr`` as model_repository ships it, its
  asr.json naming the checkpoint, with ``runtime: torch`` on the GPU: float16, CUDA graphs,
  fitted windows), starts tritonserver with ``launch.Stack`` as the tests do and measures
  1 caller against 8 over gRPC with the SDK's async client (``asr_served.AsyncCaller``), the
  closed loop ``asr_bench`` runs on the CPU, ``--rounds`` times in turns.

The models and clips come from a ``tools.gpu_pack asr`` folder (``--pack``); the whisper-small
shape's transcripts are capped at 12 tokens as in ``asr_gpu`` (asr.json's budget, which the
torch runtime keeps). Writes ``results.json`` and ``summary.md`` to ``--out``, and each server's
log under ``--out``/run; ``docs/benchmarks.md`` keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

from perf import asr_load
from perf.gpu_machine import (
    MODELS,
    SERVED_ENV,
    SERVER_TARBALL,
    add_settings_argument,
    asr_repository,
    checkpoint_of,
    clips_of,
    gpu_name,
    library_path,
    parse_settings,
    server_env,
    unpack_server,
)
from perf.stats import ratio
from switchboard import paths
from switchboard.ops.install_backend import server_binary


def measure(url: str, clips: list, callers: int, requests: int) -> dict:
    """One closed loop of ``callers`` over one gRPC channel; the answers' mean batch size."""
    from perf.asr_served import AsyncCaller

    with AsyncCaller(url) as call:
        samples = asr_load.closed_loop(call, clips, callers, requests, warmup=2 * callers)
    row = asr_load.throughput(samples)
    sizes = [s.extra.get("batch_size") for s in samples if s.ok and s.extra.get("batch_size")]
    row["mean_batch"] = float(np.mean(sizes)) if sizes else float("nan")
    row["errors"] = asr_load.error_rates(samples, clips)
    return row


def run(
    pack_dir: Path,
    server: Path,
    out: Path,
    work: Path,
    models: list[str],
    requests: dict,
    rounds: int,
    source: Path,
    settings: dict[str, str] = SERVED_ENV,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    device = settings.get("SWITCHBOARD_DEVICE", "cuda")
    results = {
        "device": device,
        "gpu": gpu_name(device),
        "requests": requests,
        "env": settings,
        "rows": [],
        "load_s": {},
    }
    server_at = {  # for this run only (install_backend; the server's environment)
        "SWITCHBOARD_TRITONSERVER": str(unpack_server(server / SERVER_TARBALL, work)),
        "LD_LIBRARY_PATH": library_path(),
    }
    with mock.patch.dict(os.environ, server_at):
        results["server"] = str(server_binary())
        for name in models:
            served(name, pack_dir, out, work, requests, rounds, source, settings, results)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "summary.md").write_text(summary(results))
    print(summary(results), flush=True)
    return results


def served(
    name: str,
    pack_dir: Path,
    out: Path,
    work: Path,
    requests: dict,
    rounds: int,
    source: Path,
    settings: dict[str, str],
    results: dict,
) -> None:
    """``name`` served by a tritonserver of its own, measured ``rounds`` times; rows to ``results``."""
    from switchboard.ops.launch import Ports, Stack

    checkpoint = checkpoint_of(name, pack_dir, work)
    clips = clips_of(MODELS[name][0], pack_dir)
    repo = asr_repository(name, checkpoint, work, source)
    run_dir, backends = out / "run" / name, work / "backends"
    stack = Stack(Ports.free(), repository=repo, run_dir=run_dir, backends=backends, env=server_env(settings))
    try:
        started = time.monotonic()
        stack.start_triton(timeout=600)  # a failure names the server's log, under out/run
        results["load_s"][name] = round(time.monotonic() - started, 1)
        print(f"{name}: tritonserver ready in {results['load_s'][name]:.0f} s", flush=True)
        for turn in range(1, rounds + 1):
            for callers in (1, 8):
                t0 = time.monotonic()
                row = measure(stack.grpc_url, clips, callers, requests[callers])
                row |= {"model": name, "callers": callers, "round": turn}
                results["rows"].append(row)
                print(
                    f"{name:12s} round {turn} {callers} caller(s) {row['audio_s_per_s']:8.1f} audio s/s  "
                    f"p50 {row['latency_p50_s'] * 1000:6.0f} ms  batch {row['mean_batch']:.1f}  "
                    f"failed {row['failed']}  {row['errors']}  ({time.monotonic() - t0:.0f} s)",
                    flush=True,
                )
                (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")  # so far
    finally:
        stack.stop_triton()


def summary(results: dict) -> str:
    lines = [
        f"Served by tritonserver (gRPC, the SDK's async client), runtime torch on {results['device']} "
        f"({results['gpu']}). Audio seconds per wall second, each round's 1 caller then 8 callers.",
        "",
        "| model | round | 1 caller | 8 callers | 8 / 1 | P50 1 / 8 callers | mean batch, 8 callers |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = {(r["model"], r["round"], r["callers"]): r for r in results["rows"]}
    for model, turn in dict.fromkeys((m, t) for m, t, _ in rows):
        one, eight = rows.get((model, turn, 1)), rows.get((model, turn, 8))
        if one is None or eight is None:
            continue
        lines.append(
            f"| {model} | {turn} | {one['audio_s_per_s']:.1f} | {eight['audio_s_per_s']:.1f} | "
            f"{ratio(eight['audio_s_per_s'], one['audio_s_per_s']):.2f}x | "
            f"{one['latency_p50_s'] * 1000:.0f} / {eight['latency_p50_s'] * 1000:.0f} ms | {eight['mean_batch']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.asr_gpu_served", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    b = sub.add_parser("run", help="serve each model and measure 1 caller against 8 (on the GPU machine)")
    b.add_argument("--pack", type=Path, required=True, help="a folder `tools.gpu_pack asr` wrote (checkpoints, clips)")
    b.add_argument(
        "--server", type=Path, default=paths.BUILD / "gpu-served", help=f"the folder holding {SERVER_TARBALL}"
    )
    b.add_argument("--out", type=Path, default=paths.BUILD / "bench" / "asr-gpu-served")
    b.add_argument("--work", type=Path, default=Path("/tmp/switchboard-asr-gpu"), help="the server, repositories there")
    b.add_argument("--models", default="default,small-shape", help=f"comma-separated, of {', '.join(MODELS)}")
    b.add_argument("--requests", default="160,640", help="requests measured with 1 caller, with 8")
    b.add_argument("--rounds", type=int, default=2, help="1 caller then 8, this many times")
    b.add_argument(
        "--source", type=Path, default=paths.MODEL_REPOSITORY, help="the model repository asr's config comes from"
    )
    add_settings_argument(
        b, "an asr parameter for the server, over the GPU's (e.g. SWITCHBOARD_DEVICE=cpu to try it here)"
    )
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        p.error(f"--models: unknown {', '.join(unknown)} (known: {', '.join(MODELS)})")
    settings = parse_settings(p, args.set)
    one, eight = (int(x) for x in args.requests.split(","))
    run(args.pack, args.server, args.out, args.work, models, {1: one, 8: eight}, args.rounds, args.source, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())

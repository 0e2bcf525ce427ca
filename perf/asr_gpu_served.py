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
import dataclasses
import json
import os
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

from perf import asr_gpu, asr_load
from switchboard import paths
from switchboard.ops.install_backend import server_binary

TARBALL = "tritonserver.tar.xz"
SERVED_ENV = {  # asr/config.pbtxt's parameters for a GPU (docs/configuration-reference.md)
    "SWITCHBOARD_RUNTIME": "torch",
    "SWITCHBOARD_DEVICE": "cuda",
    "SWITCHBOARD_TORCH_DTYPE": "float16",
    "SWITCHBOARD_TORCH_STEPS": "graphs",
}


def unpack(tarball: Path, work: Path) -> Path:
    """The server unpacked under ``work`` (once), laid out as ``install_backend`` finds it when
    ``SWITCHBOARD_TRITONSERVER`` names the folder returned."""
    root = work / "tritonserver"
    server = root / "pytriton" / "tritonserver"
    if not (server / "bin" / "tritonserver").is_file():
        with tarfile.open(tarball) as tar:
            safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}  # from Python 3.11.4
            tar.extractall(root, **safe)
    return root


def repository(name: str, checkpoint: Path, work: Path, source: Path) -> Path:
    """A model repository holding ``asr`` alone, its recognizer ``checkpoint`` (served by the
    torch runtime: asr.json names it, no graphs exported), ``name``'s cap on transcripts."""
    from tokenizers import Tokenizer

    from perf.asr_served import capped_manifest
    from switchboard.asr.checkpoint import copy_tokenizer, describe
    from switchboard.asr.runtime import AsrManifest

    repo = work / "repos" / name
    version = repo / "asr" / "1"
    version.mkdir(parents=True, exist_ok=True)
    (repo / "asr" / "config.pbtxt").write_bytes((source / "asr" / "config.pbtxt").read_bytes())
    (version / "model.py").write_bytes((source / "asr" / "1" / "model.py").read_bytes())
    with tempfile.TemporaryDirectory() as tmp:
        manifest = describe(checkpoint, Tokenizer.from_file(str(copy_tokenizer(checkpoint, Path(tmp)))))
    manifest = dataclasses.replace(manifest, source=str(checkpoint.resolve()))
    cap = asr_gpu.MODELS[name][1]
    if cap is not None:  # as asr_bench installs a random-weight checkpoint
        manifest = AsrManifest(**capped_manifest(dataclasses.asdict(manifest), cap))
    manifest.save(version)
    return repo


def server_env(settings: dict[str, str]) -> dict[str, str]:
    """``settings`` and what the Python backend's stub needs to run this Python's packages:
    its home and every directory on its path."""
    env = dict(settings)
    env["PYTHONHOME"] = sys.base_prefix
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())
    return env


def library_path() -> str:
    """LD_LIBRARY_PATH with this Python's library directory first: where the stub finds libpython."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    return os.pathsep.join(filter(None, (libdir, os.environ.get("LD_LIBRARY_PATH"))))


def add_settings_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """``--set SWITCHBOARD_KEY=VALUE``, any number of times (``parse_settings`` reads them)."""
    parser.add_argument("--set", action="append", default=[], metavar="SWITCHBOARD_KEY=VALUE", help=help)


def parse_settings(p: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    """``SERVED_ENV`` with each ``--set SWITCHBOARD_KEY=VALUE`` over it."""
    settings = dict(SERVED_ENV)
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.startswith("SWITCHBOARD_"):
            p.error(f"--set {item!r}: expected SWITCHBOARD_KEY=VALUE")
        settings[key] = value
    return settings


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
    results = {"device": device, "gpu": _gpu(device), "requests": requests, "env": settings, "rows": [], "load_s": {}}
    server_at = {  # for this run only (install_backend; the server's environment)
        "SWITCHBOARD_TRITONSERVER": str(unpack(server / TARBALL, work)),
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


def _gpu(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else "none"


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

    checkpoint = asr_gpu.checkpoint_of(name, pack_dir, work)
    clips = asr_gpu.clips_of(asr_gpu.MODELS[name][0], pack_dir)
    repo = repository(name, checkpoint, work, source)
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
            f"{asr_load.ratio(eight['audio_s_per_s'], one['audio_s_per_s']):.2f}x | "
            f"{one['latency_p50_s'] * 1000:.0f} / {eight['latency_p50_s'] * 1000:.0f} ms | {eight['mean_batch']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.asr_gpu_served", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    b = sub.add_parser("run", help="serve each model and measure 1 caller against 8 (on the GPU machine)")
    b.add_argument("--pack", type=Path, required=True, help="a folder `tools.gpu_pack asr` wrote (checkpoints, clips)")
    b.add_argument("--server", type=Path, default=paths.BUILD / "gpu-served", help=f"the folder holding {TARBALL}")
    b.add_argument("--out", type=Path, default=paths.BUILD / "bench" / "asr-gpu-served")
    b.add_argument("--work", type=Path, default=Path("/tmp/switchboard-asr-gpu"), help="the server, repositories there")
    b.add_argument("--models", default="default,small-shape", help=f"comma-separated, of {', '.join(asr_gpu.MODELS)}")
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
    unknown = [m for m in models if m not in asr_gpu.MODELS]
    if unknown:
        p.error(f"--models: unknown {', '.join(unknown)} (known: {', '.join(asr_gpu.MODELS)})")
    settings = parse_settings(p, args.set)
    one, eight = (int(x) for x in args.requests.split(","))
    run(args.pack, args.server, args.out, args.work, models, {1: one, 8: eight}, args.rounds, args.source, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Voice to first answer token, served by tritonserver on a GPU machine without one installed:
``python -m perf.voice_gpu_served``.

The whole voice path of ``asr_bench``'s third part (``voice_chat``: asr, then a ``chat`` turn on
the engines, sessions in Redis), on a machine that has a GPU and a Python with PyTorch but
neither tritonserver nor redis-server. ``python -m tools.gpu_pack server`` packs the server and
``python -m tools.gpu_pack voice`` the rest (about 10 MB):

- ``tools.gpu_pack voice`` (here) writes ``voice.tar.xz``: the chat model's version files (manifest, tokenizer,
  template, FAQ; no graph: the torch runtime loads the checkpoint), its Hugging Face
  checkpoint in float16 (what the engine's ``torch:cuda`` runtime loads it as), redis-server
  with the libraries it links beside the C library, and the 3 s question ``asr_bench`` asks;
- ``run`` (there) unpacks both, writes a repository of ``chat``, ``engine_short``,
  ``engine_long``, ``voice_chat`` and ``asr`` as model_repository ships them, with the engines on
  ``runtime: torch:<device>`` and the recognizer (from a ``tools.gpu_pack asr`` folder) on the torch
  runtime with ``asr_gpu_served``'s settings, starts redis-server and tritonserver with
  ``launch.Stack`` and measures 1 caller against 8 asking the question over gRPC
  (``asr_served.VoiceCaller``): when the transcript came and when the answer's first token did.

Writes ``results.json`` and ``summary.md`` to ``--out``, the servers' logs under ``--out``/run;
``docs/voice.md`` keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from unittest import mock

from perf import asr_load
from perf.gpu_machine import (
    MODELS,
    SERVED_ENV,
    SERVER_TARBALL,
    VOICE_TARBALL,
    add_settings_argument,
    asr_repository,
    checkpoint_of,
    gpu_name,
    library_path,
    parse_settings,
    server_env,
    unpack_server,
    unpack_voice,
)
from switchboard import paths
from switchboard.repository.models import CHAT, POOL_MODELS, VOICE_CHAT
from switchboard.repository.versions import with_parameters

CHAT_MODELS = (CHAT, *POOL_MODELS, VOICE_CHAT)


def repository(unpacked: Path, recognizer: Path, work: Path, source: Path, settings: dict[str, str], name: str) -> Path:
    """``chat``, the engines and ``voice_chat`` from ``source`` with the packed chat model,
    the engines on the torch runtime (``settings``' device), and ``asr`` from
    ``gpu_machine.asr_repository`` with ``settings`` as its parameters."""
    repo = work / "repos" / "voice"
    if repo.exists():
        shutil.rmtree(repo)
    asr = asr_repository(name, recognizer, work / "voice-asr", source)
    shutil.copytree(asr / "asr", repo / "asr")
    config = repo / "asr" / "config.pbtxt"
    config.write_text(with_parameters(config.read_text(), parameters(settings), config))
    device = settings.get("SWITCHBOARD_DEVICE", "cuda")
    for model in CHAT_MODELS:
        version = repo / model / "1"
        version.mkdir(parents=True)
        (version / "model.py").write_bytes((source / model / "1" / "model.py").read_bytes())
        values = (
            {"runtime": f"torch:{device}", "checkpoint": str(unpacked / "checkpoint")} if model in POOL_MODELS else {}
        )
        if model != "voice_chat":
            for f in (unpacked / "chat").iterdir():
                if model == "chat" or f.name != "faq.jsonl":
                    shutil.copy2(f, version / f.name)
        text = (source / model / "config.pbtxt").read_text()
        (repo / model / "config.pbtxt").write_text(with_parameters(text, values, source / model / "config.pbtxt"))
    return repo


def parameters(settings: dict[str, str]) -> dict[str, str]:
    """``SWITCHBOARD_KEY=VALUE`` settings as asr's parameters (key=value): written into its
    config, since the server's environment would set them for every model."""
    return {key.removeprefix("SWITCHBOARD_").lower(): value for key, value in settings.items()}


def run(
    pack_dir: Path,
    server: Path,
    out: Path,
    work: Path,
    recognizer: str,
    requests: dict,
    rounds: int,
    source: Path,
    settings: dict[str, str] = SERVED_ENV,
) -> dict:
    from perf.asr_served import VoiceCaller, voice_row
    from switchboard.ops.launch import Ports, Stack

    out.mkdir(parents=True, exist_ok=True)
    unpacked = unpack_voice(server / VOICE_TARBALL, work)
    question = asr_load.load_clips(unpacked / "question")
    checkpoint = checkpoint_of(recognizer, pack_dir, work)
    repo = repository(unpacked, checkpoint, work, source, settings, recognizer)
    device = settings.get("SWITCHBOARD_DEVICE", "cuda")
    results = {"device": device, "gpu": gpu_name(device), "recognizer": recognizer, "env": settings}
    results |= {"requests": requests, "rows": []}
    here = {  # for this run only: the packed servers first
        "SWITCHBOARD_TRITONSERVER": str(unpack_server(server / SERVER_TARBALL, work)),
        "LD_LIBRARY_PATH": library_path(),
        "PATH": os.pathsep.join((str(unpacked / "redis"), os.environ.get("PATH", ""))),
    }
    with mock.patch.dict(os.environ, here):
        stack = Stack(
            Ports.free(),
            repository=repo,
            run_dir=out / "run",
            backends=work / "backends",
            env=server_env({}),
        )
        try:
            started = time.monotonic()
            stack.start_redis()
            results["redis"] = shutil.which("redis-server")
            stack.start_triton(timeout=600)
            results["load_s"] = round(time.monotonic() - started, 1)
            print(f"voice: redis-server and tritonserver ready in {results['load_s']:.0f} s", flush=True)
            for turn in range(1, rounds + 1):
                for callers in (1, 8):
                    with VoiceCaller(stack.grpc_url) as call:
                        samples = asr_load.closed_loop(call, question, callers, requests[callers], warmup=callers)
                    row = voice_row(recognizer, callers, samples) | {"round": turn}
                    if row["failed"]:
                        row["error"] = next(s.error for s in samples if not s.ok)
                    results["rows"].append(row)
                    print(
                        f"voice round {turn} {callers} caller(s): heard P50 {row['heard_p50_s'] * 1000:.0f} ms, "
                        f"first token P50/P99 {row['first_token_p50_s'] * 1000:.0f}/"
                        f"{row['first_token_p99_s'] * 1000:.0f} ms, {row['answered']}/{row['requests']} answered "
                        f"{row['transcripts'][:2]}",
                        flush=True,
                    )
                    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")  # so far
        finally:
            stack.stop()
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "summary.md").write_text(summary(results))
    print(summary(results), flush=True)
    return results


def summary(results: dict) -> str:
    lines = [
        f"voice_chat served by tritonserver (gRPC, the SDK's async client), a 3 s question, recognizer "
        f"{results['recognizer']}, asr and engines on torch:{results['device']} ({results['gpu']}).",
        "",
        "| round | callers | heard P50 | first token P50 | first token P99 | asr P50 | answered |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['round']} | {r['concurrency']} | {r['heard_p50_s'] * 1000:.0f} ms | "
            f"{r['first_token_p50_s'] * 1000:.0f} ms | {r['first_token_p99_s'] * 1000:.0f} ms | "
            f"{r['asr_ms_p50']:.0f} ms | {r['answered']}/{r['requests']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.voice_gpu_served", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    b = sub.add_parser("run", help="serve the voice path and measure 1 caller against 8 (on the GPU machine)")
    b.add_argument("--pack", type=Path, required=True, help="a folder `tools.gpu_pack asr` wrote (the recognizer)")
    b.add_argument(
        "--server",
        type=Path,
        default=paths.BUILD / "gpu-served",
        help=f"the folder holding {VOICE_TARBALL} and {SERVER_TARBALL} (tools.gpu_pack voice, server)",
    )
    b.add_argument(
        "--out", type=Path, default=paths.BUILD / "bench" / "voice-gpu-served", help="results, summary, logs"
    )
    b.add_argument("--work", type=Path, default=Path("/tmp/switchboard-voice-gpu"), help="unpacked parts go there")
    b.add_argument(
        "--recognizer",
        default="default",
        choices=[m for m in MODELS if m != "small-shape"],
        help="the pack's recognizer asr serves (the random-weight shape never ends a transcript)",
    )
    b.add_argument("--requests", default="10,32", help="questions asked by 1 caller, by 8")
    b.add_argument("--rounds", type=int, default=2, help="1 caller then 8, this many times")
    b.add_argument("--source", type=Path, default=paths.MODEL_REPOSITORY, help="where the models' configs come from")
    add_settings_argument(
        b, "an asr parameter over the GPU's; SWITCHBOARD_DEVICE also moves the engines (cpu to try it here)"
    )
    args = p.parse_args(argv)
    settings = parse_settings(p, args.set)
    one, eight = (int(x) for x in args.requests.split(","))
    run(
        args.pack,
        args.server,
        args.out,
        args.work,
        args.recognizer,
        {1: one, 8: eight},
        args.rounds,
        args.source,
        settings,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

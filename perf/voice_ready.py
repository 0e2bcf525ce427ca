"""How long after chat the voice channel is ready: ``python -m perf.voice_ready``.

Runs ``make serve`` as a user does, on free ports and a private copy of the model repository
(the checkout's own installed models are left alone), and times, from the moment ``make serve``
returns (text chat is ready: every model loaded, the gateway listening), each stage of the
recognizer joining in the background (``switchboard/ops/voice.py``: converting, exporting,
installing, loading) until ``asr`` is loaded, by polling ``<run dir>/voice.json``. Then
``make stop``.

``--fresh`` deletes the recognizer's build outputs first (``build/asr-whisper-base`` and its
export in ``build/artifacts/asr/``), as on a fresh clone, so the figure includes the conversion,
the export and the INT8 accuracy gate; the chat model's build is left as it is (its time is
``make serve``'s own). Writes ``results.json`` and ``summary.md`` to ``--out``; exits 1 when the
voice channel failed or did not come up within ``--timeout-s``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from perf.markdown import table, write_summary
from switchboard import paths
from switchboard.ops.launch import free_ports

POLL_S = 0.5
RECOGNIZER = "asr-whisper-base"


def private_repository(out: Path) -> Path:
    """The model repository's configs and glue (every model's config.pbtxt and model.py), no
    installed artifacts: what a fresh clone's repository holds before ``make export``."""
    dst = out / "model_repository"
    shutil.rmtree(dst, ignore_errors=True)

    def ignore(folder: str, names: list[str]) -> list[str]:
        # under a version folder (model/1/) only the glue is kept
        return [n for n in names if Path(folder).name.isdigit() and n != "model.py"]

    shutil.copytree(paths.MODEL_REPOSITORY, dst, ignore=ignore)
    return dst


def poll_stages(state: Path, timeout_s: float, t0: float) -> list[dict]:
    """Each stage voice.json goes through, with the seconds since ``t0`` it was first seen,
    until ``ready`` or ``failed`` (or the timeout)."""
    stages: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            now = json.loads(state.read_text())
        except (OSError, ValueError):
            now = None
        if now and (not stages or stages[-1]["stage"] != now["stage"]):
            stages.append({"stage": now["stage"], "after_chat_s": round(time.monotonic() - t0, 1)} | now)
            print(f"[voice-ready] +{stages[-1]['after_chat_s']:.0f} s: {now['stage']}", flush=True)
            if now["stage"] in ("ready", "failed"):
                return stages
        time.sleep(POLL_S)
    stages.append({"stage": "timeout", "after_chat_s": round(time.monotonic() - t0, 1)})
    return stages


def run(out: Path, fresh: bool, timeout_s: float) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    if fresh:
        for folder in (paths.BUILD / RECOGNIZER, paths.ARTIFACTS / "asr" / RECOGNIZER):
            shutil.rmtree(folder, ignore_errors=True)
    repo = private_repository(out)
    http, grpc, metrics, redis, gateway = free_ports(5)
    make = ["make", f"REPO={repo}", f"HTTP_PORT={http}", f"GRPC_PORT={grpc}", f"METRICS_PORT={metrics}"]
    make += [f"REDIS_PORT={redis}", f"GATEWAY_PORT={gateway}"]
    env = {k: v for k, v in os.environ.items() if k != "ASR_MODEL"}  # the default recognizer
    state = paths.RUN / "voice.json"
    state.unlink(missing_ok=True)
    log = out / "serve.log"
    started = time.monotonic()
    try:
        with open(log, "wb") as f:
            serve = subprocess.run([*make, "serve"], cwd=paths.ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        chat_ready = time.monotonic()
        if serve.returncode != 0:
            raise SystemExit(f"make serve failed (exit {serve.returncode}): {log}")
        print(f"[voice-ready] chat ready {chat_ready - started:.0f} s after `make serve` began", flush=True)
        stages = poll_stages(state, timeout_s, chat_ready)
    finally:
        with open(log, "ab") as f:
            subprocess.run([*make, "stop"], cwd=paths.ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    return {
        "fresh": fresh,
        "make_serve_s": round(chat_ready - started, 1),
        "voice_after_chat_s": stages[-1]["after_chat_s"],
        "outcome": stages[-1]["stage"],
        "stages": stages,
        "load_avg": os.getloadavg(),
        "cpus": os.cpu_count(),
    }


def summary(r: dict) -> str:
    rows = [[s["stage"], f"{s['after_chat_s']:.0f} s"] for s in r["stages"]]
    head = (
        f"`make serve` returned (text chat ready) after {r['make_serve_s']:.0f} s"
        + (" with the recognizer's build outputs deleted first (`--fresh`)" if r["fresh"] else "")
        + f"; the voice channel: {r['outcome']} {r['voice_after_chat_s']:.0f} s after chat "
        f"({r['cpus']} CPUs, load average {r['load_avg'][0]:.2f} at the end)."
    )
    return head + "\n\n" + table(["stage of the recognizer joining", "seen, after chat was ready"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.voice_ready", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=paths.BUILD / "bench" / "voice-ready", help="where results go")
    p.add_argument("--fresh", action="store_true", help=f"delete build/{RECOGNIZER} and its export first")
    p.add_argument("--timeout-s", type=float, default=1200, help="how long to wait for the voice channel")
    args = p.parse_args(argv)
    results = run(args.out, args.fresh, args.timeout_s)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    write_summary(args.out / "summary.md", "Voice ready after chat", summary(results))
    return 0 if results["outcome"] == "ready" else 1


if __name__ == "__main__":
    sys.exit(main())

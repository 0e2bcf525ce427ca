"""Cold start to first answer, started as a Kubernetes pod starts: ``python -m perf.cold_start``.

Starts a private redis-server first (in a cluster Redis is its own pod, already up), then the
Switchboard container's command as deploy/k8s/switchboard.yaml gives it (``python -m
switchboard.ops.supervisor`` and its arguments, ports and directories replaced by free ones
here) and times, from that process' start: tritonserver ready (``/v2/health/ready``: every
model loaded), the supervisor's readiness (``/readyz``: its warm-up chat answered, when the
readiness probe would let traffic in), and a client's first chat sent then (its first text and
its end). When the repository has a recognizer installed (``asr``), a spoken question follows
through ``voice_chat`` (espeak-ng's voice, the recognizer's first language): the voice path's
first answer text, and what was heard. Then SIGTERM, as the kubelet stops a pod, and the time
until the process exited.
Memory: the proportional set size of tritonserver and its Python stubs after the first answer.
Each of ``--runs`` runs is a fresh process tree on fresh ports. A table (median last) goes to
``--out``/summary.md, the figures to summary.json; exits 1 if a run failed. What a cluster adds
(image pull, scheduling, container start, the probes' period) is not in these figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from perf.loadtools import pss_kib
from perf.markdown import table, write_summary
from switchboard import paths
from switchboard.client import ChatClient, Heard
from switchboard.ops.health_server import READINESS_PATH
from switchboard.ops.launch import Ports, Stack, children, free_port, loadable

POLL_S = 0.05


def container_args(manifest: Path = paths.K8S / "switchboard.yaml", container: str = "switchboard") -> list[str]:
    """The arguments the Switchboard Deployment passes to the image's entrypoint (the supervisor)."""
    for doc in yaml.safe_load_all(manifest.read_text()):
        if doc and doc.get("kind") == "Deployment":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c["name"] == container:
                    return [str(a) for a in c.get("args", [])]
    raise SystemExit(f"{manifest}: no Deployment with a container {container!r}")


def pod_command(ports: Ports, probe_port: int, redis_url: str, repository: Path, run_dir: Path) -> list[str]:
    """The container's command (the supervisor with the Deployment's arguments) on these ports."""
    args = container_args() + [
        f"--redis-url={redis_url}",
        f"--http-port={ports.http}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-port={ports.metrics}",
        f"--probe-port={probe_port}",
        "--probe-address=127.0.0.1",
        f"--repository={repository}",
        f"--run-dir={run_dir}",
    ]
    return [sys.executable, "-m", "switchboard.ops.supervisor", *args]


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def spoken_question(repository: Path, n: int) -> tuple[bytes, str] | None:
    """The ``n``-th held-out question in the installed recognizer's first language, spoken by
    espeak-ng's plain voice (WAV bytes, the text), or None when no recognizer is installed or
    espeak-ng is not (said once)."""
    if "asr" not in loadable(repository):
        return None
    if shutil.which("espeak-ng") is None:
        if n == 0:
            print("[cold-start] no voice chat: Debian's espeak-ng, which speaks the question, is not installed")
        return None
    from switchboard.asr.audio import encode_wav
    from switchboard.asr.runtime import AsrManifest
    from switchboard.data import speech

    languages = AsrManifest.load(repository / "asr" / "1").languages
    lang = "en" if "en" in languages else next(iter(languages))
    sentences = speech.heldout_sentences(lang)
    text, _ = sentences[n % len(sentences)]
    return encode_wav(speech.speak(text, lang, speech.home_voice(lang))), text


def first_voice_chat(url: str, wav: bytes, session_id: str, max_new_tokens: int, t0: float) -> dict:
    """One spoken question through ``voice_chat``: when its transcript and its first answer text
    came (seconds since ``t0``), the time to that text, and what was heard."""
    out: dict = {}
    sent = time.monotonic()
    for event in ChatClient(url, timeout_s=120).voice_chat(wav, session_id=session_id, max_new_tokens=max_new_tokens):
        if isinstance(event, Heard):
            out["voice_heard_s"] = time.monotonic() - t0
            out["heard"] = event.transcript
        elif isinstance(event, str):
            out.setdefault("voice_first_text_s", time.monotonic() - t0)
        else:
            out["voice_ttft_ms"] = (out.get("voice_first_text_s", time.monotonic() - t0) - (sent - t0)) * 1000
            out["voice_fallback"] = event.fallback
    return out


def one_run(
    repository: Path,
    run_dir: Path,
    question: str,
    max_new_tokens: int,
    timeout_s: float,
    spoken: tuple[bytes, str] | None = None,
) -> dict:
    ports, probe_port = Ports.free(), free_port()
    redis = Stack(ports, repository, run_dir)
    redis.start_redis()
    log_path = run_dir / "supervisor.log"
    out: dict = {}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        pod_command(ports, probe_port, redis.redis_url, repository, run_dir),
        stdout=open(log_path, "ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = t0 + timeout_s
        while "ready_s" not in out:
            if proc.poll() is not None:
                raise RuntimeError(f"the supervisor exited with {proc.returncode} (log: {log_path})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {timeout_s:.0f} s (log: {log_path})")
            now = time.monotonic() - t0
            if "triton_ready_s" not in out and _status(f"http://127.0.0.1:{ports.http}/v2/health/ready") == 200:
                out["triton_ready_s"] = now
            if _status(f"http://127.0.0.1:{probe_port}{READINESS_PATH}") == 200:
                out["ready_s"] = time.monotonic() - t0
                out.setdefault("triton_ready_s", out["ready_s"])
            time.sleep(POLL_S)
        sent = time.monotonic()
        for event in ChatClient(f"127.0.0.1:{ports.grpc}", timeout_s=60).chat(
            question, session_id=f"cold-start-{ports.grpc}", max_new_tokens=max_new_tokens
        ):
            if isinstance(event, str):
                out.setdefault("first_text_s", time.monotonic() - t0)
            else:
                out["answer_s"] = time.monotonic() - t0
                out["client_ttft_ms"] = (out.get("first_text_s", out["answer_s"]) - (sent - t0)) * 1000
                out["fallback"] = event.fallback
        if spoken is not None:
            out["spoken"] = spoken[1]
            url = f"127.0.0.1:{ports.grpc}"
            out |= first_voice_chat(url, spoken[0], f"cold-start-voice-{ports.grpc}", max_new_tokens, t0)
        state = json.loads((run_dir / "supervisor.json").read_text())
        pids = [state["tritonserver_pid"], *children(state["tritonserver_pid"]).values()]
        out["pss_mib"] = sum(pss_kib(pid) or 0 for pid in pids) / 1024
    finally:
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
            out["stop_s"] = time.monotonic() - stopping
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        redis.stop_redis()
    return out


COLUMNS = [
    ("triton_ready_s", "tritonserver ready"),
    ("ready_s", "/readyz 200 (warm-up answered)"),
    ("first_text_s", "first chat: first text"),
    ("answer_s", "first chat: answer"),
    ("client_ttft_ms", "first chat's time to first text"),
    ("voice_first_text_s", "first voice chat: first text"),
    ("voice_ttft_ms", "its time to first text"),
    ("stop_s", "SIGTERM to exit"),
    ("pss_mib", "memory (PSS)"),
]


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if key.endswith("_ms"):
        return f"{value:.0f} ms"
    if key.endswith("_mib"):
        return f"{value:.0f} MiB"
    return f"{value:.2f} s"


def summarize(runs: list[dict]) -> str:
    rows = [[str(i + 1), *(_cell(k, r.get(k)) for k, _ in COLUMNS)] for i, r in enumerate(runs)]
    if len(runs) > 1:
        medians = [statistics.median(v) if (v := [r[k] for r in runs if k in r]) else None for k, _ in COLUMNS]
        rows.append(["median", *(_cell(k, m) for (k, _), m in zip(COLUMNS, medians))])
    note = (
        "Seconds from the supervisor's start (the container's command) unless marked; the first chat is sent "
        "as /readyz turns 200, the first voice chat (a spoken question, when a recognizer is installed) after "
        "the chat's answer."
    )
    return table(["run", *(label for _, label in COLUMNS)], rows) + "\n\n" + note


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.cold_start", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="cold starts, one after the other (default 3)")
    p.add_argument("--repository", type=Path, default=paths.MODEL_REPOSITORY, help="model repository (make export)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="length of the first chat's answer (default 32)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="how long one start may take (default 300)")
    p.add_argument("--out", type=Path, default=paths.BUILD / "cold-start", help="summary.md and summary.json here")
    args = p.parse_args(argv)
    from switchboard.data.corpus import load, sample_questions

    questions = sample_questions(load(), args.runs, seed=7)
    spoken = [spoken_question(args.repository, i) for i in range(args.runs)]
    runs, failed = [], 0
    for i in range(args.runs):
        run_dir = args.out / f"run-{i + 1}"  # logs of this run
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        try:
            r = one_run(args.repository, run_dir, questions[i], args.max_new_tokens, args.timeout_s, spoken[i])
            if r.get("fallback"):
                r["error"] = "the first chat was answered from the FAQ"
            elif r.get("voice_fallback"):
                r["error"] = "the first voice chat was answered from the FAQ"
            elif spoken[i] is not None and not r.get("heard"):
                r["error"] = "the recognizer heard nothing in the spoken question"
        except Exception as e:
            r = {"error": str(e)}
        failed += "error" in r
        runs.append(r)
        shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
        print(f"[cold-start] run {i + 1}/{args.runs}: {json.dumps(shown)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(runs, indent=1))
    write_summary(
        args.out / "summary.md", "Cold start to first answer", summarize([r for r in runs if "error" not in r])
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

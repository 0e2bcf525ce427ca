"""The model's versions in the repository: what one installed version is, and which serve.

One version is a numbered folder of a pool model (``engine_short/2``): its manifest, the
precision it serves (``version.json``), its checksums. ``make export`` installs version 1
(``install.install_chat``); ``make rollout`` (switchboard/ops/rollout.py) installs the next ones
(``install.install_version``), each with a ``version.json`` saying which precision it serves and
where it came from. Before a version serves, a pool whose runtime reads the graph checks its
weights against the manifest's SHA-256 (``ModelVersion.verify``): a tampered or truncated file
fails the load, and the version already serving goes on. (``runtime: torch`` reads the
checkpoint its config names instead, and checks that checkpoint's shape against the manifest.)
The version's number is part of its fingerprint, so KV (blocks and conversations) is never
reused across versions, even when two versions hold the same weights.

Which versions serve is recorded in the configs (``Repository``): the pools' ``version_policy``,
and ``chat``'s ``stable_version``, ``canary_version`` and ``canary_share`` (which
switchboard/serving/canary.py reads). Every edit replaces a config atomically, so a server that restarts
mid-rollout loads a consistent state; installing version 1 again ends a rollout
(``Repository.reset``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from switchboard.artifact.manifest import Manifest, file_digest
from switchboard.repository.models import CHAT, POOL_MODELS

# -- one installed version ---------------------------------------------------------------------
VERSION_FILE = "version.json"


class ChecksumError(ValueError):
    """An artifact's bytes do not match its manifest."""


def variant_files(directory: Path, variant: dict) -> list[Path]:
    """The files a variant's ``weights_sha256`` covers: its graph and its external data."""
    graph = Path(directory) / variant["file"]
    return [graph, *sorted(Path(directory).glob(graph.name + ".data"))]


def verify_variant(directory: Path, manifest: Manifest, precision: str) -> None:
    """Raise ``ChecksumError`` unless the variant's files hash to the manifest's ``weights_sha256``
    (and its packed graph's, where it was exported packed too)."""
    variant = manifest.variant(precision)
    _verify_graph(directory, variant, precision)
    if "packed" in variant:
        _verify_graph(directory, variant["packed"], f"{precision} (packed)")


def _verify_graph(directory: Path, variant: dict, precision: str) -> None:
    want = variant.get("weights_sha256")
    if not want:
        raise ChecksumError(f"{directory}: the manifest has no weights_sha256 for {precision!r}; re-export it")
    files = variant_files(directory, variant)
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ChecksumError(f"{directory}: {', '.join(missing)} missing")
    got = file_digest(files)
    if got != want:
        names = ", ".join(f.name for f in files)
        raise ChecksumError(
            f"{directory}: the weights ({names}) do not match the manifest (sha256 {got[:16]}..., manifest "
            f"{want[:16]}...): "
            "refusing to serve a modified artifact"
        )


@dataclass(frozen=True)
class ModelVersion:
    directory: Path
    number: int
    manifest: Manifest
    precision: str

    @classmethod
    def load(cls, directory: Path, default_precision: str) -> ModelVersion:
        """The version in ``directory``; its precision from its ``version.json`` when it has one
        (a rollout may serve another variant of the same export), else ``default_precision``."""
        directory = Path(directory)
        if not directory.name.isdigit():
            raise ValueError(f"{directory}: a model version folder is named by its number")
        manifest = Manifest.load(directory)
        precision = default_precision
        info = read_version_info(directory)
        if "precision" in info:
            precision = info["precision"]
        manifest.variant(precision)  # raises, naming what the export has
        return cls(directory, int(directory.name), manifest, precision)

    @property
    def variant(self) -> dict:
        return self.manifest.variant(self.precision)

    @property
    def fingerprint(self) -> str:
        """What KV blocks and conversations are keyed by: the variant (weights, tokenizer,
        precision) and the version number."""
        return f"{self.variant['fingerprint']}.v{self.number}"

    def verify(self) -> None:
        verify_variant(self.directory, self.manifest, self.precision)


def read_version_info(directory: Path) -> dict:
    """``version.json`` as a dict ({} when there is none); a malformed one is an error."""
    path = Path(directory) / VERSION_FILE
    if not path.is_file():
        return {}
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(info, dict) or not isinstance(info.get("precision", ""), str):
        raise ValueError(f"{path}: expected an object with a string 'precision'")
    return info


def write_version_info(directory: Path, info: dict) -> None:
    (Path(directory) / VERSION_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


# -- which versions serve ---------------------------------------------------------------------
log = logging.getLogger("switchboard.repository")


class RepositoryError(RuntimeError):
    """A config the repository edits is not as rendered; the message names the file."""


_POLICY = re.compile(r"^version_policy:.*$", re.M)


def _param_pattern(key: str) -> re.Pattern:
    return re.compile(r'(\{ key: "' + re.escape(key) + r'" value: \{ string_value: ")([^"]*)(" \} \})')


def with_parameters(text: str, values: dict[str, str], where: object) -> str:
    """A config.pbtxt's ``text`` with each parameter of ``values`` set; one it does not have is
    an error naming ``where`` (the file)."""
    for key, value in values.items():
        pattern = _param_pattern(key)
        if not pattern.search(text):
            raise RepositoryError(f"{where} has no parameter {key!r} (re-render it)")
        text = pattern.sub(lambda m, v=value: m.group(1) + v + m.group(3), text, count=1)
    return text


def _replace_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class Repository:
    """The rollout state as the model repository holds it: the pools' ``version_policy`` and
    the version folders, ``chat``'s ``stable_version``, ``canary_version`` and ``canary_share``."""

    path: Path

    def served(self, pool: str = POOL_MODELS[0]) -> list[int]:
        text = (self.path / pool / "config.pbtxt").read_text(encoding="utf-8")
        m = _POLICY.search(text)
        if not m:
            raise RepositoryError(f"{pool}/config.pbtxt has no version_policy line (re-render it)")
        return [int(v) for v in re.findall(r"\d+", m.group(0))]

    def set_served(self, versions: list[int]) -> None:
        line = f"version_policy: {{ specific {{ versions: [ {', '.join(str(v) for v in sorted(versions))} ] }} }}"
        for pool in POOL_MODELS:
            path = self.path / pool / "config.pbtxt"
            text = path.read_text(encoding="utf-8")
            if not _POLICY.search(text):
                raise RepositoryError(f"{path} has no version_policy line (re-render it)")
            _replace_atomically(path, _POLICY.sub(line, text, count=1))

    def chat(self) -> dict:
        """``stable_version``, ``canary_version`` (0: none) and ``canary_share`` from chat's config."""
        text = (self.path / CHAT / "config.pbtxt").read_text(encoding="utf-8")
        out = {}
        for key, kind, default in (
            ("stable_version", int, 1),
            ("canary_version", int, 0),
            ("canary_share", float, 0.1),
        ):
            m = _param_pattern(key).search(text)
            out[key] = kind(m.group(2)) if m and m.group(2) else default
        return out

    def set_chat(self, stable: int, canary: int = 0, share: float | None = None) -> None:
        path = self.path / CHAT / "config.pbtxt"
        text = path.read_text(encoding="utf-8")
        values = {"stable_version": str(stable), "canary_version": str(canary)}
        if share is not None:
            values["canary_share"] = f"{share:g}"
        _replace_atomically(path, with_parameters(text, values, path))

    def installed(self) -> list[int]:
        """Version folders present in every pool."""
        sets = [
            {int(d.name) for d in (self.path / p).iterdir() if d.is_dir() and d.name.isdigit()} for p in POOL_MODELS
        ]
        return sorted(set.intersection(*sets))

    def remove(self, number: int) -> None:
        for pool in POOL_MODELS:
            if number == 1:  # version 1 is `make export`'s, its model.py is in git: keep the folder
                continue
            shutil.rmtree(self.path / pool / str(number), ignore_errors=True)

    def reset(self) -> None:
        """Version 1 serves again: what `make rollout` installed (versions 2 and up) is removed
        and the configs name version 1 only. A repository without the configs is left alone."""
        if not all((self.path / p / "config.pbtxt").is_file() for p in (*POOL_MODELS, CHAT)):
            return
        if self.served() != [1]:
            self.set_served([1])
        state = self.chat()
        if state["stable_version"] != 1 or state["canary_version"]:
            self.set_chat(1, 0)
        for number in self.installed():
            if number != 1:
                log.info("removing model version %d (make rollout's) from %s", number, self.path)
                self.remove(number)

"""One installed version of the model: a numbered folder of a pool model in the repository
(``engine_short/2``), its manifest, the precision it serves, its checksums.

``make export`` installs version 1; ``python -m switchboard.ops.rollout`` installs the next
ones, each with a ``version.json`` saying which precision it serves and where it came from.
Before a version serves, a pool whose runtime reads the graph checks its weights against the
manifest's SHA-256 (``verify``): a tampered or truncated file fails the load, and the version
already serving goes on. (``runtime: torch`` reads the checkpoint its config names instead, and
checks that checkpoint's shape against the manifest.) The version's number is part of its
fingerprint, so KV (blocks and conversations) is never reused across versions, even when two
versions hold the same weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from switchboard.artifact.manifest import Manifest, file_digest

VERSION_FILE = "version.json"


class ChecksumError(ValueError):
    """An artifact's bytes do not match its manifest."""


def variant_files(directory: Path, variant: dict) -> list[Path]:
    """The files a variant's ``weights_sha256`` covers: its graph and its external data."""
    graph = Path(directory) / variant["file"]
    return [graph, *sorted(Path(directory).glob(graph.name + ".data"))]


def verify_variant(directory: Path, manifest: Manifest, precision: str) -> None:
    """Raise ``ChecksumError`` unless the variant's files hash to the manifest's ``weights_sha256``."""
    variant = manifest.variant(precision)
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

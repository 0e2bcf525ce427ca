"""The manifest written next to exported artifacts, and the model fingerprint.

The fingerprint is a hash over weights, tokenizer, graph and precision: a KV cache written by
one fingerprint is never used by another.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

MANIFEST = "manifest.json"
log = logging.getLogger("switchboard.artifact")


@dataclass(frozen=True)
class Manifest:
    name: str
    fingerprint: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_window: int
    eos_token_ids: list[int]
    end_of_turn_id: int
    system_prompt: str | None
    kv_dtype: str = "float32"
    variants: dict[str, dict] = field(default_factory=dict)  # precision -> {file, fingerprint, sha256...}
    source: dict = field(default_factory=dict)  # where the checkpoint came from
    parity: dict = field(default_factory=dict)  # export-time checks against PyTorch
    accuracy: dict = field(default_factory=dict)  # variants against FP32 on held-out data
    left_out: dict[str, list[str]] = field(default_factory=dict)  # variant -> the gate's reasons
    speculation: dict = field(default_factory=dict)  # drafts measured at export: enabled, cost_per_token, ...
    packing: dict[str, dict] = field(default_factory=dict)  # variant -> packed against padded passes: chosen, ...

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        return (self.num_layers, 2, self.num_kv_heads, self.head_dim)

    def variant(self, precision: str) -> dict:
        if precision in self.left_out:
            raise ValueError(
                f"precision {precision!r} was left out by the accuracy gate "
                f"({'; '.join(self.left_out[precision])}); have {sorted(self.variants)}"
            )
        if precision not in self.variants:
            raise ValueError(f"precision {precision!r} not exported; have {sorted(self.variants)}")
        return self.variants[precision]

    def graph(self, precision: str, pack: bool = True) -> dict:
        """The file ``precision`` serves from: its packed rendering (the variant's ``packed``)
        where ``pack`` and the export measured it cheaper (``packing``), else the padded graph."""
        variant = self.variant(precision)
        chosen = self.packing.get(precision, {}).get("chosen")
        if pack and chosen == "packed" and "packed" in variant:
            return variant["packed"] | {"fingerprint": variant["fingerprint"] + ".packed"}
        return variant

    def save(self, directory: Path) -> None:
        (directory / MANIFEST).write_text(json.dumps(asdict(self), ensure_ascii=False, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> "Manifest":
        path = Path(directory) / MANIFEST
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: run `make export` first")
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {f.name for f in fields(cls)}
        # A newer export's keys on an older server (a rollback, a canary): read what this
        # version knows, and say what it leaves aside.
        if unknown := sorted(set(data) - known):
            log.warning("%s: keys this version does not read, left aside: %s", path, ", ".join(unknown))
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as e:  # a required key missing
            raise ValueError(f"{path}: not a manifest this version reads ({e})") from None


def file_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode())
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()

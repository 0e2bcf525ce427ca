"""API keys, each mapped to a priority tier.

Keys come from a file (``--keys-file``, one ``<key> <tier>`` per line, ``#`` comments) and/or
the environment (``SWITCHBOARD_API_KEYS="<key>:<tier>,<key>:<tier>"``, e.g. from a Kubernetes
Secret). Tiers: ``live`` (agents, VIP customers: may use priority 1, their default) and
``standard`` (priority 2 only). With no key configured the gateway is open and every caller has
the ``open_tier`` (``standard`` unless told otherwise): fit for a laptop, not for a network.

Keys are kept as SHA-256 digests and looked up by digest, so the table holds no key in clear
and a lookup's time does not depend on how much of a wrong key matches.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from switchboard.wire import PRIORITY_DEFAULT, PRIORITY_LIVE

TIERS = {"live": PRIORITY_LIVE, "standard": PRIORITY_DEFAULT}
ENV = "SWITCHBOARD_API_KEYS"
MIN_KEY_CHARS = 16


class KeysError(ValueError):
    """A keys file or variable that cannot be used; the message names where and what."""


@dataclass(frozen=True)
class Caller:
    tier: str
    name: str  # for logs: the key's tier and the first hex digits of its digest, never the key

    @property
    def best_priority(self) -> int:
        return TIERS[self.tier]


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class KeyTable:
    def __init__(self, keys: dict[str, str] | None = None, open_tier: str = "standard"):
        """``keys``: key -> tier."""
        if open_tier not in TIERS:
            raise KeysError(f"open tier {open_tier!r}: expected one of {', '.join(TIERS)}")
        self.open_tier = open_tier
        self._by_digest: dict[str, str] = {}
        for key, tier in (keys or {}).items():
            self._add(key, tier, "keys")

    def _add(self, key: str, tier: str, where: str) -> None:
        if tier not in TIERS:
            raise KeysError(f"{where}: tier {tier!r} is not one of {', '.join(TIERS)}")
        if len(key) < MIN_KEY_CHARS or any(c.isspace() or not c.isprintable() for c in key):
            raise KeysError(f"{where}: a key must be at least {MIN_KEY_CHARS} printable characters without spaces")
        self._by_digest[_digest(key)] = tier

    @property
    def open(self) -> bool:
        return not self._by_digest

    def __len__(self) -> int:
        return len(self._by_digest)

    @classmethod
    def load(cls, path: Path | None = None, env: dict[str, str] | None = None, open_tier: str = "standard"):
        table = cls(open_tier=open_tier)
        if path is not None:
            try:
                lines = Path(path).read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as e:
                raise KeysError(f"{path}: cannot read the keys file ({e.__class__.__name__})") from None
            for n, line in enumerate(lines, 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                parts = line.split()
                if len(parts) != 2:
                    raise KeysError(f"{path}:{n}: expected '<key> <tier>'")
                table._add(parts[0], parts[1], f"{path}:{n}")
        spec = (os.environ if env is None else env).get(ENV, "").strip()
        for i, item in enumerate(filter(None, (s.strip() for s in spec.split(","))), 1):
            key, sep, tier = item.rpartition(":")
            if not sep:
                raise KeysError(f"{ENV}: entry {i}: expected '<key>:<tier>'")
            table._add(key, tier, f"{ENV}: entry {i}")
        return table

    def caller(self, authorization: str | None) -> Caller | None:
        """The caller an ``Authorization`` header names; None when the key is missing or unknown
        (in an open table, everyone is a caller of the open tier)."""
        if self.open:
            return Caller(self.open_tier, "open")
        if not authorization:
            return None
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        digest = _digest(key.strip())
        tier = self._by_digest.get(digest)
        return Caller(tier, f"{tier}:{digest[:8]}") if tier else None

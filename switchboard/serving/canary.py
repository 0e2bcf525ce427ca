"""Which model version serves a chat during a rollout: a fixed share of sessions, chosen by a
hash of the session id, goes to the canary; the rest, and everything when there is no canary,
to the stable version. The same session always lands on the same version (its KV and its
conversation stay with one model), and the share is the same on every replica."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


def bucket(key: str) -> float:
    """``key``'s place in [0, 1), uniform over keys and the same in every process."""
    digest = hashlib.sha256(b"switchboard-canary:" + key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def conversation_key(session_id: str | None, history, text: str) -> str:
    """What keeps a conversation on one version: its session id; without one (a stateless chat
    sends its history) its first message, the same on every turn."""
    if session_id:
        return session_id
    if history:
        return history[0]["content"]
    return text


@dataclass(frozen=True)
class VersionPicker:
    stable: int
    canary: int = 0  # 0: no canary
    share: float = 0.1

    def __post_init__(self):
        if self.canary == self.stable:
            raise ValueError(f"canary_version {self.canary} is the stable version")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"canary_share {self.share} is not in [0, 1]")

    @property
    def versions(self) -> tuple[int, ...]:
        return (self.stable, self.canary) if self.canary else (self.stable,)

    def pick(self, key: str) -> int:
        """The version for the chat whose session (or, without one, whose conversation) is ``key``."""
        if self.canary and key and bucket(key) < self.share:
            return self.canary
        return self.stable

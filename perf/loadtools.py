"""Shared pieces of ``perf.chaos`` and ``perf.soak``: timed chats and process memory."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from switchboard.client import AsyncChatClient, ChatClient, ChatError, ChatReply


@dataclass
class Outcome:
    ok: bool
    seconds: float
    priority: int = 2
    fallback: bool = False
    reason: str | None = None  # fallback reason or error code
    stats: dict = field(default_factory=dict)
    backlog: float = 0.0  # how late the load generator started it (chaos burst)
    started: float = 0.0  # time.monotonic() when it was sent (chaos burst)


def timed_chat(client: ChatClient, text: str, **kw) -> Outcome:
    t0 = time.monotonic()
    priority = kw.get("priority", 2)
    try:
        reply = client.chat(text, stream=False, **kw)
    except ChatError as e:
        return Outcome(False, time.monotonic() - t0, priority, reason=e.code or "ERROR")
    except Exception as e:  # e.g. the server is gone: tritonclient raises before the stream opens
        return Outcome(False, time.monotonic() - t0, priority, reason=e.__class__.__name__)
    return _outcome(reply, time.monotonic() - t0, priority)


async def timed_chat_async(client: AsyncChatClient, text: str, **kw) -> Outcome:
    """``timed_chat`` for the asyncio client."""
    t0 = time.monotonic()
    priority = kw.get("priority", 2)
    try:
        reply = await client.chat(text, **kw)
    except ChatError as e:
        return Outcome(False, time.monotonic() - t0, priority, reason=e.code or "ERROR")
    except Exception as e:
        return Outcome(False, time.monotonic() - t0, priority, reason=e.__class__.__name__)
    return _outcome(reply, time.monotonic() - t0, priority)


def _outcome(reply: ChatReply, seconds: float, priority: int) -> Outcome:
    raw = reply.stats.raw
    ok = bool(reply.text.strip())
    return Outcome(
        ok, seconds, priority, raw.get("fallback", False), raw.get("fallback_reason") if ok else "EMPTY", raw
    )


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def pss_kib(pid: int) -> int | None:
    """Proportional set size: shared pages divided among the processes mapping them, so a sum
    over processes counts memory-mapped weights once."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None

"""Helpers for the KV tests: a session's block keys as the pools compute them, and a pool's
greedy tokens with nothing reused (the cold reference)."""

from __future__ import annotations

import json
from pathlib import Path

from perf.servertools import scrape
from switchboard.kv.blocks import chain, model_root
from switchboard.kv.model import chat_template
from switchboard.repository.versions import ModelVersion
from switchboard.serving.engine_client import EngineClient
from switchboard.serving.pool_health import PoolHealth
from switchboard.serving.pool_stream import Generation, PoolStreams
from switchboard.serving.session import session_key


def kv_lookups(metrics_port: int) -> float:
    """Prompts a server's pools looked up: the chats it generated (its warm-up's among them)."""
    return sum(v for (name, _), v in scrape(metrics_port).items() if name == "switchboard_kv_lookups_total")


def session_blocks(redis_client, repository: Path, session_id: str) -> list[str]:
    """The Redis keys of the KV blocks a session's last turn stored, in chain order, computed as
    the pools do: from the conversation's token ids and the model's chain root."""
    conv = json.loads(redis_client.get(session_key("sb", session_id) + ":conv"))
    version = repository / "engine_short" / "1"
    root = model_root(ModelVersion.load(version, "fp32").fingerprint, chat_template(version), 16, "native")
    return [f"sb:kvb:{{{k.hex()}}}" for k in chain(root, conv["tokens"][: conv["kv_tokens"]], 16)]


def pool_generate(url: str, pool: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens straight from a pool, no KV reused: the cold reference."""
    engines = EngineClient(url)
    try:
        streams = PoolStreams(engines, PoolHealth(), "", 60.0, 60.0)
        out: list[int] = []
        for response in streams.generate(pool, Generation(prompt, max_new_tokens, 0.0, 1.0, 2)):
            out += response.get("token_ids", [])
        return out
    finally:
        engines.close()

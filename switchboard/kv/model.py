"""A pool's ``BlockCache`` for an exported model: the chain's root from its manifest and chat
template, the block format from its KV geometry, Redis from the pool's settings."""

from __future__ import annotations

from pathlib import Path

from switchboard.artifact.manifest import Manifest
from switchboard.kv.blocks import BlockFormat, model_root
from switchboard.kv.local import LocalBlocks
from switchboard.kv.remote import RedisBlocks
from switchboard.kv.tiers import BlockCache
from switchboard.redis_conn import connect


def chat_template(version: Path) -> str:
    path = Path(version) / "chat_template.jinja"
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def block_cache(
    manifest: Manifest,
    version: Path,
    fingerprint: str,
    *,
    tokens: int,
    local_mb: int,
    storage: str = "native",
    zstd: bool = False,
    secret: bytes = b"",
    redis_url: str | None = None,
    redis_cluster: bool = False,
    redis_timeout_s: float = 0.25,
    redis_tls: dict | None = None,
    ttl_s: int = 3600,
    prefix: str = "sb",
    name: str = "kv",
) -> BlockCache:
    fmt = BlockFormat(
        layers=manifest.num_layers,
        kv_heads=manifest.num_kv_heads,
        head_dim=manifest.head_dim,
        tokens=tokens,
        dtype=manifest.kv_dtype,
        storage=storage,
        zstd=zstd,
        secret=secret,
    )
    root = model_root(fingerprint, chat_template(version), tokens, storage + ("+zstd" if zstd else ""))
    remote = None
    if redis_url:
        client = connect(redis_url, redis_timeout_s, redis_cluster, **(redis_tls or {}))
        remote = RedisBlocks(client, prefix=prefix, ttl_s=ttl_s)
    return BlockCache(fmt, root, LocalBlocks(local_mb << 20), remote, name=name)

"""The shared block tier: KV blocks in Redis (one server or a Redis Cluster), for every replica.

A block's Redis key is ``<prefix>:kvb:{<key hex>}``: the hash tag is the block's own key, so
blocks spread over a cluster's slots, and every command here touches one key (pipelined, not
MULTI), which Redis Cluster accepts whatever the slots. Reads refresh the TTL (``GETEX``), so
blocks in use outlive the ones nobody asks for, and ``maxmemory`` with ``allkeys-lru`` evicts
the least recently used first.

Redis is an accelerator, not a dependency of a chat: every call is bounded by the client's
socket timeout, and after a failure the tier stays away for ``retry_after_s`` so a dead Redis
does not add its timeout to every request.
"""

from __future__ import annotations

import threading
from collections import Counter

import redis

from switchboard.redis_conn import Outage


class RedisBlocks:
    def __init__(self, client, prefix: str = "sb", ttl_s: int = 3600, retry_after_s: float = 2.0):
        self.client, self.prefix, self.ttl_s = client, prefix, ttl_s
        self.outage = Outage("KV block store", retry_after_s)
        self._lock = threading.Lock()
        self.counts: Counter = Counter()  # blocks_read, bytes_read, blocks_written, bytes_written, failures

    def key(self, key: bytes) -> str:
        return f"{self.prefix}:kvb:{{{key.hex()}}}"

    def available(self) -> bool:
        return self.outage.available()

    def _pipelined(self, during: str, keys: list, command) -> list | None:
        """``command(pipe, key)`` for each of ``keys`` in one round trip of single-key commands
        (any Redis Cluster slots); the replies, or None if Redis is unavailable."""
        if not self.outage.available():
            return None
        try:
            pipe = self.client.pipeline(transaction=False)
            for k in keys:
                command(pipe, k)
            return pipe.execute()
        except redis.RedisError as e:
            self.outage.failed(during, e)
            with self._lock:
                self.counts["failures"] += 1
            return None

    def stored(self, keys: list[bytes], during: str = "lookup") -> list[bool] | None:
        """Whether each of ``keys`` is stored (None: Redis unavailable)."""
        if not keys:
            return []
        found = self._pipelined(during, keys, lambda pipe, k: pipe.exists(self.key(k)))
        return None if found is None else [bool(n) for n in found]

    def present(self, keys: list[bytes]) -> int | None:
        """How many of ``keys``, from the first, are stored (None: Redis unavailable)."""
        found = self.stored(keys)
        if found is None:
            return None
        n = 0
        while n < len(found) and found[n]:
            n += 1
        return n

    def get(self, keys: list[bytes]) -> list[bytes | None] | None:
        """The stored bytes of ``keys`` (None for a missing one), or None if Redis is unavailable."""
        if not keys:
            return []
        blobs = self._pipelined("read", keys, lambda pipe, k: pipe.getex(self.key(k), ex=self.ttl_s))
        if blobs is not None:
            got = [b for b in blobs if b is not None]
            with self._lock:
                self.counts["blocks_read"] += len(got)
                self.counts["bytes_read"] += sum(len(b) for b in got)
        return blobs

    def put(self, items: list[tuple[bytes, bytes]]) -> bool:
        """Store ``(key, bytes)`` pairs in the order given; False if Redis failed (some may be stored:
        a reader uses the stored prefix of a chain, block by verified block)."""
        if not items:
            return True
        if (
            self._pipelined("write", items, lambda pipe, item: pipe.set(self.key(item[0]), item[1], ex=self.ttl_s))
            is None
        ):
            return False
        with self._lock:
            self.counts["blocks_written"] += len(items)
            self.counts["bytes_written"] += sum(len(b) for _, b in items)
        return True

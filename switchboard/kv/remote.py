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

import logging
import threading
import time
from collections import Counter

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)


def tls_arguments(url: str, ca_file: str = "", cert_file: str = "", key_file: str = "") -> dict:
    """redis-py's TLS arguments for ``url``: none for redis://, the files given for rediss://
    (empty: system CAs, no client certificate); files without rediss:// are a mistake."""
    tls = {"ssl_ca_certs": ca_file, "ssl_certfile": cert_file, "ssl_keyfile": key_file}
    if not url.startswith("rediss://"):
        if any(tls.values()):
            raise ValueError("redis TLS files are set but the URL is not rediss://")
        return {}
    return {k: v for k, v in tls.items() if v}


def connect(url: str, timeout_s: float, cluster: bool = False, **kwargs):
    """A redis-py client for ``url`` with bounded calls and no retries (``kwargs``: TLS files)."""
    common = dict(socket_timeout=timeout_s, socket_connect_timeout=timeout_s, **kwargs)
    if cluster:
        return redis.RedisCluster.from_url(url, retry=Retry(NoBackoff(), 0), **common)
    return redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), health_check_interval=0, **common)


class RedisBlocks:
    def __init__(self, client, prefix: str = "sb", ttl_s: int = 3600, retry_after_s: float = 2.0):
        self.client, self.prefix, self.ttl_s, self.retry_after_s = client, prefix, ttl_s, retry_after_s
        self._lock = threading.Lock()
        self._down_until = 0.0
        self.counts: Counter = Counter()  # blocks_read, bytes_read, blocks_written, bytes_written, failures

    def key(self, key: bytes) -> str:
        return f"{self.prefix}:kvb:{{{key.hex()}}}"

    def available(self) -> bool:
        with self._lock:
            return time.monotonic() >= self._down_until

    def _failed(self, what: str, error: Exception) -> None:
        with self._lock:
            first = time.monotonic() >= self._down_until
            self._down_until = time.monotonic() + self.retry_after_s
            self.counts["failures"] += 1
        if first:
            log.warning(
                "KV block store unavailable during %s (%s); going on without it", what, error.__class__.__name__
            )

    def stored(self, keys: list[bytes], what: str = "lookup") -> list[bool] | None:
        """Whether each of ``keys`` is stored (None: Redis unavailable)."""
        if not keys:
            return []
        if not self.available():
            return None
        try:
            pipe = self.client.pipeline(transaction=False)
            for k in keys:
                pipe.exists(self.key(k))
            return [bool(n) for n in pipe.execute()]
        except redis.RedisError as e:
            self._failed(what, e)
            return None

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
        if not self.available():
            return None
        try:
            pipe = self.client.pipeline(transaction=False)
            for k in keys:
                pipe.getex(self.key(k), ex=self.ttl_s)
            blobs = pipe.execute()
        except redis.RedisError as e:
            self._failed("read", e)
            return None
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
        if not self.available():
            return False
        try:
            pipe = self.client.pipeline(transaction=False)
            for k, blob in items:
                pipe.set(self.key(k), blob, ex=self.ttl_s)
            pipe.execute()
        except redis.RedisError as e:
            self._failed("write", e)
            return False
        with self._lock:
            self.counts["blocks_written"] += len(items)
            self.counts["bytes_written"] += sum(len(b) for _, b in items)
        return True

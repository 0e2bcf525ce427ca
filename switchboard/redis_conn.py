"""Redis connections as the session store (switchboard.serving) and the KV block tier
(switchboard.kv) both make them: bounded calls without retries, TLS from settings, and a
back-off after a failure.

A leaf: it imports nothing else from the package, so both layers can use it without one
depending on the other.
"""

from __future__ import annotations

import logging
import threading
import time

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


class Outage:
    """After a failed Redis call, stay away for ``retry_after_s``: a dead Redis costs one timeout,
    not one per request. Logs the first failure of each outage."""

    def __init__(self, what: str, retry_after_s: float):
        self.what, self.retry_after_s = what, retry_after_s
        self._lock = threading.Lock()
        self._down_until = 0.0
        self.failures = 0

    def available(self) -> bool:
        with self._lock:
            return time.monotonic() >= self._down_until

    def failed(self, during: str, error: Exception) -> None:
        with self._lock:
            first = time.monotonic() >= self._down_until
            self._down_until = time.monotonic() + self.retry_after_s
            self.failures += 1
        if first:
            log.warning("%s unavailable during %s (%s); going on without it", self.what, during, type(error).__name__)

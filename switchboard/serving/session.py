"""Session store in Redis: the conversation so far and the KV cache that covers it.

Two keys per session, written together with one TTL:
  ``<prefix>:<h>:conv``  JSON: the windowed messages and the token ids the model saw
  ``<prefix>:<h>:kv``    binary KV entry (see ``kvcodec``), verified before use
where ``<h>`` is a SHA-256 of the session id, so no session id (``*``, ``../``, newlines,
megabytes) can address, scan or collide with another session's keys.

Redis is an accelerator, not a dependency of a chat: every call is bounded by a short
timeout, failures are logged and counted, and after one failure the store stays away for
``retry_after`` seconds so a dead Redis does not add its timeout to every request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from switchboard.serving import kvcodec
from switchboard.serving.prompt import Conversation
from switchboard.wire import SessionStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreConfig:
    url: str = "redis://127.0.0.1:6379/0"
    ttl_s: int = 3600
    timeout_s: float = 0.25
    retry_after_s: float = 2.0
    prefix: str = "sb"
    secret: bytes = b""
    max_kv_bytes: int = 64 << 20
    # TLS (``rediss://`` URLs): CA bundle to verify the server, and a client certificate and
    # key where Redis requires them (``tls-auth-clients yes``). Empty: system CAs, no client cert.
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""

    def connection_kwargs(self) -> dict:
        if not self.url.startswith("rediss://"):
            if self.tls_ca_file or self.tls_cert_file or self.tls_key_file:
                raise ValueError("redis TLS files are set but the URL is not rediss://")
            return {}
        tls = {"ssl_ca_certs": self.tls_ca_file, "ssl_certfile": self.tls_cert_file, "ssl_keyfile": self.tls_key_file}
        return {k: v for k, v in tls.items() if v}


def session_key(prefix: str, session_id: str) -> str:
    return f"{prefix}:{hashlib.sha256(session_id.encode('utf-8')).hexdigest()}"


@dataclass
class Lookup:
    conversation: Conversation | None = None
    kv: kvcodec.KVEntry | None = None
    status: SessionStatus = SessionStatus.MISS


class SessionStore:
    def __init__(self, config: StoreConfig, fingerprint: str, kv_shape: tuple[int, int, int, int], kv_dtype: np.dtype):
        self.config = config
        self.fingerprint = fingerprint
        self.kv_shape = kv_shape
        self.kv_dtype = np.dtype(kv_dtype)
        self._redis = redis.Redis.from_url(
            config.url,
            socket_timeout=config.timeout_s,
            socket_connect_timeout=config.timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            **config.connection_kwargs(),
        )
        self._lock = threading.Lock()
        self._down_until = 0.0

    def close(self) -> None:
        self._redis.close()

    def _available(self) -> bool:
        with self._lock:
            return time.monotonic() >= self._down_until

    def _failed(self, what: str, error: Exception) -> None:
        with self._lock:
            first = time.monotonic() >= self._down_until
            self._down_until = time.monotonic() + self.config.retry_after_s
        if first:
            log.warning(
                "session store unavailable during %s (%s); chats go on without reuse", what, error.__class__.__name__
            )

    def load(self, session_id: str, want_kv: bool = True) -> Lookup:
        if not self._available():
            return Lookup(status=SessionStatus.UNAVAILABLE)
        key = session_key(self.config.prefix, session_id)
        try:
            if want_kv:
                conv_raw, kv_raw = self._redis.mget([f"{key}:conv", f"{key}:kv"])
            else:
                conv_raw, kv_raw = self._redis.get(f"{key}:conv"), None
        except redis.RedisError as e:
            self._failed("lookup", e)
            return Lookup(status=SessionStatus.UNAVAILABLE)
        if conv_raw is None:
            return Lookup()
        try:
            conversation = self._decode_conversation(conv_raw)
        except (ValueError, RecursionError) as e:
            log.warning("rejected conversation entry: %s", e)
            return Lookup(status=SessionStatus.REJECTED)
        entry, status = None, SessionStatus.HIT
        if want_kv and kv_raw is not None:
            try:
                entry = kvcodec.decode(kv_raw, self.fingerprint, self.kv_shape, self.kv_dtype, self.config.secret)
            except kvcodec.CacheEntryRejected as e:
                log.warning("rejected KV entry: %s", e)
                status = SessionStatus.REJECTED
        return Lookup(conversation, entry, status)

    def save(self, session_id: str, conversation: Conversation, kv: kvcodec.KVEntry | None) -> bool:
        if not self._available():
            return False
        key = session_key(self.config.prefix, session_id)
        body = {"fingerprint": self.fingerprint, "messages": conversation.messages, "tokens": conversation.tokens}
        conv_blob = json.dumps({**body, "digest": self._conv_digest(body)}, ensure_ascii=False, separators=(",", ":"))
        try:
            pipe = self._redis.pipeline(transaction=True)
            pipe.set(f"{key}:conv", conv_blob, ex=self.config.ttl_s)
            blob = kvcodec.encode(kv, self.fingerprint, self.config.secret) if kv is not None else None
            if blob is not None and len(blob) <= self.config.max_kv_bytes:
                pipe.set(f"{key}:kv", blob, ex=self.config.ttl_s)
            else:
                pipe.delete(f"{key}:kv")
            pipe.execute()
            return True
        except redis.RedisError as e:
            self._failed("write-back", e)
            return False

    def _conv_digest(self, body: dict) -> str:
        canonical = json.dumps(body, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
        return hashlib.blake2b(canonical, key=self.config.secret[:64], digest_size=32, person=b"sb-conv").hexdigest()

    def _decode_conversation(self, raw: bytes) -> Conversation:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("fingerprint") != self.fingerprint:
            raise ValueError("entry was written by another model")
        body = {k: data.get(k) for k in ("fingerprint", "messages", "tokens")}
        if not isinstance(data.get("digest"), str) or not hmac.compare_digest(data["digest"], self._conv_digest(body)):
            raise ValueError("digest mismatch (corrupted, truncated or forged)")
        messages, tokens = data.get("messages"), data.get("tokens")
        if not (
            isinstance(messages, list)
            and all(
                isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            raise ValueError("malformed messages")
        if not (isinstance(tokens, list) and all(isinstance(t, int) and t >= 0 for t in tokens)):
            raise ValueError("malformed tokens")
        return Conversation(messages, tokens)


def longest_common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share: the part of a stored KV cache a prompt can reuse."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i

"""Session store in Redis: the conversation so far (messages and the token ids the model saw).

One key per session, ``<prefix>:{<h>}:conv`` (JSON, a keyed digest, the TTL), where ``<h>`` is
a SHA-256 of the session id, so no session id (``*``, ``../``, newlines, megabytes) can
address, scan or collide with another session's keys, and the ``{...}`` hash tag keeps every
key of one session in one Redis Cluster slot. The KV cache is not here: the pools store it as
content-addressed blocks (switchboard/kv), so the conversation survives its blocks' eviction
(reuse drops, answers stay right) and an entry written for another model variant keeps its
messages (its token ids are dropped: they may not mean the same to this tokenizer).

Redis is an accelerator, not a dependency of a chat: every call is bounded by a short
timeout, failures are logged and counted, and after one failure the store stays away for
``retry_after`` seconds so a dead Redis does not add its timeout to every request.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import logging
from dataclasses import dataclass

import redis

from switchboard.redis_conn import Outage, connect, tls_arguments
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
    cluster: bool = False
    # TLS (``rediss://`` URLs): CA bundle to verify the server, and a client certificate and
    # key where Redis requires them (``tls-auth-clients yes``). Empty: system CAs, no client cert.
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""

    def connection_kwargs(self) -> dict:
        return tls_arguments(self.url, self.tls_ca_file, self.tls_cert_file, self.tls_key_file)


def session_key(prefix: str, session_id: str) -> str:
    return f"{prefix}:{{{hashlib.sha256(session_id.encode('utf-8')).hexdigest()}}}"


@dataclass
class Lookup:
    conversation: Conversation | None = None
    status: SessionStatus = SessionStatus.MISS
    other_model: bool = False  # written for another model variant: messages kept, token ids dropped


class SessionStore:
    def __init__(self, config: StoreConfig, fingerprint: str):
        self.config = config
        self.fingerprint = fingerprint
        self._redis = connect(config.url, config.timeout_s, config.cluster, **config.connection_kwargs())
        self.outage = Outage("session store", config.retry_after_s)

    def close(self) -> None:
        self._redis.close()

    def for_model(self, fingerprint: str) -> SessionStore:
        """This store (same connection, same outage state) for conversations of the model
        ``fingerprint``: one per model version during a rollout."""
        view = copy.copy(self)
        view.fingerprint = fingerprint
        return view

    def load(self, session_id: str) -> Lookup:
        if not self.outage.available():
            return Lookup(status=SessionStatus.UNAVAILABLE)
        key = session_key(self.config.prefix, session_id)
        try:
            raw = self._redis.get(f"{key}:conv")
        except redis.RedisError as e:
            self.outage.failed("lookup", e)
            return Lookup(status=SessionStatus.UNAVAILABLE)
        if raw is None:
            return Lookup()
        try:
            conversation, fingerprint = self._decode_conversation(raw)
        except (ValueError, RecursionError) as e:
            log.warning("rejected conversation entry: %s", e)
            return Lookup(status=SessionStatus.REJECTED)
        if fingerprint != self.fingerprint:
            return Lookup(Conversation(conversation.messages), SessionStatus.HIT, other_model=True)
        return Lookup(conversation, SessionStatus.HIT)

    def save(self, session_id: str, conversation: Conversation) -> bool:
        if not self.outage.available():
            return False
        key = session_key(self.config.prefix, session_id)
        body = {
            "fingerprint": self.fingerprint,
            "messages": conversation.messages,
            "tokens": conversation.tokens,
            "kv_tokens": conversation.kv_tokens,
        }
        blob = json.dumps({**body, "digest": self._conv_digest(body)}, ensure_ascii=False, separators=(",", ":"))
        try:
            self._redis.set(f"{key}:conv", blob, ex=self.config.ttl_s)
            return True
        except redis.RedisError as e:
            self.outage.failed("write-back", e)
            return False

    def _conv_digest(self, body: dict) -> str:
        canonical = json.dumps(body, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
        return hashlib.blake2b(canonical, key=self.config.secret[:64], digest_size=32, person=b"sb-conv").hexdigest()

    def _decode_conversation(self, raw: bytes) -> tuple[Conversation, str]:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        body = {k: data.get(k) for k in ("fingerprint", "messages", "tokens", "kv_tokens")}
        if not isinstance(data.get("digest"), str) or not hmac.compare_digest(data["digest"], self._conv_digest(body)):
            raise ValueError("digest mismatch (corrupted, truncated or forged)")
        messages, tokens, kv_tokens = data.get("messages"), data.get("tokens"), data.get("kv_tokens")
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
        if not (isinstance(kv_tokens, int) and 0 <= kv_tokens <= len(tokens)):
            raise ValueError("malformed kv_tokens")
        if not isinstance(data.get("fingerprint"), str):
            raise ValueError("malformed fingerprint")
        return Conversation(messages, tokens, kv_tokens), data["fingerprint"]


def longest_common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share: the part of a stored KV cache a prompt can reuse."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i

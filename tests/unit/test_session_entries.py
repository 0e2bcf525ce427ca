"""Conversation entries read back from Redis are JSON only and integrity-checked (no server:
the decoding is pure; the store never connects in these tests)."""

from __future__ import annotations

import json

import pytest

from switchboard.serving.prompt import Conversation
from switchboard.serving.session import SessionStore, StoreConfig, session_key


def store(secret=b"s3cret", fingerprint="fp-a"):
    return SessionStore(StoreConfig(url="redis://127.0.0.1:1/0", secret=secret), fingerprint)


def blob(s: SessionStore, conversation: Conversation, fingerprint: str | None = None) -> bytes:
    body = {
        "fingerprint": fingerprint or s.fingerprint,
        "messages": conversation.messages,
        "tokens": conversation.tokens,
        "kv_tokens": conversation.kv_tokens,
    }
    return json.dumps({**body, "digest": s._conv_digest(body)}).encode()


CONV = Conversation([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], [1, 2, 3], 2)


def test_round_trip():
    s = store()
    out, fingerprint = s._decode_conversation(blob(s, CONV))
    assert out == CONV and fingerprint == "fp-a"


class _Redis:
    def __init__(self, raw):
        self.raw = raw

    def get(self, key):
        return self.raw


def test_an_entry_of_another_model_keeps_its_messages_not_its_token_ids():
    s = store()
    s._redis = _Redis(blob(s, CONV, fingerprint="fp-other"))
    lookup = s.load("s")
    assert lookup.other_model and lookup.status == "hit"
    assert lookup.conversation == Conversation(CONV.messages)  # no tokens, no KV claimed


@pytest.mark.parametrize(
    "mangle, reason",
    [
        (lambda d: {**d, "tokens": d["tokens"] + [4]}, "digest"),
        (lambda d: {**d, "messages": d["messages"][:1]}, "digest"),
        (lambda d: {k: v for k, v in d.items() if k != "digest"}, "digest"),
        (lambda d: {**d, "fingerprint": "fp-other"}, "digest"),
        (lambda d: {**d, "kv_tokens": 9}, "digest"),
    ],
)
def test_tampered_entries_are_rejected(mangle, reason):
    s = store()
    data = json.loads(blob(s, CONV))
    with pytest.raises(ValueError, match=reason):
        s._decode_conversation(json.dumps(mangle(data)).encode())


def test_an_entry_signed_with_another_secret_is_rejected():
    with pytest.raises(ValueError, match="digest"):
        store(secret=b"server")._decode_conversation(blob(store(secret=b"attacker"), CONV))


@pytest.mark.parametrize("raw", [b"\x80\x04\x95 pickle", b"[" * 100000, b"null", b'"x"'])
def test_garbage_is_rejected_never_unpickled(raw):
    with pytest.raises((ValueError, RecursionError)):
        store()._decode_conversation(raw)


@pytest.mark.parametrize("sid", ["*", "?", "../../etc/passwd", "a b", "a\nb", "sb:*", "x" * 10000, "用户"])
def test_keys_are_fixed_shape_hashes_whatever_the_session_id(sid):
    key = session_key("sb", sid)
    prefix, tagged = key.split(":")
    digest = tagged.strip("{}")
    assert tagged == "{" + digest + "}"  # a hash tag: the session's keys share a Redis Cluster slot
    assert prefix == "sb" and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    assert session_key("sb", sid) != session_key("sb", sid + " ")

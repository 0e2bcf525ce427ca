"""Binary format of a session's KV cache in Redis: never pickled, always verified.

    b"SBKV1\\n" | u32 header length | header (JSON) | payload (raw little-endian array)

The header names the model fingerprint, dtype, shape and the token ids the cache covers; a
keyed BLAKE2b digest over header and payload guards against truncation, corruption and (with a
secret configured) forgery. Anything that does not check out is rejected, so the turn is
prefilled from scratch instead of using a cache that belongs to another model or another text.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"SBKV1\n"
_LEN = struct.Struct("<I")
MAX_HEADER = 1 << 20


class CacheEntryRejected(ValueError):
    pass


@dataclass(frozen=True)
class KVEntry:
    tokens: list[int]  # the ids whose keys and values are in ``kv``
    kv: np.ndarray  # [layers, 2, kv_heads, len(tokens), head_dim]


def _digest(secret: bytes, header: bytes, payload: bytes | memoryview) -> str:
    h = hashlib.blake2b(key=secret[:64], digest_size=32)
    h.update(header)
    h.update(payload)
    return h.hexdigest()


def encode(entry: KVEntry, fingerprint: str, secret: bytes = b"") -> bytes:
    kv = np.ascontiguousarray(entry.kv)
    if kv.ndim != 5 or kv.shape[3] != len(entry.tokens):
        raise ValueError(f"KV shape {kv.shape} does not cover {len(entry.tokens)} tokens")
    meta = {
        "fingerprint": fingerprint,
        "dtype": kv.dtype.str,
        "shape": list(kv.shape),
        "tokens": [int(t) for t in entry.tokens],
    }
    body = json.dumps(meta, separators=(",", ":")).encode()
    payload = kv.tobytes()
    header = json.dumps(
        {"meta": body.decode(), "digest": _digest(secret, body, payload)}, separators=(",", ":")
    ).encode()
    return MAGIC + _LEN.pack(len(header)) + header + payload


def decode(
    blob: bytes, fingerprint: str, expect_shape: tuple[int, int, int, int], dtype: np.dtype, secret: bytes = b""
) -> KVEntry:
    """``expect_shape``: (layers, 2, kv_heads, head_dim) of the serving model."""
    try:
        return _decode(blob, fingerprint, expect_shape, dtype, secret)
    except CacheEntryRejected:
        raise
    except Exception as e:  # bytes from Redis are untrusted: any surprise is a rejection, never a crash
        raise CacheEntryRejected(f"malformed entry: {e.__class__.__name__}") from None


def _decode(
    blob: bytes, fingerprint: str, expect_shape: tuple[int, int, int, int], dtype: np.dtype, secret: bytes
) -> KVEntry:
    try:
        if not blob.startswith(MAGIC):
            raise CacheEntryRejected("not a Switchboard KV entry")
        (n,) = _LEN.unpack_from(blob, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        if n > MAX_HEADER or start + n > len(blob):
            raise CacheEntryRejected("truncated header")
        header = json.loads(blob[start : start + n])
        body = header["meta"].encode()
        meta = json.loads(body)
        if not isinstance(meta, dict):
            raise CacheEntryRejected("unreadable header: meta is not an object")
        payload = memoryview(blob)[start + n :]
    except (struct.error, ValueError, KeyError, TypeError, UnicodeError, AttributeError, RecursionError) as e:
        if isinstance(e, CacheEntryRejected):
            raise
        raise CacheEntryRejected(f"unreadable header: {e.__class__.__name__}") from None
    if meta.get("fingerprint") != fingerprint:
        raise CacheEntryRejected("entry was written by another model")
    if not isinstance(header.get("digest"), str) or not hmac.compare_digest(
        header["digest"], _digest(secret, body, payload)
    ):
        raise CacheEntryRejected("digest mismatch (corrupted, truncated or forged)")
    tokens, shape = meta["tokens"], tuple(meta["shape"])
    if np.dtype(meta["dtype"]) != np.dtype(dtype):
        raise CacheEntryRejected(f"dtype {meta['dtype']} is not the model's {np.dtype(dtype).str}")
    layers, two, heads, dim = expect_shape
    if shape != (layers, two, heads, len(tokens), dim):
        raise CacheEntryRejected(f"shape {shape} does not match the model and {len(tokens)} tokens")
    if payload.nbytes != int(np.prod(shape)) * np.dtype(dtype).itemsize:
        raise CacheEntryRejected("payload size does not match its shape")
    kv = np.frombuffer(payload, dtype=dtype).reshape(shape)
    return KVEntry([int(t) for t in tokens], kv)

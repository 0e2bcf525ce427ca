"""KV in content-addressed blocks: the keys (a hash chain over token ids) and the stored bytes.

A block is ``tokens`` consecutive positions of one sequence's KV cache, an array
[layers, 2, kv_heads, tokens, head_dim]. Its key is a link in a hash chain::

    key_0 = H(root | ids of block 0)        key_i = H(key_{i-1} | ids of block i)

where ``root`` names everything the KV depends on: the model variant's fingerprint (weights,
precision, tokenizer), the chat template, the block size and the storage format. A key thus
names the whole prefix up to the block's end: equal keys mean equal KV, a lookup needs only
the token ids, and identical prefixes (the system prompt, the same FAQ context) are one set of
blocks whichever session sent them. Only full blocks are stored; a prompt's last partial block
is recomputed.

Stored bytes (never pickled; anything that does not check out is rejected)::

    b"SBKB1\\n" | u32 header length | header (JSON) | 32-byte digest | payload

The header repeats the key, storage, dtype and shape the reader expects; the digest is a keyed
BLAKE2b (the session secret) over header and payload, so a truncated, corrupted, forged or
misfiled block is refused and the reused prefix ends before it. Storage formats: ``native``
(the runtime's dtype, lossless), ``float16``, ``int8`` (symmetric, one scale per token and head);
``zstd`` compresses the payload (decompression bounded by the expected size).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAGIC = b"SBKB1\n"
_LEN = struct.Struct("<I")
_DIGEST = 32
MAX_HEADER = 4096
STORAGES = ("native", "float16", "int8")
KEY_BYTES = 16


class BlockRejected(ValueError):
    """A stored block that must not be used (its reason in the message)."""


def model_root(fingerprint: str, template: str, tokens: int, storage: str) -> bytes:
    """The chain's root: what a block's KV depends on besides its token ids."""
    h = hashlib.blake2b(digest_size=KEY_BYTES, person=b"sb-kv-root")
    for part in (fingerprint, hashlib.sha256(template.encode("utf-8")).hexdigest(), str(tokens), storage):
        h.update(part.encode("utf-8") + b"\0")
    return h.digest()


def chain(root: bytes, ids: Sequence[int], tokens: int) -> list[bytes]:
    """Keys of the full blocks of ``ids`` (``len(ids) // tokens`` of them), in order."""
    arr = np.asarray(ids, dtype="<u4")
    keys, prev = [], root
    for i in range(len(arr) // tokens):
        prev = hashlib.blake2b(prev + arr[i * tokens : (i + 1) * tokens].tobytes(), digest_size=KEY_BYTES).digest()
        keys.append(prev)
    return keys


@dataclass(frozen=True)
class BlockFormat:
    """How blocks of one model are stored: their shape and dtype at run time, the storage
    format, compression and the digest's key."""

    layers: int
    kv_heads: int
    head_dim: int
    tokens: int
    dtype: str = "float32"
    storage: str = "native"
    zstd: bool = False
    secret: bytes = b""

    def __post_init__(self):
        if self.storage not in STORAGES:
            raise ValueError(f"KV block storage {self.storage!r}: expected one of {', '.join(STORAGES)}")
        if self.tokens < 1:
            raise ValueError("KV block tokens must be at least 1")

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.layers, 2, self.kv_heads, self.tokens, self.head_dim)

    @property
    def nbytes(self) -> int:
        """Bytes of one block in memory (the runtime's dtype)."""
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

    def _payload_bytes(self) -> int:
        n = int(np.prod(self.shape))
        if self.storage == "native":
            return n * np.dtype(self.dtype).itemsize
        if self.storage == "float16":
            return n * 2
        return n + n // self.head_dim * 4  # int8 values, a float32 scale per token and head

    def _header(self, key: bytes) -> bytes:
        meta = {
            "key": key.hex(),
            "storage": self.storage,
            "dtype": np.dtype(self.dtype).str,
            "shape": list(self.shape),
            "zstd": self.zstd,
        }
        return json.dumps(meta, separators=(",", ":")).encode()

    def _digest(self, header: bytes, payload: bytes | memoryview) -> bytes:
        h = hashlib.blake2b(key=self.secret[:64], digest_size=_DIGEST, person=b"sb-kv-block")
        h.update(header)
        h.update(payload)
        return h.digest()

    def encode(self, key: bytes, kv: np.ndarray) -> bytes:
        if tuple(kv.shape) != self.shape:
            raise ValueError(f"KV block shape {tuple(kv.shape)}, expected {self.shape}")
        if self.storage == "native":
            payload = np.ascontiguousarray(kv, dtype=self.dtype).tobytes()
        elif self.storage == "float16":
            payload = np.ascontiguousarray(kv, dtype=np.float16).tobytes()
        else:
            x = np.asarray(kv, dtype=np.float32)
            scale = np.abs(x).max(axis=-1, keepdims=True) / 127.0
            q = np.rint(x / np.where(scale > 0, scale, 1.0)).clip(-127, 127).astype(np.int8)
            payload = scale.astype("<f4").tobytes() + q.tobytes()
        if self.zstd:
            import zstandard

            payload = zstandard.ZstdCompressor(level=3).compress(payload)
        header = self._header(key)
        return MAGIC + _LEN.pack(len(header)) + header + self._digest(header, payload) + payload

    def decode(self, key: bytes, blob: bytes) -> np.ndarray:
        """The block's KV in the runtime's dtype, or ``BlockRejected``."""
        try:
            return self._decode(key, memoryview(blob))
        except BlockRejected:
            raise
        except Exception as e:  # bytes from Redis are untrusted: any surprise is a rejection
            raise BlockRejected(f"malformed block: {e.__class__.__name__}") from None

    def _decode(self, key: bytes, blob: memoryview) -> np.ndarray:
        if bytes(blob[: len(MAGIC)]) != MAGIC:
            raise BlockRejected("not a Switchboard KV block")
        (n,) = _LEN.unpack_from(blob, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        if n > MAX_HEADER or start + n + _DIGEST > len(blob):
            raise BlockRejected("truncated header")
        header = bytes(blob[start : start + n])
        if header != self._header(key):
            raise BlockRejected("header does not match this key, model or storage format")
        digest = bytes(blob[start + n : start + n + _DIGEST])
        payload = blob[start + n + _DIGEST :]
        if not hmac.compare_digest(digest, self._digest(header, payload)):
            raise BlockRejected("digest mismatch (corrupted, truncated or forged)")
        want = self._payload_bytes()
        if self.zstd:
            import zstandard

            payload = memoryview(zstandard.ZstdDecompressor().decompress(payload, max_output_size=want))
        if payload.nbytes != want:
            raise BlockRejected("payload size does not match the block's shape")
        if self.storage == "native":
            return np.frombuffer(payload, dtype=self.dtype).reshape(self.shape)
        if self.storage == "float16":
            return np.frombuffer(payload, dtype=np.float16).reshape(self.shape).astype(self.dtype)
        scales = want - int(np.prod(self.shape))
        scale = np.frombuffer(payload[:scales], dtype="<f4").reshape(self.shape[:-1] + (1,))
        q = np.frombuffer(payload[scales:], dtype=np.int8).reshape(self.shape)
        return (q.astype(np.float32) * scale).astype(self.dtype)

import numpy as np
import pytest

from switchboard.serving import kvcodec
from switchboard.serving.kvcodec import CacheEntryRejected, KVEntry

SHAPE = (2, 2, 3, 4)  # layers, k/v, heads, head_dim


def entry(n=5):
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((SHAPE[0], 2, SHAPE[2], n, SHAPE[3])).astype(np.float32)
    return KVEntry(list(range(10, 10 + n)), kv)


def decode(blob, fp="fp-a", secret=b""):
    return kvcodec.decode(blob, fp, SHAPE, np.float32, secret)


def test_round_trip():
    e = entry()
    out = decode(kvcodec.encode(e, "fp-a"))
    assert out.tokens == e.tokens
    np.testing.assert_array_equal(out.kv, e.kv)


@pytest.mark.parametrize(
    "mangle, reason",
    [
        (lambda b: b[:-7], "digest|size"),
        (lambda b: b[:20], "truncated|unreadable"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "digest"),
        (lambda b: b"\x80\x04pickle", "not a Switchboard"),
        (lambda b: b"", "not a Switchboard"),
    ],
)
def test_corrupted_entries_are_rejected(mangle, reason):
    with pytest.raises(CacheEntryRejected, match=reason):
        decode(mangle(kvcodec.encode(entry(), "fp-a")))


def test_foreign_model_and_forged_entries_are_rejected():
    blob = kvcodec.encode(entry(), "fp-b")
    with pytest.raises(CacheEntryRejected, match="another model"):
        decode(blob)
    with pytest.raises(CacheEntryRejected, match="digest"):
        decode(kvcodec.encode(entry(), "fp-a", secret=b"other"), secret=b"ours")


def test_shape_must_match_the_model():
    with pytest.raises(CacheEntryRejected, match="shape"):
        kvcodec.decode(kvcodec.encode(entry(), "fp-a"), "fp-a", (2, 2, 3, 8), np.float32)


def _forge(meta_or_header: bytes) -> bytes:
    return kvcodec.MAGIC + kvcodec._LEN.pack(len(meta_or_header)) + meta_or_header


@pytest.mark.parametrize(
    "blob",
    [
        _forge(b"[1, 2, 3]"),  # header is not an object
        _forge(b'{"meta": "[1]", "digest": "00"}'),  # meta is not an object
        _forge(b'{"meta": 5, "digest": "00"}'),
        _forge(b"[" * 50000 + b"]" * 50000),  # nesting deep enough to recurse
        _forge(b'{"meta": "{\\"fingerprint\\": \\"fp-a\\"}", "digest": 7}'),
        b"",
        kvcodec.MAGIC + b"\xff\xff\xff\xff",
    ],
)
def test_malformed_entries_are_rejected_not_crashes(blob):
    with pytest.raises(CacheEntryRejected):
        decode(blob)


def test_a_well_formed_forgery_without_the_secret_is_rejected():
    """Tokens, dtype and shape all plausible, digest computed without the server's secret."""
    forged = kvcodec.encode(entry(), "fp-a", secret=b"attacker")
    with pytest.raises(CacheEntryRejected, match="digest"):
        decode(forged, secret=b"server-secret")

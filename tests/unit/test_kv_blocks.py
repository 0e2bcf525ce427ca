"""Content-addressed KV blocks: keys, the stored format, the local tier, the two tiers together
(Redis replaced by an in-memory fake here; tests/integration/test_kv_redis.py uses a real one)."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from switchboard.kv.blocks import BlockFormat, BlockRejected, chain, model_root
from switchboard.kv.local import LocalBlocks
from switchboard.kv.remote import RedisBlocks
from switchboard.kv.tiers import BlockCache
from switchboard.wire import CacheMiss

FMT = BlockFormat(layers=2, kv_heads=2, head_dim=4, tokens=4)
ROOT = model_root("fp-a", "{{ template }}", 4, "native")


def kv_for(ids: list[int], fmt: BlockFormat = FMT) -> np.ndarray:
    """A KV cache whose values depend on each position's token and the tokens before it (like
    real KV), so a block from another prefix has other numbers."""
    out = np.zeros((fmt.layers, 2, fmt.kv_heads, len(ids), fmt.head_dim), np.float32)
    acc = 0.0
    for t, tok in enumerate(ids):
        acc = acc * 0.5 + tok
        out[:, :, :, t, :] = acc + np.arange(fmt.head_dim) / 10
    return out


# -- keys ---------------------------------------------------------------------------------------
def test_a_key_names_the_whole_prefix():
    a = chain(ROOT, [1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = chain(ROOT, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    c = chain(ROOT, [0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2 and a == b  # only full blocks
    assert c[0] != a[0] and c[1] != a[1]  # the second block's ids are equal, its prefix is not


@pytest.mark.parametrize(
    "other",
    [
        ("fp-b", "{{ template }}", 4, "native"),
        ("fp-a", "{{ other }}", 4, "native"),
        ("fp-a", "{{ template }}", 4, "int8"),
    ],
)
def test_the_root_covers_model_template_and_storage(other):
    assert chain(model_root(*other), [1, 2, 3, 4], 4) != chain(ROOT, [1, 2, 3, 4], 4)


# -- format -------------------------------------------------------------------------------------
@pytest.mark.parametrize("zstd", [False, True])
def test_native_storage_is_lossless(zstd):
    fmt = BlockFormat(2, 2, 4, 4, zstd=zstd)
    kv = kv_for([5, 6, 7, 8])
    key = chain(ROOT, [5, 6, 7, 8], 4)[0]
    out = fmt.decode(key, fmt.encode(key, kv))
    assert out.dtype == np.float32 and np.array_equal(out, kv)


@pytest.mark.parametrize("storage,tol", [("float16", 1e-2), ("int8", 0.05)])
def test_lossy_storage_is_close_and_smaller(storage, tol):
    fmt = BlockFormat(2, 2, 4, 4, storage=storage)
    kv = kv_for([5, 6, 7, 8])
    key = chain(ROOT, [5, 6, 7, 8], 4)[0]
    blob = fmt.encode(key, kv)
    assert len(blob) < len(FMT.encode(key, kv))
    out = fmt.decode(key, blob)
    assert out.dtype == np.float32 and np.allclose(out, kv, atol=tol * np.abs(kv).max())


def _good():
    key = chain(ROOT, [1, 2, 3, 4], 4)[0]
    return key, FMT.encode(key, kv_for([1, 2, 3, 4]))


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[:-1],  # truncated
        lambda b: b[:-1] + bytes([b[-1] ^ 1]),  # one bit flipped in the payload
        lambda b: b[:30],  # cut in the header
        lambda b: b"garbage" + b,
        lambda b: b"",
        lambda b: b.replace(b'"native"', b'"int8"  '),
    ],
)
def test_a_damaged_block_is_rejected(mangle):
    key, blob = _good()
    with pytest.raises(BlockRejected):
        FMT.decode(key, mangle(blob))


def test_a_block_under_another_key_or_secret_or_format_is_rejected():
    key, blob = _good()
    other = chain(ROOT, [9, 9, 9, 9], 4)[0]
    with pytest.raises(BlockRejected, match="header"):
        FMT.decode(other, blob)
    with pytest.raises(BlockRejected, match="digest"):
        BlockFormat(2, 2, 4, 4, secret=b"ours").decode(key, blob)
    with pytest.raises(BlockRejected, match="header"):
        BlockFormat(2, 2, 4, 4, zstd=True).decode(key, blob)
    with pytest.raises(BlockRejected, match="header"):
        BlockFormat(3, 2, 4, 4).decode(key, blob)


def test_a_zstd_bomb_is_rejected():
    import zstandard

    fmt = BlockFormat(2, 2, 4, 4, zstd=True)
    key = chain(ROOT, [1, 2, 3, 4], 4)[0]
    header = fmt._header(key)
    payload = zstandard.ZstdCompressor().compress(b"\0" * (10 << 20))
    blob = b"SBKB1\n" + len(header).to_bytes(4, "little") + header + fmt._digest(header, payload) + payload
    with pytest.raises(BlockRejected):
        fmt.decode(key, blob)


def test_bad_settings_fail_at_once():
    with pytest.raises(ValueError, match="storage"):
        BlockFormat(2, 2, 4, 4, storage="fp8")
    with pytest.raises(ValueError, match="shape"):
        FMT.encode(b"k" * 16, np.zeros((1, 2, 2, 4, 4), np.float32))


# -- local tier ---------------------------------------------------------------------------------
def block(v: float) -> np.ndarray:
    return np.full((1, 2, 1, 4, 4), v, np.float32)  # 128 bytes


def test_local_tier_evicts_least_recently_used_within_budget():
    local = LocalBlocks(budget_bytes=3 * 128)
    for i in range(3):
        local.put(bytes([i]), block(i), priority=2)
    assert local.get(bytes([0]), 2) is not None  # 0 is now the most recent
    local.put(bytes([3]), block(3), priority=2)
    assert bytes([1]) not in local and all(bytes([i]) in local for i in (0, 2, 3))
    assert local.nbytes == 3 * 128 and local.counts["evicted"] == 1


def test_local_tier_keeps_priority_one_blocks_over_priority_two():
    local = LocalBlocks(budget_bytes=4 * 128, vip_share=0.5)
    local.put(b"vip", block(1), priority=1)
    for i in range(5):
        local.put(bytes([i]), block(i), priority=2)
    assert b"vip" in local  # the oldest, but a VIP's
    local.put(b"vip2", block(2), priority=1)
    local.put(b"vip3", block(3), priority=1)  # VIP over half the budget: its oldest goes
    assert b"vip" not in local and b"vip2" in local and b"vip3" in local


def test_a_priority_one_hit_promotes_a_block():
    local = LocalBlocks(budget_bytes=2 * 128)
    local.put(b"a", block(1), priority=2)
    local.put(b"b", block(2), priority=2)
    local.get(b"a", priority=1)
    local.put(b"c", block(3), priority=2)
    assert b"a" in local and b"b" not in local


def test_a_block_over_the_budget_is_not_kept():
    assert LocalBlocks(budget_bytes=100).put(b"a", block(1), 2) is False


# -- both tiers ---------------------------------------------------------------------------------
class FakeRedis:
    """Enough of redis-py's pipeline for RedisBlocks (the real server: tests/integration)."""

    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.down = False
        self.commands: list[tuple] = []

    def pipeline(self, transaction=False):
        return _Pipe(self)


class _Pipe:
    def __init__(self, r):
        self.r, self.ops = r, []

    def exists(self, k):
        self.ops.append(("exists", k))

    def getex(self, k, ex):
        self.ops.append(("get", k))

    def set(self, k, v, ex):
        self.ops.append(("set", k, v))

    def execute(self):
        if self.r.down:
            raise redis.ConnectionError("down")
        self.r.commands.extend(op[:2] for op in self.ops)
        out = []
        for op in self.ops:
            if op[0] == "exists":
                out.append(int(op[1] in self.r.data))
            elif op[0] == "get":
                out.append(self.r.data.get(op[1]))
            else:
                self.r.data[op[1]] = op[2]
                out.append(True)
        return out


def tiers(budget=1 << 20, fake=None, fmt=FMT):
    fake = fake or FakeRedis()
    return BlockCache(fmt, ROOT, LocalBlocks(budget), RedisBlocks(fake, retry_after_s=0.0)), fake


PROMPT = list(range(100, 110))  # 10 tokens: 2 full blocks of 4 usable (9 // 4)


def test_a_turns_blocks_are_found_locally_after_it_finishes():
    cache, fake = tiers()
    assert cache.lookup(PROMPT, 2).tokens == 0
    ids = PROMPT + [7, 8]  # prompt + answer[:-1]
    cache.store(ids, kv_for(ids), 2)
    nxt = ids + [9, 10, 11, 12, 13]
    fake.commands.clear()
    reuse = cache.lookup(nxt, 2, expected=len(ids))
    assert reuse.tokens == 12 and reuse.local_blocks == 3 and reuse.remote_blocks == 0 and reuse.miss is None
    assert np.array_equal(reuse.past, kv_for(ids)[:, :, :, :12])
    assert not [c for c in fake.commands if c[0] == "get"]  # a local hit reads nothing from Redis
    cache.close()


def test_only_new_blocks_are_written_and_another_replica_reads_them():
    cache, fake = tiers()
    first = PROMPT + [7, 8]
    cache.store(first, kv_for(first), 2)
    assert cache.flush()
    written = {k for k, v in fake.data.items()}
    assert len(written) == 3
    second = first + [1, 2, 3, 4, 5]  # one more full block
    fake.commands.clear()
    cache.store(second, kv_for(second), 2)
    assert cache.flush()
    assert [c for c in fake.commands if c[0] == "set"] == [("set", k) for k in set(fake.data) - written]
    other, _ = tiers(fake=fake)  # a second replica: empty local tier, the same Redis
    reuse = other.lookup(second + [6], 2, expected=len(second))
    assert reuse.tokens == 16 and reuse.remote_blocks == 4 and reuse.local_blocks == 0
    assert np.array_equal(reuse.past, kv_for(second)[:, :, :, :16])
    again = other.lookup(second + [6], 2)
    assert again.local_blocks == 4  # fetched once, local from then on
    cache.close()
    other.close()


def test_identical_prefixes_are_stored_once():
    cache, fake = tiers()
    system = [1, 2, 3, 4, 5, 6, 7, 8]
    a, b = system + [20, 21, 22], system + [30, 31, 32]
    cache.store(a, kv_for(a), 2)
    cache.store(b, kv_for(b), 2)
    assert cache.flush() and len(fake.data) == 2  # the two blocks of the shared prefix
    assert cache.lookup(system + [40, 41], 2).tokens == 8


def test_a_missing_block_ends_the_prefix_with_evicted():
    cache, fake = tiers(budget=0)
    ids = PROMPT + [7, 8]
    cache.store(ids, kv_for(ids), 2)
    assert cache.flush()
    second_key = sorted(fake.data, key=list(fake.data).index)[1]
    del fake.data[second_key]
    reuse = cache.lookup(ids + [1], 2, expected=len(ids))
    assert reuse.tokens == 4 and reuse.miss == CacheMiss.EVICTED


def test_a_corrupt_block_is_never_used():
    cache, fake = tiers(budget=0)
    ids = PROMPT + [7, 8]
    cache.store(ids, kv_for(ids), 2)
    assert cache.flush()
    second_key = list(fake.data)[1]
    blob = fake.data[second_key]
    fake.data[second_key] = blob[:-4] + b"\0\0\0\0"
    reuse = cache.lookup(ids + [1], 2, expected=len(ids))
    assert reuse.tokens == 4 and reuse.miss == CacheMiss.DIGEST_FAILED
    assert np.array_equal(reuse.past, kv_for(ids)[:, :, :, :4])


def test_redis_down_means_no_reuse_and_no_error():
    cache, fake = tiers(budget=0)
    ids = PROMPT + [7, 8]
    fake.down = True
    cache.store(ids, kv_for(ids), 2)
    assert cache.flush()
    reuse = cache.lookup(ids + [1], 2, expected=len(ids))
    assert reuse.tokens == 0 and reuse.miss == CacheMiss.REDIS_UNAVAILABLE
    assert cache.snapshot()["writes_failed"] == 1
    fake.down = False  # back: writes and reads work again
    cache.store(ids, kv_for(ids), 2)
    assert cache.flush() and cache.lookup(ids + [1], 2).tokens == 12


def test_without_redis_the_local_tier_still_works():
    cache = BlockCache(FMT, ROOT, LocalBlocks(1 << 20))
    ids = PROMPT + [7, 8]
    cache.store(ids, kv_for(ids), 2)
    assert cache.lookup(ids + [1], 2).tokens == 12
    assert cache.lookup([5] * 13, 2, expected=12).miss == CacheMiss.EVICTED


def test_one_token_is_always_left_to_prefill():
    cache = BlockCache(FMT, ROOT, LocalBlocks(1 << 20))
    ids = list(range(8))
    cache.store(ids, kv_for(ids), 2)
    assert cache.lookup(ids, 2).tokens == 4  # 8 tokens: the second block would leave nothing
    assert cache.lookup(ids + [9], 2).tokens == 8


def test_a_store_with_the_wrong_shape_is_ignored():
    cache = BlockCache(FMT, ROOT, LocalBlocks(1 << 20))
    cache.store(list(range(8)), kv_for(list(range(7))), 2)
    assert cache.lookup(list(range(9)), 2).tokens == 0


def test_a_block_lost_from_redis_is_written_again():
    cache, fake = tiers()
    ids = PROMPT + [7, 8]
    cache.store(ids, kv_for(ids), 2)
    assert cache.flush() and len(fake.data) == 3
    fake.data.clear()  # a restarted Redis, or eviction
    cache.store(ids + [1, 2, 3, 4], kv_for(ids + [1, 2, 3, 4]), 2)
    assert cache.flush() and len(fake.data) == 4

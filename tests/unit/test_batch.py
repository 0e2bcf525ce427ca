import numpy as np
import pytest

from switchboard.engine.batch import KVBatch, prefill_inputs


def cache(layers, heads, n, dim, start):
    kv = np.zeros((layers, 2, heads, n, dim), np.float32)
    kv[..., :, :] = (start + np.arange(n))[None, None, None, :, None]
    return kv


def test_prefill_layout_right_aligns_cached_prefix_and_new_tokens():
    prompts = [[5, 6, 7, 8, 9], [1, 2]]
    ids, mask, pos, past, next_pos = prefill_inputs(
        prompts, [3, 0], [cache(1, 1, 3, 2, 100), None], 1, 1, 2, np.float32
    )
    assert ids.tolist() == [[8, 9], [1, 2]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
    assert pos.tolist() == [[3, 4], [0, 1]]
    assert past[0][0][0, 0, :, 0].tolist() == [100, 101, 102]
    assert next_pos.tolist() == [5, 2]


def test_holes_between_a_short_prefix_and_its_new_tokens():
    _, mask, pos, _, _ = prefill_inputs(
        [[1, 2, 3], [4, 5, 6, 7]], [1, 3], [cache(1, 1, 1, 2, 0), cache(1, 1, 3, 2, 0)], 1, 1, 2, np.float32
    )
    # row 1: three cached tokens, a masked hole, then its one new token
    assert mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 0, 1]]
    assert pos.tolist() == [[1, 2], [0, 3]]


def batch(rows, width, value):
    k = np.full((rows, 1, width, 2), value, np.float32)
    return KVBatch([(k, k.copy())], np.ones((rows, width), np.int64), np.full(rows, width, np.int64))


def test_merge_left_pads_the_narrower_batch_and_select_trims():
    a, b = batch(1, 4, 1.0), batch(2, 2, 2.0)
    m = a.merge(b)
    assert m.size == 3 and m.width == 4
    assert m.mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]]
    assert m.row_cache(1).shape == (1, 2, 1, 2, 2)
    s = m.select([1, 2])
    assert s.width == 2 and s.mask.all()
    assert s.next_pos.tolist() == [2, 2]


def test_a_cache_of_device_tensors_is_laid_out_as_the_arrays_are():
    """``runtime: torch`` keeps the cache on its device: merge, select, trim and a row's cache
    give the same numbers on tensors as on arrays, and only ``row_cache`` comes to the host."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((rows, 2, width, 3)).astype(np.float32) for rows, width in ((2, 5), (1, 2))]
    masks = [np.ones((2, 5), np.int64), np.ones((1, 2), np.int64)]
    masks[0][1, :3] = 0  # a row that joined later

    def layout(make):
        a, b = (KVBatch([(make(x), make(2 * x))], m, np.full(len(m), 9)) for x, m in zip(arrays, masks))
        merged = a.merge(b)
        return merged, merged.select([1, 2])

    (on_host, picked_on_host), (on_device, picked_on_device) = layout(np.asarray), layout(torch.from_numpy)
    assert isinstance(on_device.kv[0][0], torch.Tensor) and isinstance(picked_on_device.kv[0][1], torch.Tensor)
    for host, device in ((on_host, on_device), (picked_on_host, picked_on_device)):
        assert host.width == device.width and (host.mask == device.mask).all()
        for a, t in zip(host.kv[0], device.kv[0]):
            assert np.array_equal(a, t.numpy())
        for row in range(host.size):
            cache = device.row_cache(row, np.dtype(np.float16))
            assert cache.dtype == np.float16 and np.array_equal(cache, host.row_cache(row).astype(np.float16))


def test_compaction_closes_the_holes_rejected_drafts_leave():
    """A row whose draft was rejected keeps those columns, masked, right of its first real one:
    ``holes`` counts them (not the padding on a row's left), and ``compacted`` moves each row's
    real columns together on its right, in order, with the width the longest row needs."""
    k = np.arange(2 * 6, dtype=np.float32).reshape(2, 1, 6, 1)
    mask = np.array([[1, 1, 0, 0, 1, 0], [0, 0, 1, 1, 1, 1]], np.int64)
    b = KVBatch([(k, -k)], mask, np.array([3, 4]))
    assert b.holes() == 3
    c = b.compacted()
    assert c.holes() == 0 and c.width == 4 and c.next_pos.tolist() == [3, 4]
    assert c.mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert c.kv[0][0][0, 0, 1:, 0].tolist() == [0, 1, 4] and c.kv[0][1][1, 0, :, 0].tolist() == [-8, -9, -10, -11]
    for row in range(2):
        assert np.array_equal(c.row_cache(row), b.row_cache(row))


def test_compaction_of_device_tensors_is_the_arrays_compaction():
    torch = pytest.importorskip("torch")
    k = np.random.default_rng(1).standard_normal((2, 2, 5, 3)).astype(np.float32)
    mask = np.array([[1, 0, 1, 0, 1], [0, 1, 1, 0, 1]], np.int64)
    host = KVBatch([(k, 2 * k)], mask, np.array([3, 3])).compacted()
    device = KVBatch([(torch.from_numpy(k), torch.from_numpy(2 * k))], mask.copy(), np.array([3, 3])).compacted()
    assert isinstance(device.kv[0][0], torch.Tensor) and (device.mask == host.mask).all()
    for a, t in zip(host.kv[0], device.kv[0]):
        assert np.array_equal(a, t.numpy())

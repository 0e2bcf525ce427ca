import numpy as np

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

"""The packed pass (engine/packing.py, engine/packed_torch.py): its layout, and on tiny random
Llama and Gemma 3 models the same logits and grown cache as the padded pass over the same rows,
for a prompt's chunk on a cached prefix, a decode row and a row verifying drafts in one pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from switchboard.engine import packed_torch
from switchboard.engine.masks import windowed
from switchboard.engine.packing import LANES, from_padded, pack, spread
from tests.packed_rows import SCENARIOS, assert_same_cache, batch, padded_forward, padded_inputs, saved, tiny


def test_rows_are_packed_right_aligned_in_the_grid():
    mask = np.array([[0, 1, 1], [1, 1, 1]])
    p = pack([[7, 8, 9], [5]], np.array([2, 3]), mask, keep=[2, 1])
    assert p.input_ids.tolist() == [[7, 8, 9, 5]]
    assert p.position_ids.tolist() == [[2, 3, 4, 3]]
    assert p.width == 3 and p.token_index.tolist() == [0, 1, 2, 5]  # row 1's token in its last column
    assert p.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 1]]
    assert p.logits_index.tolist() == [1, 2, 3] and p.logits_rows.tolist() == [0, 0, 1]
    assert (p.tokens, p.padded_tokens()) == (4, 6)
    # row 0 attends alone (the wide lane); row 1 in the narrow grid [2, 1]
    assert p.wide_row.tolist() == [0] and p.wide_tokens.tolist() == [0, 1, 2]
    assert p.narrow_tokens.tolist() == [3] and p.narrow_slot.tolist() == [1] and p.narrow_width == 1
    assert p.narrow_positions.tolist() == [[0], [3]]


def test_a_row_without_new_tokens_only_grows_masked_columns():
    p = pack([[], [4, 5]], np.array([1, 1]), np.ones((2, 1), np.int64))
    assert p.token_index.tolist() == [2, 3] and p.attention_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert p.logits_index.tolist() == [1] and p.logits_rows.tolist() == [1]
    assert p.wide_row.tolist() == [1] and p.narrow_tokens.size == 0 and p.narrow_width == 0


def test_a_padded_pass_is_packed_and_its_logits_spread_back():
    # a decode row, a row verifying two drafted tokens: the padded pass feeds [2, 3]
    ids = np.array([[0, 0, 7], [4, 5, 6]])
    mask = np.array([[1, 1, 0, 0, 1], [0, 1, 1, 1, 1]])
    pos = np.array([[0, 0, 2], [2, 3, 4]])
    p = from_padded(ids, mask, pos, keep=3)
    assert p.input_ids.tolist() == [[7, 4, 5, 6]] and p.position_ids.tolist() == [[2, 2, 3, 4]]
    assert p.attention_mask.tolist() == mask.tolist() and p.width == 3
    assert p.logits_rows.tolist() == [0, 1, 1, 1]
    logits = np.arange(4, dtype=np.float32)[:, None] + 1  # [K, 1]: token k's logit is k + 1
    assert spread(logits, p, 3)[..., 0].tolist() == [[0, 0, 1], [2, 3, 4]]
    assert from_padded(ids[:, -1:], np.ones((2, 3)), pos[:, -1:]) is None  # one token a row: nothing padded
    left_over = mask.copy()
    left_over[1, 3] = 0  # a hole among a row's new columns: not a padded pass's layout
    assert from_padded(ids, left_over, pos, keep=3) is None


@pytest.mark.parametrize(
    "new, keep, error",
    [([], None, "at least one row"), ([[1]], [2], "logits asked"), ([[1], [2]], None, "2 rows of tokens")],
)
def test_packing_what_cannot_be_packed_is_an_error(new, keep, error):
    with pytest.raises(ValueError, match=error):
        pack(new, np.zeros(1, np.int64), np.ones((1, 2), np.int64), keep)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_packed_pass_is_the_padded_pass(family, scenario):
    model = tiny(family)
    prefixes, layout, rows = SCENARIOS[scenario]
    past, mask, next_pos = batch(model, prefixes, layout)
    p = pack([new for new, _ in rows], next_pos, mask, [keep for _, keep in rows])
    if scenario == "mixed":
        assert (p.tokens, p.padded_tokens(), p.narrow_width) == (9, 15, 3)
    with torch.no_grad():
        want_logits, want_cache = padded_forward(model, p, past)
    packed_torch.register()
    model.set_attn_implementation(packed_torch.PACKED)
    t = {name: torch.from_numpy(getattr(p, name)) for name in ("input_ids", "attention_mask", "position_ids")}
    lanes = {name: torch.from_numpy(getattr(p, name)) for name in LANES}
    with torch.no_grad():
        logits, cache = packed_torch.packed_forward(
            model, windowed(model.config), t["input_ids"], t["attention_mask"], t["position_ids"],
            torch.from_numpy(p.token_index), torch.from_numpy(p.logits_index), past, lanes,
        )  # fmt: skip
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    assert_same_cache(cache, want_cache, p.attention_mask)


@pytest.mark.parametrize("scenario", ["mixed", "chunk last"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_torch_runtime_packs_a_padded_pass(family, scenario, tmp_path):
    """``runtime: torch``'s model takes both passes (SDPA padded, the two lanes packed): the
    padded inputs' packed pass has the padded pass's logits and grown cache."""
    from switchboard.engine.torch_runtime import TorchDecoder

    model = tiny(family)
    decoder = TorchDecoder(tmp_path, saved(model, tmp_path), "cpu", threads=1)
    prefixes, layout, rows = SCENARIOS[scenario]
    past, mask, next_pos = batch(decoder.model, prefixes, layout)
    keep = max(k for _, k in rows)
    ids, grown, pos = padded_inputs(pack([new for new, _ in rows], next_pos, mask))
    want_logits, want_cache = decoder.forward(ids, grown, pos, past, keep=keep)
    p = from_padded(ids, grown, pos, keep)
    assert decoder.packs and p.tokens < ids.size
    logits, cache = decoder.forward_packed(p, past)
    for row, (new, _) in enumerate(rows):  # each row's real positions among the last keep
        k = min(keep, len(new))
        np.testing.assert_allclose(spread(logits, p, keep)[row, -k:], want_logits[row, -k:], rtol=1e-5, atol=1e-5)
    assert_same_cache(cache, want_cache, grown)

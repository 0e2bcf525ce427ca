"""The packed pass (engine/packing.py, engine/packed_torch.py): its layout, and on tiny random
Llama and Gemma 3 models the same logits and grown cache as the padded pass over the same rows,
for a prompt's chunk on a cached prefix, a decode row and a row verifying drafts in one pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, Gemma3TextConfig, LlamaConfig

from switchboard.engine import packed_torch
from switchboard.engine.masks import position_masks, unslide, windowed
from switchboard.engine.packing import pack

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, max_position_embeddings=256)


def test_rows_are_packed_right_aligned_in_the_grid():
    mask = np.array([[0, 1, 1], [1, 1, 1]])
    p = pack([[7, 8, 9], [5]], np.array([2, 3]), mask, keep=[2, 1])
    assert p.input_ids.tolist() == [[7, 8, 9, 5]]
    assert p.position_ids.tolist() == [[2, 3, 4, 3]]
    assert p.width == 3 and p.token_index.tolist() == [0, 1, 2, 5]  # row 1's token in its last column
    assert p.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 1]]
    assert p.logits_index.tolist() == [1, 2, 3] and p.logits_rows.tolist() == [0, 0, 1]
    assert (p.tokens, p.padded_tokens()) == (4, 6)


def test_a_row_without_new_tokens_only_grows_masked_columns():
    p = pack([[], [4, 5]], np.array([1, 1]), np.ones((2, 1), np.int64))
    assert p.token_index.tolist() == [2, 3] and p.attention_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert p.logits_index.tolist() == [1] and p.logits_rows.tolist() == [1]


@pytest.mark.parametrize(
    "new, keep, error",
    [([], None, "at least one row"), ([[1]], [2], "logits asked"), ([[1], [2]], None, "2 rows of tokens")],
)
def test_packing_what_cannot_be_packed_is_an_error(new, keep, error):
    with pytest.raises(ValueError, match=error):
        pack(new, np.zeros(1, np.int64), np.ones((1, 2), np.int64), keep)


def tiny(family: str):
    torch.manual_seed(0)
    if family == "llama":
        config = LlamaConfig(vocab_size=97, num_hidden_layers=2, num_key_value_heads=2, **TINY)
    else:  # a sliding window shorter than the rows: the window is counted in positions
        config = Gemma3TextConfig(
            vocab_size=97, num_hidden_layers=3, num_key_value_heads=1, head_dim=32, sliding_window=3,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"], **TINY,
        )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval()
    if windowed(model.config) is None:
        unslide(model.config)
    return model


def batch(model, rows: list[list[int]], layout: list[list[int]]):
    """Each row's prefix run one row at a time, laid out in one cache [B, G, T, D] by ``layout``
    (1: the row's next prefix column, 0: a masked column on its left or a hole)."""
    cfg = model.config
    g, d = cfg.num_key_value_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    t = len(layout[0])
    kv = [(torch.zeros(len(rows), g, t, d), torch.zeros(len(rows), g, t, d)) for _ in range(cfg.num_hidden_layers)]
    for i, (prefix, cols) in enumerate(zip(rows, layout)):
        full = DynamicCache()  # every layer keeps every column, as the engine's cache does
        for layer in range(cfg.num_hidden_layers):
            full.update(torch.zeros(1, g, 0, d), torch.zeros(1, g, 0, d), layer)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prefix]), past_key_values=full, use_cache=True)
        at = [j for j, c in enumerate(cols) if c]
        for (k, v), layer in zip(kv, out.past_key_values.layers):
            k[i, :, at], v[i, :, at] = layer.keys[0], layer.values[0]
    return kv, np.array(layout, np.int64), np.array([len(r) for r in rows], np.int64)


def padded_forward(model, p, past):
    """The padded pass over the same rows, as engine/torch_runtime.py runs it: [B, S] inputs."""
    b, s = p.attention_mask.shape[0], p.width
    ids, pos = np.zeros(b * s, np.int64), np.zeros(b * s, np.int64)
    ids[p.token_index], pos[p.token_index] = p.input_ids[0], p.position_ids[0]
    ids, pos, mask = (torch.from_numpy(a.reshape(b, -1)) for a in (ids, pos, p.attention_mask))
    window = windowed(model.config)
    if window is not None:
        mask = position_masks(mask, pos, window, torch.float32)
    cache = DynamicCache()
    for i, (k, v) in enumerate(past):
        cache.update(k, v, i)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
    logits = out.logits.reshape(b * s, -1)[torch.from_numpy(p.token_index[p.logits_index])]
    return logits, [(layer.keys, layer.values) for layer in out.past_key_values.layers]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_packed_pass_is_the_padded_pass(family):
    model = tiny(family)
    prefixes = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14, 15, 16, 17]]
    # row 0 joined late (masked on its left); row 2 has a hole: a rejected draft's column
    layout = [[0, 0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 1, 1, 0]]
    past, mask, next_pos = batch(model, prefixes, layout)
    # a prompt's 5-token chunk, a decode step, a row verifying 2 drafted tokens
    new, keep = [[20, 21, 22, 23, 24], [30], [40, 41, 42]], [5, 1, 3]
    p = pack(new, next_pos, mask, keep)
    assert (p.tokens, p.padded_tokens()) == (9, 15)
    with torch.no_grad():
        want_logits, want_cache = padded_forward(model, p, past)
    packed_torch.register()
    model.set_attn_implementation(packed_torch.PACKED)
    t = {name: torch.from_numpy(getattr(p, name)) for name in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        logits, cache = packed_torch.packed_forward(
            model, windowed(model.config), t["input_ids"], t["attention_mask"], t["position_ids"],
            torch.from_numpy(p.token_index), torch.from_numpy(p.logits_index), past,
        )  # fmt: skip
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    real = torch.from_numpy(p.attention_mask.astype(bool))
    for (k, v), (wk, wv) in zip(cache, want_cache):
        assert k.shape == wk.shape == (3, model.config.num_key_value_heads, 7 + 5, k.shape[-1])
        for i in range(3):  # the real columns: a masked one holds whatever its pass wrote there
            torch.testing.assert_close(k[i][:, real[i]], wk[i][:, real[i]], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(v[i][:, real[i]], wv[i][:, real[i]], rtol=1e-5, atol=1e-5)

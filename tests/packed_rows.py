"""Tiny random models and a batch of rows in the engine's layout, for the packed pass's tests
(tests/unit/test_packed_pass.py, tests/export/test_packed_graph.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache, Gemma3TextConfig, LlamaConfig

from switchboard.artifact.geometry import geometry
from switchboard.artifact.manifest import Manifest
from switchboard.engine.masks import position_masks, unslide, windowed

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, max_position_embeddings=256)
PREFIXES = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14, 15, 16, 17]]
# row 0 joined late (masked on its left); row 2 has a hole: a rejected draft's column
LAYOUT = [[0, 0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 1, 1, 0]]
# a prompt's 5-token chunk, a decode step, a row verifying 2 drafted tokens: (new tokens, logits kept)
ROWS = [([20, 21, 22, 23, 24], 5), ([30], 1), ([40, 41, 42], 3)]
# (prefixes, layout, rows) by name: the mixed pass above; the chunk in the last row; one row alone
# (the narrow lane empty); decode rows alone (the wide lane one token)
SCENARIOS = {
    "mixed": (PREFIXES, LAYOUT, ROWS),
    "chunk last": (PREFIXES, LAYOUT, [([30], 1), ([40, 41], 2), ([20, 21, 22, 23, 24], 1)]),
    "one row": ([[5, 6, 7]], [[1, 1, 1]], [([20, 21], 2)]),
    "decode rows": (PREFIXES, LAYOUT, [([30], 1), ([31], 1), ([32], 1)]),
}


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


def padded_inputs(p) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The padded pass's ``input_ids`` and ``position_ids`` [B, S] and ``attention_mask`` for the
    rows ``p`` packs."""
    b, s = p.attention_mask.shape[0], p.width
    ids, pos = np.zeros(b * s, np.int64), np.zeros(b * s, np.int64)
    ids[p.token_index], pos[p.token_index] = p.input_ids[0], p.position_ids[0]
    return ids.reshape(b, s), p.attention_mask, pos.reshape(b, s)


def saved(model, directory: Path) -> Manifest:
    """``model`` saved as a checkpoint in ``directory``, and a manifest of its geometry."""
    model.save_pretrained(directory)
    geo = geometry(model.config)
    return Manifest(
        name="tiny", fingerprint="tiny", num_layers=geo.num_layers, num_kv_heads=geo.num_kv_heads,
        head_dim=geo.head_dim, vocab_size=geo.vocab_size, context_window=geo.context_window,
        eos_token_ids=[1], end_of_turn_id=1, system_prompt=None,
    )  # fmt: skip


def padded_forward(model, p, past):
    """The padded pass over the same rows, as engine/torch_runtime.py runs it: [B, S] inputs."""
    ids, mask, pos = (torch.from_numpy(a) for a in padded_inputs(p))
    b, s = ids.shape
    window = windowed(model.config)
    if window is not None:
        mask = position_masks(mask, pos, window, torch.float32)
    cache = DynamicCache()
    for i, (k, v) in enumerate(past):
        cache.update(k, v, i)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
    logits = out.logits.reshape(b * s, -1)[torch.from_numpy(p.token_index[p.logits_index])]
    return logits, [(layer.keys, layer.values) for layer in out.past_key_values.layers]


def assert_same_cache(cache, want, mask: np.ndarray) -> None:
    """Each layer's grown cache [B, G, T + S, D] as ``want``'s in the columns ``mask`` marks real
    (a masked one holds whatever its pass wrote there)."""
    real = torch.from_numpy(mask.astype(bool))
    for pair, want_pair in zip(cache, want):
        for a, w in zip(pair, want_pair):
            a = torch.as_tensor(a)
            assert a.shape == w.shape and a.shape[2] == mask.shape[1], (a.shape, w.shape)
            for i in range(mask.shape[0]):
                torch.testing.assert_close(a[i][:, real[i]], w[i][:, real[i]], rtol=1e-5, atol=1e-5)

"""Hugging Face causal LM -> ONNX decoder with KV-cache inputs and outputs (one graph).

transformers 5 takes a ``DynamicCache``, not tuples; the wrapper takes flat key/value tensors,
builds the cache, and returns flat ``present`` tensors, which the dynamo exporter handles.
The graph returns the logits of the positions ``logits_index`` [K] names (counted from the
end when negative, the same for every row), [B, K, V]. It defaults to ``[-1]``, each row's last
position: all a prefill or a plain decode step samples from (a 400-token prefill at a 152k
vocabulary would otherwise make a 243 MB tensor), and what a caller that does not feed it gets
(Triton's native backends, TensorRT). A decode step that verifies drafts (speculative decoding)
asks for its last ``1 + draft`` positions. Rows are right-aligned (switchboard/engine/batch.py),
so position -1 is every row's last real token.

Grouped-query attention is exported as ``grouped_attention``: each KV head's query heads are
stacked as rows of one matrix product with the cache, instead of the stock path's copy of every
KV head per query head (``repeat_kv``: an Expand and a Transpose of the whole cache per layer
and step). At 0.5B (14 query heads, 2 KV heads) that copy was half of a decode step at batch 8
(docs/benchmarks.md); the arithmetic is the same, and the parity check compares the graph
with the stock PyTorch model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from switchboard.artifact.geometry import Geometry
from switchboard.engine.masks import position_masks, unslide, windowed

log = logging.getLogger(__name__)

GROUPED = "switchboard_grouped"  # the attention implementation the graph is traced with


def grouped_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Attention for ``query`` [B, H, Q, D] over ``key``/``value`` [B, G, K, D] with H = G * R:
    query head h reads KV head h // R (as ``repeat_kv``), here by viewing the queries as
    [B, G, R * Q, D] so each KV head is used once, never copied. ``attention_mask`` is additive,
    [B, 1, Q, K]. Returns [B, Q, H, D] and no weights, like the stock implementations."""
    b, h, q, d = query.shape
    g = key.shape[1]
    r = h // g
    scores = torch.matmul(query.reshape(b, g, r * q, d), key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        k = scores.shape[-1]
        scores = (scores.view(b, g, r, q, k) + attention_mask[:, :, None]).view(b, g, r * q, k)
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value).view(b, h, q, d)
    return out.transpose(1, 2).contiguous(), None


def _register_grouped() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(GROUPED, grouped_attention)
    AttentionMaskInterface.register(GROUPED, eager_mask)  # additive float mask, [B, 1, Q, K]


def _uses_grouped_query_attention(model) -> bool:
    cfg = model.config
    kv = getattr(cfg, "num_key_value_heads", None)
    return cfg.model_type != "gpt2" and kv is not None and kv < cfg.num_attention_heads


class DecoderWrapper(torch.nn.Module):
    def __init__(self, model, num_layers: int):
        super().__init__()
        self.model = model
        self.num_layers = num_layers
        self.window = windowed(model.config)
        if self.window is None:
            unslide(model.config)  # the whole cache within a context capped at the window

    def forward(self, input_ids, attention_mask, position_ids, logits_index, *past):
        from transformers import DynamicCache

        cache = DynamicCache()  # full layers: present = past + new, for every family
        for i in range(self.num_layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        if self.window is not None:  # sliding and global layers: windows counted in positions
            attention_mask = position_masks(attention_mask, position_ids, self.window, past[0].dtype)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=logits_index,  # only these positions' logits leave the graph: [B, K, V]
        )
        present = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


LOGITS_INDEX = "logits_index"


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    inputs = ["input_ids", "attention_mask", "position_ids", LOGITS_INDEX]
    outputs = ["logits"]
    for i in range(num_layers):
        inputs += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outputs += [f"present.{i}.key", f"present.{i}.value"]
    return inputs, outputs


def export(model, geo: Geometry, path: Path) -> Path:
    """Export ``model`` (eval mode, fp32) to ``path``; large models get external data."""
    wrapper = DecoderWrapper(model, geo.num_layers).eval()
    stock = model.config._attn_implementation
    if _uses_grouped_query_attention(model):
        _register_grouped()
        model.set_attn_implementation(GROUPED)
    batch, new, past_len = 2, 3, 4
    # A few new tokens on top of a short past: a one-token sample trips dynamo on is_causal.
    sample = [
        torch.randint(0, geo.vocab_size, (batch, new)),
        torch.ones(batch, past_len + new, dtype=torch.long),
        torch.arange(past_len, past_len + new).repeat(batch, 1),
        torch.tensor([-2, -1]),  # two, not one: dynamo fixes a dimension of size 1
    ]
    # Distinct tensors: the exporter aliases inputs that are the same object, which would
    # wire one layer's key input into its value path.
    sample += [torch.randn(batch, geo.num_kv_heads, past_len, geo.head_dim) for _ in range(2 * geo.num_layers)]
    b, s, p, t, k = (torch.export.Dim(n) for n in ("batch", "sequence", "past", "total", "keep"))
    # *past is one varargs entry: its shapes go in one nested tuple.
    dynamic = (
        {0: b, 1: s},
        {0: b, 1: t},
        {0: b, 1: s},
        {0: k},
        tuple({0: b, 2: p} for _ in range(2 * geo.num_layers)),
    )
    inputs, outputs = io_names(geo.num_layers)
    try:
        trace(wrapper, tuple(sample), inputs, outputs, dynamic, path, _large(model))
    finally:  # the parity check and the accuracy gate run the stock model
        model.set_attn_implementation(stock)
    _default_last_position(path)
    return path


def _large(model) -> bool:
    """Whether ``model``'s FP32 weights need ONNX's external data (over 1 GiB)."""
    return sum(x.numel() for x in model.parameters()) * 4 > (1 << 30)


def trace(module, sample: tuple, inputs: list[str], outputs: list[str], dynamic, path: Path, large: bool) -> Path:
    """``module`` on ``sample`` traced by torch.export into ONNX at ``path``: ``dynamic`` its
    dynamic shapes, ``large`` the weights as external data beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        program = torch.onnx.export(
            module,
            sample,
            input_names=inputs,
            output_names=outputs,
            dynamic_shapes=dynamic,
            dynamo=True,
            optimize=True,
            external_data=large,
        )
    program.save(str(path), external_data=large)
    return path


def _default_last_position(path: Path) -> None:
    """Give ``logits_index`` the default ``[-1]`` (an initializer of the input's name): a caller
    that does not feed it gets the last position's logits."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), LOGITS_INDEX))
    onnx.save(model, str(path))


# -- the packed pass (engine/packing.py) ----------------------------------------------------------


class PackedDecoderWrapper(torch.nn.Module):
    """The packed pass (engine/packed_torch.py) as one graph: ``input_ids`` and ``position_ids``
    [1, N], ``attention_mask`` [B, T + S], ``token_index`` [N], ``logits_index`` [K] (packed
    tokens), the attention lanes (``packing.LANES``) and the past [B, G, T, D]; returns
    logits [K, V] and the present [B, G, T + S, D]."""

    def __init__(self, model, num_layers: int):
        super().__init__()
        self.model, self.num_layers = model, num_layers
        self.window = windowed(model.config)
        if self.window is None:
            unslide(model.config)

    def forward(self, input_ids, attention_mask, position_ids, token_index, logits_index, *rest):
        from switchboard.engine.packed_torch import packed_forward
        from switchboard.engine.packing import LANES

        lanes = dict(zip(LANES, rest[: len(LANES)]))
        past = rest[len(LANES) :]
        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)]
        logits, present = packed_forward(
            self.model, self.window, input_ids, attention_mask, position_ids, token_index, logits_index, pairs, lanes
        )
        return (logits, *[a for pair in present for a in pair])


def packed_io_names(num_layers: int) -> tuple[list[str], list[str]]:
    from switchboard.engine.packing import INPUTS

    inputs, outputs = io_names(num_layers)
    return list(INPUTS) + inputs[4:], outputs


def export_packed(model, geo: Geometry, path: Path) -> Path:
    """``model`` (eval mode, fp32) as the packed pass's graph at ``path``."""
    import numpy as np

    from switchboard.engine import packed_torch
    from switchboard.engine.packing import pack

    wrapper = PackedDecoderWrapper(model, geo.num_layers).eval()
    stock = model.config._attn_implementation
    packed_torch.register()
    model.set_attn_implementation(packed_torch.PACKED)
    # rows 0, 1, 2 take 4, 2 and 3 new tokens: row 0 is the wide lane, the narrow grid [3, 3]
    rows, past_len = 3, 4
    p = pack([[5, 6, 7, 8], [9, 10], [11, 12, 13]], np.full(rows, past_len), np.ones((rows, past_len)), [2, 2, 2])
    sample = [torch.from_numpy(a) for a in p.inputs().values()]
    sample += [torch.randn(rows, geo.num_kv_heads, past_len, geo.head_dim) for _ in range(2 * geo.num_layers)]
    b, n, past, t, k = (torch.export.Dim(name) for name in ("batch", "tokens", "past", "total", "keep"))
    narrow, s, c = (torch.export.Dim(name) for name in ("narrow_tokens", "narrow_width", "wide_tokens"))
    # the lanes and the past are one varargs entry: their shapes go in one nested tuple
    lanes = ({0: narrow}, {0: narrow}, {0: b, 1: s}, {0: c}, None)
    pasts = tuple({0: b, 2: past} for _ in range(2 * geo.num_layers))
    dynamic = ({1: n}, {0: b, 1: t}, {1: n}, {0: n}, {0: k}, lanes + pasts)
    inputs, outputs = packed_io_names(geo.num_layers)
    try:
        return trace(wrapper, tuple(sample), inputs, outputs, dynamic, path, _large(model))
    finally:
        model.set_attn_implementation(stock)

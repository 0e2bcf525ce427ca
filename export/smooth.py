"""Activation smoothing before INT8 (SmoothQuant, Xiao et al. 2023), exact in FP32.

INT8 quantizes a MatMul's input with one scale for the whole tensor (per token batch in the
dynamic variant, calibrated in the static ones), so a few input channels with large values
cost every other channel its resolution. For an input channel ``j`` with largest activation
``max|x_j|`` and largest weight ``max|W_j|``, dividing the activation by

    s_j = max|x_j| ** alpha / max|W_j| ** (1 - alpha)

and multiplying the weight's column by it leaves the product unchanged and evens out the
activation's channels (the weight's are quantized per channel already). The division is folded
into what produces the activation, so the graph has no extra op:

- q/k/v and gate/up projections: into the RMSNorm weight in front of them (Gemma's norms
  scale by ``1 + w``, so there ``w`` becomes ``(1 + w) / s - 1``);
- o_proj: into v_proj's output rows (attention is linear in V; with grouped-query attention
  one scale per KV head channel, shared by the query heads that read it);
- down_proj: into up_proj's output rows (``act(gate(x)) * up(x)`` is linear in ``up``).

Llama, Qwen2, Mistral and Gemma 3 blocks have this shape (Gemma's MLP norm is
``pre_feedforward_layernorm``; its ``post_*`` norms act on a block's output and are left alone);
other families are left as they are. The
smoothed model computes the same function (checked on the calibration prompts); only the INT8
variants are made from it.
"""

from __future__ import annotations

import copy
import logging

import torch

log = logging.getLogger(__name__)
_EPS = 1e-5


def supported(model) -> bool:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return False
    names = {n for n, _ in layers[0].named_modules()}
    need = {
        "input_layernorm",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    }
    return need <= names and ("post_attention_layernorm" in names or "pre_feedforward_layernorm" in names)


def _mlp_norm(layer):
    """The norm in front of the MLP: Gemma's pre_feedforward_layernorm (its
    post_attention_layernorm normalizes the attention's output), else post_attention_layernorm."""
    return getattr(layer, "pre_feedforward_layernorm", None) or layer.post_attention_layernorm


def _fold(norm, s: torch.Tensor) -> None:
    """Divide what ``norm`` outputs by ``s``, per channel."""
    if type(norm).__name__.startswith("Gemma"):  # y = x_hat * (1 + w)
        norm.weight.copy_((1 + norm.weight) / s - 1)
    else:
        norm.weight.div_(s)


@torch.no_grad()
def input_maxima(model, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
    """Largest |activation| per input channel of every projection, over the prompts."""
    stats: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(module, args):
            x = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0)
            stats[name] = torch.maximum(stats[name], x) if name in stats else x

        return record

    handles = []
    for i, layer in enumerate(model.model.layers):
        for name, module in (
            ("qkv", layer.self_attn.q_proj),
            ("o", layer.self_attn.o_proj),
            ("gate_up", layer.mlp.gate_proj),
            ("down", layer.mlp.down_proj),
        ):
            handles.append(module.register_forward_pre_hook(hook(f"{i}.{name}")))
    try:
        for p in prompts:
            model(torch.tensor([p]))
    finally:
        for h in handles:
            h.remove()
    return stats


def _scales(x_max: torch.Tensor, w_max: torch.Tensor, alpha: float) -> torch.Tensor:
    return (x_max.clamp(min=_EPS) ** alpha / w_max.clamp(min=_EPS) ** (1 - alpha)).clamp(min=_EPS)


def _column_max(*linears) -> torch.Tensor:
    return torch.stack([m.weight.abs().amax(0) for m in linears]).amax(0)


@torch.no_grad()
def smoothed(model, prompts: list[list[int]], alpha: float = 0.5, tolerance: float = 1e-3):
    """A smoothed copy of ``model`` (``None`` when its family is not supported or the copy
    does not compute the same logits within ``tolerance``, relative)."""
    if not supported(model):
        log.info("smoothing: %s blocks have another shape; INT8 from the plain graph", type(model).__name__)
        return None
    out = copy.deepcopy(model).eval()
    stats = input_maxima(out, prompts)
    cfg = out.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = cfg.num_key_value_heads
    groups = cfg.num_attention_heads // kv_heads
    for i, layer in enumerate(out.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        s = _scales(stats[f"{i}.qkv"], _column_max(attn.q_proj, attn.k_proj, attn.v_proj), alpha)
        _fold(layer.input_layernorm, s)
        for m in (attn.q_proj, attn.k_proj, attn.v_proj):
            m.weight.mul_(s)
        s = _scales(stats[f"{i}.gate_up"], _column_max(mlp.gate_proj, mlp.up_proj), alpha)
        _fold(_mlp_norm(layer), s)
        for m in (mlp.gate_proj, mlp.up_proj):
            m.weight.mul_(s)
        s = _scales(stats[f"{i}.down"], _column_max(mlp.down_proj), alpha)
        mlp.up_proj.weight.div_(s[:, None])
        if mlp.up_proj.bias is not None:
            mlp.up_proj.bias.div_(s)
        mlp.down_proj.weight.mul_(s)
        # o_proj's input channel (query head h, dim d) is V's (KV head h // groups, dim d).
        x = stats[f"{i}.o"].view(kv_heads, groups, head_dim).amax(1)
        w = attn.o_proj.weight.abs().amax(0).view(kv_heads, groups, head_dim).amax(1)
        s = _scales(x, w, alpha).reshape(-1)
        attn.v_proj.weight.div_(s[:, None])
        if attn.v_proj.bias is not None:
            attn.v_proj.bias.div_(s)
        attn.o_proj.weight.mul_(s.view(kv_heads, 1, head_dim).expand(-1, groups, -1).reshape(-1))
    worst = 0.0
    for p in prompts[:: max(1, len(prompts) // 4)][:4]:
        ids = torch.tensor([p])
        ref, got = model(ids).logits, out(ids).logits
        live = ref > torch.finfo(ref.dtype).min  # a restricted head's floor (engine/heads.py) is not a logit
        worst = max(worst, float((got - ref)[live].abs().max() / ref[live].abs().max().clamp(min=_EPS)))
    if worst > tolerance:
        log.warning("smoothing changed the logits by %.1e (relative); INT8 from the plain graph", worst)
        return None
    log.info("smoothing (alpha %.2f): %d layers, logits within %.1e (relative)", alpha, len(out.model.layers), worst)
    return out


# --- Whisper (switchboard.export.asr) ----------------------------------------------------------
#
# Whisper's blocks are pre-LayerNorm with biases, so the same folds exist, one more, one fewer:
# - self-attention q/k/v and fc1: into the LayerNorm in front of them (weight and bias);
# - each out_proj: into the v_proj whose values it reads (self and cross attention; no GQA);
# - the decoder's cross-attention q: into encoder_attn_layer_norm; its k/v read the encoder's
#   last LayerNorm, shared by every decoder layer, so one scale for all of them goes there;
# - fc2 reads GELU(fc1(x)), not linear in fc1: it stays as it is, and so does the output
#   projection, which is the token embedding (tied).


def whisper_linears(model) -> dict[str, list]:
    """Every quantized projection of a Whisper model by the input it reads: name -> modules."""
    out: dict[str, list] = {}
    enc, dec = model.model.encoder, model.model.decoder
    for side, layers in (("encoder", enc.layers), ("decoder", dec.layers)):
        for i, layer in enumerate(layers):
            a = layer.self_attn
            out[f"{side}.{i}.qkv"] = [a.q_proj, a.k_proj, a.v_proj]
            out[f"{side}.{i}.out"] = [a.out_proj]
            if side == "decoder":
                c = layer.encoder_attn
                out[f"{side}.{i}.cross_q"] = [c.q_proj]
                out[f"{side}.{i}.cross_out"] = [c.out_proj]
            out[f"{side}.{i}.fc1"] = [layer.fc1]
            out[f"{side}.{i}.fc2"] = [layer.fc2]
    out["decoder.cross_kv"] = [
        m for layer in dec.layers for m in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)
    ]
    return out


@torch.no_grad()
def whisper_input_maxima(model, run) -> dict[str, torch.Tensor]:
    """Largest |activation| per input channel of every projection (``whisper_linears``' names)
    while ``run()`` drives the model (generation on calibration speech)."""
    stats: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(module, args):
            x = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float()
            stats[name] = torch.maximum(stats[name], x) if name in stats else x

        return hook

    handles = [m.register_forward_pre_hook(record(name)) for name, ms in whisper_linears(model).items() for m in ms]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return stats


def outliers(stats: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Per projection input: its largest |activation|, the median channel's largest, their
    ratio (how far the outlier channels stand out: what one INT8 scale per tensor must cover),
    and how many channels reach 10x the median."""
    out = {}
    for name, x in stats.items():
        med = float(x.median().clamp(min=_EPS))
        out[name] = {
            "max": float(x.max()),
            "median": med,
            "ratio": float(x.max()) / med,
            "channels_over_10x": int((x > 10 * med).sum()),
            "channels": int(x.numel()),
            "top_channel": int(x.argmax()),
        }
    return out


def _fold_into_norm(norm, linears, s) -> None:
    norm.weight.div_(s)
    norm.bias.div_(s)
    for m in linears:
        m.weight.mul_(s)


def _fold_into_values(v_proj, out_proj, s) -> None:
    v_proj.weight.div_(s[:, None])
    if v_proj.bias is not None:
        v_proj.bias.div_(s)
    out_proj.weight.mul_(s)


@torch.no_grad()
def smoothed_whisper(model, stats: dict[str, torch.Tensor], alpha: float = 0.5):
    """A SmoothQuant copy of a Whisper model (the folds above) from ``stats``
    (``whisper_input_maxima``), computing the same function up to rounding."""
    out = copy.deepcopy(model).eval()
    enc, dec = out.model.encoder, out.model.decoder
    for side, layers in (("encoder", enc.layers), ("decoder", dec.layers)):
        for i, layer in enumerate(layers):
            a = layer.self_attn
            s = _scales(stats[f"{side}.{i}.qkv"], _column_max(a.q_proj, a.k_proj, a.v_proj), alpha)
            _fold_into_norm(layer.self_attn_layer_norm, (a.q_proj, a.k_proj, a.v_proj), s)
            _fold_into_values(a.v_proj, a.out_proj, _scales(stats[f"{side}.{i}.out"], _column_max(a.out_proj), alpha))
            s = _scales(stats[f"{side}.{i}.fc1"], _column_max(layer.fc1), alpha)
            _fold_into_norm(layer.final_layer_norm, (layer.fc1,), s)
            if side == "decoder":
                c = layer.encoder_attn
                s = _scales(stats[f"{side}.{i}.cross_q"], _column_max(c.q_proj), alpha)
                _fold_into_norm(layer.encoder_attn_layer_norm, (c.q_proj,), s)
                s = _scales(stats[f"{side}.{i}.cross_out"], _column_max(c.out_proj), alpha)
                _fold_into_values(c.v_proj, c.out_proj, s)
    cross = [m for layer in dec.layers for m in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)]
    _fold_into_norm(enc.layer_norm, cross, _scales(stats["decoder.cross_kv"], _column_max(*cross), alpha))
    return out

"""Whisper's encoder and decoder as plain-tensor modules: what the ONNX graphs are exported from
(``switchboard.export.asr``) and what ``torch_runtime.TorchWhisper`` runs.

They are written out over a transformers ``WhisperForConditionalGeneration``'s own modules (its
Linear, LayerNorm and Conv1d weights) rather than traced through it:

- variable-length input: transformers' encoder refuses anything but 2 * max_source_positions
  frames; here the positional embedding is sliced to the input's length (conv1 -> gelu ->
  conv2 -> gelu -> + embed_positions[:T/2] -> layers -> layer_norm), the encoder the embedded
  default model is trained with. For pretrained Whisper (a fixed 3,000-frame window) the slice
  is the whole table and the module is transformers' encoder;
- the cache: the decoder takes and returns plain per-layer tensors, so there is no Cache object
  for the exporter to see through, and the cross-attention keys and values come from the
  encoder, computed once per utterance;
- the decoder computes the logits of the last position only: all greedy decoding reads.
"""

from __future__ import annotations


def modules(fused: bool = False):
    """(EncoderGraph, DecoderGraph, StaticDecoderGraph), built on first use: importing this file must not need torch
    (the export's gate helpers and the serving path run without it). ``fused``: attention through PyTorch's
    ``scaled_dot_product_attention`` (its flash and memory-efficient kernels), for running the
    modules in PyTorch (``switchboard.asr.torch_runtime``); the exported graphs keep the plain
    products, which every ONNX Runtime runs."""
    import torch
    from torch import nn

    def heads(x, n: int):
        """[B, T, D] -> [B, n, T, D / n]"""
        b, t, _ = x.shape
        return x.reshape(b, t, n, -1).transpose(1, 2)

    def merge(x):
        """[B, n, T, hd] -> [B, T, n * hd]"""
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, -1)

    def attend(q, k_t, v, mask=None):
        """softmax(q k^T + mask) v with the keys already transposed ([B, H, hd, K]). Whisper
        scales the queries before the product (its projection's output), as here."""
        if fused:  # the queries are scaled already
            return nn.functional.scaled_dot_product_attention(q, k_t.transpose(2, 3), v, attn_mask=mask, scale=1.0)
        scores = torch.matmul(q, k_t)
        if mask is not None:
            scores = scores + mask
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    class EncoderGraph(nn.Module):
        """input_features [B, n_mels, T] -> cross_key.{i} [B, H, hd, T'], cross_value.{i}
        [B, H, T', hd] for each decoder layer i (T' = ceil(T / 2))."""

        def __init__(self, model):
            super().__init__()
            self.encoder = model.model.encoder
            self.cross = nn.ModuleList(layer.encoder_attn for layer in model.model.decoder.layers)
            self.heads = model.config.encoder_attention_heads
            self.decoder_heads = model.config.decoder_attention_heads

        def forward(self, input_features):
            enc = self.encoder
            x = nn.functional.gelu(enc.conv1(input_features))
            x = nn.functional.gelu(enc.conv2(x)).permute(0, 2, 1)
            h = x + enc.embed_positions.weight[: x.shape[1]]
            for layer in enc.layers:
                a = layer.self_attn
                y = layer.self_attn_layer_norm(h)
                q = heads(a.q_proj(y) * a.scaling, self.heads)
                k_t = heads(a.k_proj(y), self.heads).transpose(2, 3)
                h = h + a.out_proj(merge(attend(q, k_t, heads(a.v_proj(y), self.heads))))
                y = layer.final_layer_norm(h)
                h = h + layer.fc2(layer.activation_fn(layer.fc1(y)))
            h = enc.layer_norm(h)
            keys = [heads(c.k_proj(h), self.decoder_heads).transpose(2, 3).contiguous() for c in self.cross]
            values = [heads(c.v_proj(h), self.decoder_heads).contiguous() for c in self.cross]
            return (*keys, *values)

    class DecoderGraph(nn.Module):
        """input_ids [B, S], then past_key.{i}, past_value.{i} [B, H, P, hd] per layer, then
        cross_key.{i}, cross_value.{i} per layer -> logits [B, V] (the last position's),
        present_key.{i}, present_value.{i} [B, H, P + S, hd]."""

        def __init__(self, model):
            super().__init__()
            self.decoder = model.model.decoder
            self.proj_out = model.proj_out
            self.heads = model.config.decoder_attention_heads
            self.num_layers = model.config.decoder_layers

        def forward(self, input_ids, *kv):
            n = self.num_layers
            past, cross = kv[: 2 * n], kv[2 * n :]
            dec = self.decoder
            s, p = input_ids.shape[1], past[0].shape[2]
            h = dec.embed_tokens(input_ids) + dec.embed_positions.weight[p : p + s]
            # Causal within the new tokens (a prompt of several); every past position is seen.
            query_pos = torch.arange(s, device=h.device).unsqueeze(1) + p
            key_pos = torch.arange(p + s, device=h.device).unsqueeze(0)
            mask = (key_pos > query_pos).to(h.dtype) * torch.finfo(h.dtype).min
            present = []
            for i, layer in enumerate(dec.layers):
                a = layer.self_attn
                y = layer.self_attn_layer_norm(h)
                q = heads(a.q_proj(y) * a.scaling, self.heads)
                k = torch.cat([past[2 * i], heads(a.k_proj(y), self.heads)], dim=2)
                v = torch.cat([past[2 * i + 1], heads(a.v_proj(y), self.heads)], dim=2)
                present += [k, v]
                h = h + a.out_proj(merge(attend(q, k.transpose(2, 3), v, mask)))
                c = layer.encoder_attn
                y = layer.encoder_attn_layer_norm(h)
                q = heads(c.q_proj(y) * c.scaling, self.heads)
                h = h + c.out_proj(merge(attend(q, cross[2 * i], cross[2 * i + 1])))
                y = layer.final_layer_norm(h)
                h = h + layer.fc2(layer.activation_fn(layer.fc1(y)))
            logits = self.proj_out(dec.layer_norm(h[:, -1]))
            return (logits, *present)

    class StaticDecoderGraph(nn.Module):
        """DecoderGraph over caches of a fixed size, written in place: what ``torch_runtime``
        replays as one CUDA graph per batch size (every tensor's shape and address the same at
        every step). input_ids [B, S]; positions [B, S] (where each row's new tokens go: rows
        that joined a running batch later are at earlier positions); self_keys, self_values: per
        layer [B, H, L, hd], the new tokens' keys and values written at ``positions``, each
        row's later positions masked out; cross_keys [B, H, hd, T'], cross_values
        [B, H, T', hd] per layer; cross_mask: None, or [B, 1, 1, T'] added to the cross
        attention's scores (a batch's encoder output shorter than T') -> logits [B, V]."""

        def __init__(self, model):
            super().__init__()
            self.decoder = model.model.decoder
            self.proj_out = model.proj_out
            self.heads = model.config.decoder_attention_heads

        def forward(self, input_ids, positions, self_keys, self_values, cross_keys, cross_values, cross_mask=None):
            dec = self.decoder
            b, s = input_ids.shape
            embedded = dec.embed_positions.weight.index_select(0, positions.reshape(-1)).view(b, s, -1)
            h = dec.embed_tokens(input_ids) + embedded
            key_pos = torch.arange(self_keys[0].shape[2], device=h.device)
            # [B, 1, S, L]: a row's query sees its own positions up to its own
            mask = (key_pos.view(1, 1, -1) > positions.unsqueeze(2)).to(h.dtype).unsqueeze(1) * torch.finfo(h.dtype).min
            where = None  # [B, H, S, hd]: each new key's and value's place in the cache
            for i, layer in enumerate(dec.layers):
                a = layer.self_attn
                y = layer.self_attn_layer_norm(h)
                q = heads(a.q_proj(y) * a.scaling, self.heads)
                k, v = self_keys[i], self_values[i]
                new_k = heads(a.k_proj(y), self.heads)
                if where is None:
                    where = positions.reshape(b, 1, s, 1).expand(new_k.shape)
                k.scatter_(2, where, new_k)
                v.scatter_(2, where, heads(a.v_proj(y), self.heads))
                h = h + a.out_proj(merge(attend(q, k.transpose(2, 3), v, mask)))
                c = layer.encoder_attn
                y = layer.encoder_attn_layer_norm(h)
                q = heads(c.q_proj(y) * c.scaling, self.heads)
                h = h + c.out_proj(merge(attend(q, cross_keys[i], cross_values[i], cross_mask)))
                y = layer.final_layer_norm(h)
                h = h + layer.fc2(layer.activation_fn(layer.fc1(y)))
            return self.proj_out(dec.layer_norm(h[:, -1]))

    return EncoderGraph, DecoderGraph, StaticDecoderGraph

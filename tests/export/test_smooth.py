"""Smoothing before INT8 computes the same function and evens out the activations' channels."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, GPT2Config, LlamaConfig, Qwen2Config

from switchboard.export import smooth
from tests.export import tiny_whisper

SMALL = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def _model(family: str):
    torch.manual_seed(0)
    if family == "gemma3_text":
        config = Gemma3TextConfig(**{**SMALL, "num_key_value_heads": 1}, head_dim=16, sliding_window=8)
    else:
        config = (LlamaConfig if family == "llama" else Qwen2Config)(**SMALL)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # a few outlier channels, as trained models have
        for layer in model.model.layers:
            layer.input_layernorm.weight[:3] = 20.0
            smooth._mlp_norm(layer).weight[5:7] = 15.0
    return model


def _prompts(n=6, vocab=96):
    g = torch.Generator().manual_seed(1)
    return [
        torch.randint(3, vocab, (int(torch.randint(4, 20, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


def _spread(stats):
    return max(float(x.max() / x.median()) for x in stats.values())


def test_smoothed_llama_and_qwen2_compute_the_same_logits_with_flatter_activations():
    # qwen2: biases on q/k/v; gemma3: norms scaling by 1 + w, the MLP's norm after the
    # attention's output norm, QK-norm; all: grouped-query attention
    for family in ("llama", "qwen2", "gemma3_text"):
        model, prompts = _model(family), _prompts()
        out = smooth.smoothed(model, prompts, alpha=0.5)
        assert out is not None and out is not model
        ids = torch.tensor([prompts[0]])
        torch.testing.assert_close(out(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
        assert _spread(smooth.input_maxima(out, prompts)) < _spread(smooth.input_maxima(model, prompts)) / 2
        assert model.model.layers[0].input_layernorm.weight[0] == 20.0  # the original is untouched


def test_other_shapes_are_left_alone():
    model = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=96, n_embd=32, n_layer=1, n_head=2)).eval()
    assert not smooth.supported(model) and smooth.smoothed(model, _prompts()) is None


def test_smoothing_a_model_with_a_restricted_head_checks_the_logits_it_has(tmp_path, monkeypatch):
    """The floor a restricted head gives the other tokens (engine/heads.py) is not compared:
    a smoothing that breaks the model (here: norms left unscaled) is still refused."""
    import json

    from switchboard.engine import heads

    model, prompts = _model("llama"), _prompts()
    (tmp_path / heads.FILE).write_text(json.dumps(list(range(40))))
    heads.restrict(model, tmp_path)
    assert smooth.smoothed(model, prompts) is not None
    monkeypatch.setattr(smooth, "_fold", lambda norm, s: None)
    assert smooth.smoothed(model, prompts) is None


def _whisper():
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = tiny_whisper.config(
        vocab_size=96,
        max_source_positions=50,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=0,
        decoder_start_token_id=1,
    )
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # outlier channels in front of every fold, as trained Whisper has
        for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
            layer.self_attn_layer_norm.weight[:3] = 20.0
            layer.final_layer_norm.weight[5:7] = 15.0
        for layer in model.model.decoder.layers:
            layer.encoder_attn_layer_norm.weight[9] = 25.0
        model.model.encoder.layer_norm.weight[11] = 30.0
    return model


def test_smoothed_whisper_computes_the_same_function_with_flatter_activations():
    model = _whisper()
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(3, 80, 100, generator=g)
    ids = torch.randint(0, 96, (3, 7), generator=g)

    def run(m):
        return lambda: m(input_features=feats, decoder_input_ids=ids)

    before = smooth.whisper_input_maxima(model, run(model))
    assert set(before) == set(smooth.whisper_linears(model))
    out = smooth.smoothed_whisper(model, before, alpha=0.5)
    with torch.no_grad():
        ref, got = run(model)().logits, run(out)().logits
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4
    after = smooth.whisper_input_maxima(out, run(out))
    ratio = {k: v["ratio"] for k, v in smooth.outliers(before).items()}
    ratio_after = {k: v["ratio"] for k, v in smooth.outliers(after).items()}
    for name in ("encoder.0.qkv", "decoder.1.fc1", "decoder.0.cross_q", "decoder.cross_kv"):
        assert ratio_after[name] < ratio[name] / 2, name
    # fc2 reads GELU(fc1(x)): no fold passes it, so it is left as it was
    assert torch.equal(out.model.encoder.layers[1].fc2.weight, model.model.encoder.layers[1].fc2.weight)

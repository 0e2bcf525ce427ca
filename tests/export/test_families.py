"""Every supported family exports to ONNX with KV cache and matches PyTorch (tiny random
configs built here, nothing downloaded): left-padded batches from an empty past, prefill on
top of a cached prefix, several decode steps."""

from __future__ import annotations

import pytest
from transformers import BertConfig

from switchboard.artifact.manifest import Manifest
from switchboard.export.__main__ import main as export_main


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gpt2", "gemma3_text"])
def test_family_exports_and_matches_pytorch(family, tokenizer_dir, tmp_path, checkpoint):
    ckpt = checkpoint(family, tokenizer_dir, tmp_path, chat_template=family != "gpt2")
    out = tmp_path / "artifacts"
    assert export_main(["--model", str(ckpt), "--out", str(out), "--precision", "fp32", "--bench-batches", "1"]) == 0
    m = Manifest.load(out)
    p = m.parity
    assert p["ok"] and p["greedy_identical"] == p["sequences"] >= 3
    assert p["greedy_identical_with_cached_prefix"] == p["sequences"]
    assert p["max_abs_logit_diff"] < 1e-3 and p["max_abs_logit_diff_with_cached_prefix"] < 1e-3
    assert 0 < p["max_abs_logit_diff_verifying_drafts"] < 1e-3, "a draft's positions verified in one pass"
    drafts = m.speculation
    assert drafts["identical"] and drafts["batch_8"]["verify_steps"] > 0, drafts
    assert isinstance(drafts["enabled"], bool) and drafts["cost_per_token"] >= 0
    assert (out / "answers.npz").is_file() and drafts["answers"] > 100
    assert m.source["model_type"] == family and (out / "model.onnx").exists()
    if family == "mistral":
        assert m.context_window == 128  # capped at the sliding window
    if family == "gemma3_text":
        assert m.context_window == 256  # global layers see the whole context; the window is per layer


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    ckpt = tmp_path / "bert"
    BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        is_decoder=True,
    ).save_pretrained(ckpt)
    with pytest.raises(
        SystemExit, match="unsupported architecture 'bert'.*supported: gemma3_text, gpt2, llama, mistral, qwen2"
    ):
        export_main(["--model", str(ckpt), "--out", str(tmp_path / "out")])


def test_random_weights_skip_the_gate_but_not_the_parity_check(tokenizer_dir, tmp_path, checkpoint, capfd):
    """A checkpoint whose switchboard.json says its weights are random (make model-large) exports
    its own default variants with no accuracy gate; the ONNX-vs-PyTorch check still runs."""
    import json

    ckpt = checkpoint("qwen2", tokenizer_dir, tmp_path)
    info = {"name": "random", "random_weights": True, "export": {"precision": "fp32,int8-dynamic", "smooth_alpha": 0}}
    (ckpt / "switchboard.json").write_text(json.dumps(info))
    out = tmp_path / "artifacts"
    assert export_main(["--model", str(ckpt), "--out", str(out), "--bench-batches", ""]) == 0
    m = Manifest.load(out)
    assert set(m.variants) == {"fp32", "int8-dynamic"}, "the checkpoint's precisions, no int8-percentile"
    assert m.parity["ok"] and not m.accuracy, "parity checked, agreement not measured"
    assert "random weights" in capfd.readouterr().out


@pytest.mark.parametrize("groups,heads,q", [(2, 14, 1), (2, 4, 5), (4, 4, 3)])
def test_grouped_attention_is_the_stock_attention_without_copying_the_cache(groups, heads, q):
    """The exported attention equals transformers' eager attention (``repeat_kv``), masked
    positions included."""
    import torch
    from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward

    from switchboard.export.onnx_export import grouped_attention

    torch.manual_seed(0)
    b, k, d = 3, 7, 16
    query, key, value = torch.randn(b, heads, q, d), torch.randn(b, groups, k, d), torch.randn(b, groups, k, d)
    mask = torch.zeros(b, 1, q, k)
    mask[1, :, :, :3] = torch.finfo(torch.float32).min  # a left-padded row
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = heads // groups, False
    ours, none = grouped_attention(module, query, key, value, mask, scaling=d**-0.5)
    stock, _ = eager_attention_forward(module, query, key, value, mask, scaling=d**-0.5)
    assert none is None and ours.shape == stock.shape == (b, q, heads, d)
    torch.testing.assert_close(ours, stock, rtol=1e-5, atol=1e-6)


def test_torch_runtime_counts_gemma_windows_in_positions_as_the_graph_does(tokenizer_dir, tmp_path, checkpoint):
    """``runtime: torch`` on a model with sliding and global layers: on a cached prefix with a
    masked gap before the new tokens, prompts longer than the 8-token window, it gives the
    exported graph's logits and greedy tokens."""
    import numpy as np

    from switchboard.engine.runtime import OnnxDecoder
    from switchboard.engine.torch_runtime import TorchDecoder
    from switchboard.export.parity import onnx_greedy

    ckpt = checkpoint("gemma3_text", tokenizer_dir, tmp_path)
    out = tmp_path / "artifacts"
    assert export_main(["--model", str(ckpt), "--out", str(out), "--precision", "fp32", "--bench-batches", ""]) == 0
    m = Manifest.load(out)
    decoders = OnnxDecoder(out, m, "fp32", threads=2), TorchDecoder(ckpt, m, "cpu")
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(10, m.vocab_size, n)) for n in (30, 19, 41)]
    halves = [9, 5, 20]
    runs = []
    for decoder in decoders:
        _, _, first = onnx_greedy(decoder, [p[:h] for p, h in zip(prompts, halves)], 1)
        caches = [first.row_cache(i) for i in range(len(prompts))]
        runs.append(onnx_greedy(decoder, prompts, 5, reused=halves, pasts=caches))
    (onnx_tokens, onnx_seen, _), (torch_tokens, torch_seen, _) = runs
    assert onnx_tokens == torch_tokens
    assert max(float(np.abs(a - b).max()) for a, b in zip(onnx_seen, torch_seen)) < 1e-3


def test_a_restricted_output_vocabulary_is_the_graphs_and_the_torch_runtimes(tokenizer_dir, tmp_path, checkpoint):
    """A checkpoint listing its output vocabulary (engine/heads.py) exports a graph whose other
    tokens get the lowest finite logit, and whose listed tokens' logits are the full head's."""
    import json

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from switchboard.engine import heads
    from switchboard.engine.runtime import OnnxDecoder
    from switchboard.engine.torch_runtime import TorchDecoder

    ckpt = checkpoint("gemma3_text", tokenizer_dir, tmp_path)
    kept = list(range(0, 300, 3))
    (ckpt / heads.FILE).write_text(json.dumps(kept))
    out = tmp_path / "artifacts"
    assert export_main(["--model", str(ckpt), "--out", str(out), "--precision", "fp32", "--bench-batches", ""]) == 0
    m = Manifest.load(out)
    assert m.parity["ok"] and m.source["output_vocabulary"] == len(kept) and (out / heads.FILE).is_file()
    ids = np.asarray([[5, 17, 40, 41, 99]], np.int64)
    mask, pos = np.ones_like(ids), np.arange(5)[None]
    onnx_logits, _ = OnnxDecoder(out, m, "fp32").forward(ids, mask, pos, OnnxDecoder(out, m, "fp32").empty_past(1))
    torch_logits, _ = TorchDecoder(ckpt, m, "cpu").forward(ids, mask, pos, TorchDecoder(ckpt, m, "cpu").empty_past(1))
    full = AutoModelForCausalLM.from_pretrained(ckpt).eval()(torch.from_numpy(ids)).logits[0, -1].detach().numpy()
    floor = np.finfo(np.float32).min
    for logits in (onnx_logits[0, -1], torch_logits[0, -1]):
        others = np.setdiff1d(np.arange(m.vocab_size), kept)
        assert (logits[others] == floor).all()
        np.testing.assert_allclose(logits[kept], full[kept], rtol=1e-4, atol=1e-4)


def test_the_gate_reads_a_restricted_head_on_its_live_tokens_alone(tokenizer_dir, tmp_path, checkpoint, monkeypatch):
    """The accuracy gate keeps only a restricted head's tokens (at Gemma's 262,144 the full rows
    are gigabytes): the same verdict figures as over the full rows."""
    import json

    from switchboard.artifact.tokenizer import TextTokenizer
    from switchboard.engine import heads
    from switchboard.export import accuracy

    ckpt = checkpoint("gemma3_text", tokenizer_dir, tmp_path)
    cases = accuracy.heldout_cases(2)
    tok = TextTokenizer(ckpt)
    answers = {t for c in cases for t in tok.encode(c.reference)}  # as a fine-tune's vocabulary has them
    kept = sorted(answers | set(range(0, tok.vocab_size, 2)))
    assert len(kept) < tok.vocab_size
    (ckpt / heads.FILE).write_text(json.dumps(kept))
    out = tmp_path / "artifacts"
    argv = ["--model", str(ckpt), "--out", str(out), "--precision", "fp32,int8-dynamic", "--no-gate"]
    assert export_main([*argv, "--bench-batches", ""]) == 0
    sliced = accuracy.evaluate(out, ["int8-dynamic"], cases)["int8-dynamic"]
    monkeypatch.setattr(heads, "read", lambda _: None)
    full = accuracy.evaluate(out, ["int8-dynamic"], cases)["int8-dynamic"]
    assert sliced.teacher_forced_top1 == full.teacher_forced_top1
    assert sliced.greedy_sequences_identical == full.greedy_sequences_identical
    assert abs(sliced.logits_cosine - full.logits_cosine) < 1e-6
    assert sliced.perplexity == full.perplexity and sliced.logits_cosine < 1.0


def test_the_prepared_shared_weights_still_return_a_drafts_positions(tokenizer_dir, tmp_path, checkpoint):
    """The pools load ONNX Runtime's optimized copy of the graph (``weights_cache``): it keeps
    ``logits_index`` as an input with its default, so the pools can verify drafts."""
    import numpy as np

    from switchboard.engine.runtime import OnnxDecoder

    ckpt = checkpoint("qwen2", tokenizer_dir, tmp_path)
    out = tmp_path / "artifacts"
    assert export_main(["--model", str(ckpt), "--out", str(out), "--precision", "fp32", "--bench-batches", ""]) == 0
    m = Manifest.load(out)
    plain = OnnxDecoder(out, m, "fp32", threads=1)
    shared = OnnxDecoder(out, m, "fp32", threads=1, weights_cache=tmp_path / "weights")
    assert shared.path != plain.path and shared.verifies
    ids = np.array([[5, 6, 7, 8]])
    mask, pos = np.ones((1, 4), np.int64), np.arange(4)[None]
    a, _ = plain.forward(ids, mask, pos, plain.empty_past(1), keep=3)
    b, _ = shared.forward(ids, mask, pos, shared.empty_past(1), keep=3)
    last, _ = shared.forward(ids, mask, pos, shared.empty_past(1))
    assert a.shape[1] == b.shape[1] == 3 and last.shape[1] == 1
    assert np.abs(a - b).max() < 1e-4 and np.abs(b[:, -1] - last[:, 0]).max() < 1e-4

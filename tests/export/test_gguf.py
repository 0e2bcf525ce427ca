"""GGUF import (export/gguf.py) on tiny files written here as llama.cpp writes them
(tests/export/gguf_writer.py): the imported checkpoint computes the source model's logits, its
tokenizer round-trips the corpus as the engine reads it, and files that cannot be imported get
an error naming the file and the reason, with nothing half-written left behind."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config

from switchboard.artifact.tokenizer import TextTokenizer
from switchboard.data import corpus
from switchboard.export import gguf
from tests.export import gguf_writer

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, max_position_embeddings=256)
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
LLAMA_SPECIALS = ["<unk>", "<s>", "</s>"]


@pytest.fixture(scope="module")
def texts():
    return [m["content"] for c in corpus.training_conversations(corpus.load(), 300) for m in c]


def tiny_model(family: str, vocab: int):
    torch.manual_seed(0)
    if family == "llama":
        config = LlamaConfig(vocab_size=vocab, num_hidden_layers=2, num_key_value_heads=2, **TINY)
    elif family == "qwen2":
        config = Qwen2Config(vocab_size=vocab, num_hidden_layers=2, num_key_value_heads=2, **TINY)
    else:  # Gemma 3's defaults where a GGUF says nothing: a global layer every 6th, local RoPE base 1e4
        config = Gemma3TextConfig(
            vocab_size=vocab, num_hidden_layers=7, num_key_value_heads=1, head_dim=32, sliding_window=8, **TINY
        )
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms away from their init, so a missed +1 / -1 shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def write_family(family: str, path, texts, tokenizer_dir):
    if family == "qwen2":
        tokens, types, merges = gguf_writer.bpe_vocab(tokenizer_dir / "tokenizer.json")
        model = tiny_model(family, len(tokens))
        special = {"bos": tokens.index("<|bos|>"), "eos": tokens.index("<|end|>"), "pad": tokens.index("<|pad|>")}
        return model, gguf_writer.write(model, path, family, tokens, types, merges, special, tokenizer="gpt2")
    specials = GEMMA_SPECIALS if family == "gemma3" else LLAMA_SPECIALS
    tokens, types = gguf_writer.spm_vocab(texts, 600, specials)
    model = tiny_model(family, len(tokens))
    special = {"bos": tokens.index(specials[2 if family == "gemma3" else 1])}
    special["eos"] = tokens.index("<eos>" if family == "gemma3" else "</s>")
    special["unk"] = tokens.index("<unk>")
    return model, gguf_writer.write(model, path, family, tokens, types, special=special)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_imported_checkpoint_computes_the_files_model(family, texts, tokenizer_dir, tmp_path):
    source, path = write_family(family, tmp_path / f"tiny-{family}.gguf", texts, tokenizer_dir)
    out = gguf.ensure(path, tmp_path / "checkpoint", say=lambda _: None)

    imported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(0, source.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(imported(ids).logits, source(ids).logits, rtol=0, atol=1e-4)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == gguf.ARCHITECTURES[family] and "quantization_config" not in config
    if family == "gemma3":
        assert config["sliding_window"] == 8
        assert config["layer_types"].count("full_attention") == 1 and config["layer_types"][5] == "full_attention"
        assert (out / "chat_template.jinja").read_text() == gguf.GEMMA_TEMPLATE
    info = json.loads((out / "switchboard.json").read_text())
    assert info["source"]["sha256"] == gguf.file_digest(path) and info["source"]["architecture"] == family

    tok = TextTokenizer(out)  # as the engine reads it: tokenizers only
    assert tok.vocab_size == source.config.vocab_size, "no token past the embedding (Gemma's default <mask>)"
    for text in texts[:50]:
        assert tok.decode(tok.encode(text)).strip() == text.strip()
    assert not list(tmp_path.glob("*.tmp")), "nothing half-written is left"


def test_import_is_cached_by_the_files_digest(texts, tokenizer_dir, tmp_path):
    _, path = write_family("llama", tmp_path / "tiny.gguf", texts, tokenizer_dir)
    said = []
    out = gguf.ensure(path, tmp_path / "ckpt", say=said.append)
    weights = (out / "model.safetensors").stat().st_mtime_ns
    gguf.ensure(path, out, say=said.append)
    assert "up to date" in said[-1] and (out / "model.safetensors").stat().st_mtime_ns == weights


def test_exporter_takes_a_gguf_file(texts, tokenizer_dir, tmp_path, monkeypatch):
    """``python -m switchboard.export --model x.gguf``: imported (to build/checkpoints/<stem>,
    here redirected), then exported and checked against PyTorch like any checkpoint."""
    from switchboard.artifact.manifest import Manifest
    from switchboard.export.__main__ import main as export_main

    _, path = write_family("gemma3", tmp_path / "tiny-gemma3.gguf", texts, tokenizer_dir)
    monkeypatch.setattr(gguf.paths, "BUILD", tmp_path / "build")
    out = tmp_path / "artifacts"
    assert export_main(["--model", str(path), "--out", str(out), "--precision", "fp32", "--bench-batches", ""]) == 0
    m = Manifest.load(out)
    assert m.parity["ok"] and m.source["model_type"] == "gemma3_text"
    assert m.source["path"] == str(tmp_path / "build" / "checkpoints" / "tiny-gemma3")
    end = TextTokenizer(out).decode([m.end_of_turn_id], skip_special_tokens=False)
    assert end == "<end_of_turn>" and m.end_of_turn_id in m.eos_token_ids


# --- files that cannot be imported ---------------------------------------------------------


def test_truncated_file_is_refused_and_nothing_is_written(texts, tokenizer_dir, tmp_path):
    _, path = write_family("llama", tmp_path / "full.gguf", texts, tokenizer_dir)
    data = path.read_bytes()
    for cut in (len(data) // 2, 64, len(data) - 100):
        short = tmp_path / f"cut-{cut}.gguf"
        short.write_bytes(data[:cut])
        with pytest.raises(gguf.GgufError, match=rf"{short}: truncated or damaged GGUF file"):
            gguf.ensure(short, tmp_path / "out", say=lambda _: None)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()


def test_unknown_architecture_is_named(tmp_path):
    import gguf as gguf_package

    path = tmp_path / "phi.gguf"
    w = gguf_package.GGUFWriter(str(path), "phi2")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b"])
    w.add_tensor("token_embd.weight", torch.zeros(2, 4).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(gguf.GgufError, match=r"architecture 'phi2' is not one Switchboard imports \(supported: llama"):
        gguf.ensure(path, tmp_path / "out", say=lambda _: None)


def test_unreadable_tokenizer_is_named(tmp_path):
    import gguf as gguf_package

    path = tmp_path / "rwkv-vocab.gguf"
    w = gguf_package.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("rwkv")
    w.add_token_list(["a", "b"])
    w.add_tensor("token_embd.weight", torch.zeros(2, 4).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(gguf.GgufError, match=r"tokenizer type 'rwkv' cannot be rebuilt for the engine"):
        gguf.ensure(path, tmp_path / "out", say=lambda _: None)


def test_not_a_gguf_file_and_the_command_line(tmp_path, capfd):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(SystemExit, match=r"model.gguf: not a GGUF file"):
        gguf.main([str(path), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"nothing.gguf: no such file"):
        gguf.main([str(tmp_path / "nothing.gguf")])
    assert not (tmp_path / "out").exists()

"""Tiny GGUF files written here with the ``gguf`` package, as llama.cpp's converter writes them.

A random Hugging Face model of the family is written under llama.cpp's tensor names (the
``gguf`` package's own name map), with the changes ``convert_hf_to_gguf.py`` makes on the way:
Llama's query and key rows permuted into llama.cpp's rotary layout, Gemma's RMSNorm weights
stored as ``1 + w``. The import must undo them: the test compares its logits with the source
model's. Vocabularies are small: SentencePiece-style pieces (``tokenizer.ggml.model = llama``,
byte fallback, as Llama 2 and Gemma files are) or byte-level BPE with merges (``gpt2``, as
Qwen2 files are).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

# gguf's TokenType values
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


def spm_vocab(texts: list[str], pieces: int, specials: list[str]) -> tuple[list[str], list[int]]:
    """SentencePiece-style tokens (``▁`` for spaces, <0xNN> byte fallback) learned from
    ``texts`` with a small BPE, and their types."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=pieces, min_frequency=2, show_progress=False))
    learned = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    tokens = list(specials) + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN if s in ("<unk>",) else CONTROL for s in specials] + [BYTE] * 256
    for piece, _ in learned:
        if piece not in tokens:
            tokens.append(piece)
            types.append(NORMAL)
    return tokens, types


def bpe_vocab(tokenizer_json: Path) -> tuple[list[str], list[int], list[str]]:
    """Tokens, types and merges of a byte-level BPE ``tokenizer.json``."""
    spec = json.loads(Path(tokenizer_json).read_text())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {t["content"] for t in spec.get("added_tokens", []) if t.get("special")}
    types = [CONTROL if t in special else NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, types, merges


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.permute: rotary halves interleaved per head
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write(model, path: Path, arch: str, tokens: list[str], types: list[int], merges: list[str] | None = None,
          special: dict[str, int] | None = None, tokenizer: str = "llama") -> Path:  # fmt: skip
    """``model`` (a random HF causal LM) as a GGUF file of architecture ``arch``."""
    import gguf

    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = cfg.rope_parameters
    w.add_rope_freq_base(float((rope.get("full_attention") or rope)["rope_theta"]))
    if arch == "gemma3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_sliding_window(cfg.sliding_window)
    else:
        w.add_rope_dimension_count(head_dim)
    w.add_tokenizer_model(tokenizer)
    w.add_tokenizer_pre("default" if tokenizer == "llama" else "qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    if tokenizer == "llama":
        w.add_token_scores([-float(i) for i in range(len(tokens))])
    if merges is not None:
        w.add_token_merges(merges)
    for key, value in (special or {}).items():
        getattr(w, f"add_{key}_token_id")(value)
    w.add_add_bos_token(tokenizer == "llama")

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    seen = set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:  # tied output head: llama.cpp reads the embedding
            continue
        seen.add(tensor.data_ptr())
        stem, _, suffix = name.rpartition(".")
        target = names.get_name(stem)
        if target is None:
            raise KeyError(f"no GGUF name for {name}")
        data = tensor.detach().to(torch.float32).numpy().copy()
        if arch == "llama" and stem.endswith("self_attn.q_proj"):
            data = _permute(data, cfg.num_attention_heads)
        elif arch == "llama" and stem.endswith("self_attn.k_proj"):
            data = _permute(data, cfg.num_key_value_heads)
        if arch == "gemma3" and stem.endswith("norm"):
            data = data + 1
        w.add_tensor(f"{target}.{suffix}", data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

"""Which tokens the engine never samples: those whose text holds a control character."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models

from switchboard.artifact.tokenizer import control_token_ids, token_bytes_table
from tests.unit.bpe import byte_level_bpe


def test_control_tokens_are_found_and_tab_and_newline_kept(tmp_path):
    path = tmp_path / "tokenizer.json"
    tok = byte_level_bpe(["hello\tworld\n", "a\x10\x10b", "订单\r\n"], path)
    banned = control_token_ids(path)
    texts = {i: tok.decode([i], skip_special_tokens=False) for i in range(tok.get_vocab_size())}
    control = {chr(c) for c in [*range(0x20), 0x7F]} - {"\t", "\n"}
    assert {texts[i] for i in banned if len(texts[i]) == 1} == control, "every control byte but tab and newline"
    assert any(len(texts[i]) > 1 for i in banned), "a merged token holding one too (\\x10\\x10 or \\r\\n)"
    assert all(set(texts[i]) & control for i in banned)
    kept = [i for i in texts if i not in banned]
    assert {"\t", "\n", "<|end|>", "h"} <= {texts[i] for i in kept}


def test_token_bytes_join_to_the_text_for_byte_level_and_byte_fallback_vocabularies(tmp_path):
    text = "订单 SB123 shipped ✅ 🙂"
    tok = byte_level_bpe(["订单 shipped", "SB123"], tmp_path / "bytelevel.json")
    table = token_bytes_table(tmp_path / "bytelevel.json")
    ids = tok.encode(text).ids
    assert b"".join(table[i] for i in ids) == text.encode()
    assert table[tok.token_to_id("<|end|>")] == b""
    assert any(len(table[i]) > 1 for i in ids), "merged tokens: several bytes"

    # SentencePiece style (Llama 2, Mistral): ▁ for a space, <0xAB> for bytes outside the vocabulary.
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}, "▁": 257, "S": 258, "B": 259}
    sp = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    sp.add_special_tokens(["<unk>"])
    sp.save(str(tmp_path / "sentencepiece.json"))
    table = token_bytes_table(tmp_path / "sentencepiece.json")
    ids = sp.encode("SB▁订").ids
    assert b"".join(table[i] for i in ids) == "SB 订".encode() and sp.decode(ids) == "SB 订"

"""A small byte-level BPE tokenizer trained in a test, saved as a tokenizer.json."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def byte_level_bpe(texts: list[str], path: Path, vocab_size: int = 300, special: str = "<|end|>") -> Tokenizer:
    """GPT-2-style byte-level BPE trained on ``texts`` (x20), with ``special``, saved at ``path``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts * 20, trainer=trainer)
    tok.add_special_tokens([special])
    tok.save(str(path))
    return tok

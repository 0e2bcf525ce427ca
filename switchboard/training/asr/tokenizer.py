"""The recognizer's vocabulary: byte-level BPE from the corpus, Whisper's special tokens after it.

The special tokens come after the learned vocabulary and in Whisper's order, with
``<|notimestamps|>`` last, as in OpenAI's checkpoints: code that reads a Whisper tokenizer
(transformers' ``WhisperTokenizer``, its generation code, the serving decoder) finds them by
name and takes every id past the last special token for a timestamp. This model predicts none,
so no id lies there.

The tokens are characters: text is cut into single characters before BPE runs, so BPE only
puts the UTF-8 bytes of a character back together (a Mandarin character is three bytes) and
never merges two characters. Word-sized tokens (a 1,200-token BPE) left the tiny model
hundreds of rare classes to tell apart from sound and it did not learn to listen within the
time budget; characters are few and frequent, every English word (an unseen one too) is
spelled from them, and a Mandarin character is one spoken syllable. Byte-level, so any text
has an encoding; a character never seen in training is spelled in bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LANGUAGES = ("en", "zh")
EOT = "<|endoftext|>"
SOT = "<|startoftranscript|>"
TRANSLATE, TRANSCRIBE = "<|translate|>", "<|transcribe|>"
NO_TIMESTAMPS = "<|notimestamps|>"
# Whisper's order: end of text, start of transcript, the languages, the tasks, the rest.
SPECIAL_TOKENS = [
    EOT,
    SOT,
    *(f"<|{lang}|>" for lang in LANGUAGES),
    TRANSLATE,
    TRANSCRIBE,
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    NO_TIMESTAMPS,
]


def lang_token(lang: str) -> str:
    if lang not in LANGUAGES:
        raise ValueError(f"language {lang!r}: this model knows {', '.join(LANGUAGES)}")
    return f"<|{lang}|>"


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """The characters of ``texts`` (at most ``vocab_size`` tokens: the 256 bytes, then the most
    frequent characters), then the special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex("."), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Added after training, so their ids follow the learned vocabulary.
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def save(tok: Tokenizer, out: Path, max_length: int) -> None:
    """tokenizer.json plus the config a ``WhisperTokenizer`` loads it with."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": EOT,
        "pad_token": EOT,
        "model_max_length": max_length,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": EOT, "eos_token": EOT, "unk_token": EOT, "pad_token": EOT}, indent=2) + "\n"
    )


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}

"""Byte-level BPE tokenizer with a chat template, trained on the corpus.

Byte-level so any input (Chinese, emoji, invalid-looking bytes) has an encoding; digits are
split one per token so order numbers and SKU codes tokenize the same way wherever they occur.
The output is a standard Hugging Face tokenizer directory (tokenizer.json plus
tokenizer_config.json with the chat template), so the default model goes through exactly the
same export and serving path as any user checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, BOS, END = "<|pad|>", "<|bos|>", "<|end|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
SPECIAL_TOKENS = [PAD, BOS, END, *ROLE_TOKENS]

# Every message is `<|role|>content<|end|>`; the model stops on <|end|>. No separators, so
# the rendering of a conversation is always a prefix of the rendering of its continuation,
# which is what lets a session append new tokens to cached ones.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path, model_max_length: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": END,
        "pad_token": PAD,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": END, "pad_token": PAD}, indent=2) + "\n"
    )
    return tok

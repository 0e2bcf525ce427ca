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
# which is what lets a session append new tokens to cached ones. Tools (OpenAI's
# definitions) are named at the end of the system message, `<tools>a,b</tools>`; an answer's
# calls follow its text as `<tool_call>{"name":"a","arguments":{...}}</tool_call>` (compact
# JSON, as the grammar writes them); a tool's result is the user's turn,
# `<|user|><tool_response>...</tool_response><|end|>` (Qwen2's layout).
TOOLS_LIST = (
    "{% if tools %}<tools>{% for t in tools %}{{ (t.function or t).name }}{% if not loop.last %},{% endif %}"
    "{% endfor %}</tools>{% endif %}"
)
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools and (not messages or messages[0]['role'] != 'system') %}"
    "{{ '<|system|>' }}" + TOOLS_LIST + "{{ '<|end|>' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}{% endif %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>' + message['content'] }}" + TOOLS_LIST + "{{ '<|end|>' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|user|><tool_response>' + message['content'] + '</tool_response><|end|>' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] or [] %}"
    '{{ \'<tool_call>{"name":"\' + call.function.name + \'","arguments":\' }}'
    "{% if call.function.arguments is string %}{{ call.function.arguments }}"
    "{% else %}{{ call.function.arguments | tojson(separators=(',', ':')) }}{% endif %}"
    "{{ '}</tool_call>' }}{% endfor %}{{ '<|end|>' }}"
    "{% else %}{{ '<|user|>' + message['content'] + '<|end|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def message_text(message: dict) -> str:
    """What the template writes between a message's role token and ``<|end|>`` (training
    encodes message by message): an answer's calls after its text (``{"name", "arguments"}``,
    arguments an object), a tool's result in ``<tool_response>``."""
    if message["role"] == "tool":
        return "<tool_response>" + message["content"] + "</tool_response>"
    text = message.get("content") or ""
    for call in message.get("tool_calls") or ():
        args = json.dumps(call["arguments"], ensure_ascii=False, separators=(",", ":"))
        text += '<tool_call>{"name":"' + call["name"] + '","arguments":' + args + "}</tool_call>"
    return text


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

"""Serve-time tokenizer: ``tokenizers`` plus the checkpoint's chat template.

The server never imports transformers (slow to import, large in every stub process). The
export step writes a ``tokenizer.json`` for every checkpoint, so this works for the default
model and for Llama, Qwen2, Mistral and GPT-2 checkpoints alike.
"""

from __future__ import annotations

import json
import re
import unicodedata
from functools import cached_property
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

# For base checkpoints without a chat template (GPT-2, most GGUF files): each turn ends with
# the EOS token, which is also what generation stops on.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def _token_text(value) -> str | None:
    # tokenizer_config.json stores special tokens either as strings or as AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    return value


def _raise(message: str):
    raise TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # transformers' ``tojson``: plain JSON (Jinja's own escapes <, >, & and ' for HTML).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """A Hugging Face chat template rendered the way transformers renders it."""

    def __init__(self, source: str, bos_token: str | None, eos_token: str | None):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.filters["tojson"] = _tojson
        self._template = env.from_string(source)
        self._special = {"bos_token": bos_token or "", "eos_token": eos_token or ""}

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
        """``tools``: OpenAI's tool definitions (``{"type": "function", "function": {...}}``), as
        transformers passes them; None: the template's rendering without tools."""
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, tools=tools, **self._special
        )


def control_token_ids(tokenizer_json: Path, kept: str = "\t\n") -> list[int]:
    """Ids of the tokens whose text holds a control character other than ``kept`` (tab and
    newline): what the engine never samples. A random or badly trained model would otherwise
    write them, and a client sending the conversation back would send them too."""
    tok = Tokenizer.from_file(str(tokenizer_json))
    size = tok.get_vocab_size(with_added_tokens=True)
    texts = tok.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    return [i for i, text in enumerate(texts) if any(_is_control(c) and c not in kept for c in text)]


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes_table(tokenizer_json: Path) -> list[bytes]:
    """Each token's bytes as the decoder joins them (special tokens: none): byte-level BPE
    (GPT-2, Qwen2, Llama 3) through its alphabet, SentencePiece pieces with ``▁`` for a space and
    ``<0xAB>`` byte-fallback tokens as their byte. What ``IncrementalDetokenizer`` needs to tell a
    character still arriving from bytes that never make one."""
    spec = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    tok = Tokenizer.from_file(str(tokenizer_json))
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    alphabet = _byte_level_alphabet() if "ByteLevel" in json.dumps(spec.get("decoder")) else None
    table = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        piece = tok.id_to_token(i) or ""
        if i in special:
            table.append(b"")
        elif alphabet is not None and all(c in alphabet for c in piece):
            table.append(bytes(alphabet[c] for c in piece))
        elif m := _BYTE_TOKEN.fullmatch(piece):
            table.append(bytes([int(m.group(1), 16)]))
        else:
            table.append(piece.replace("\u2581", " ").encode())
    return table


def _is_control(c: str) -> bool:
    return unicodedata.category(c) == "Cc"


class TextTokenizer:
    def __init__(self, directory: Path):
        directory = Path(directory)
        self.directory = directory
        self._tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if not template and (directory / "chat_template.jinja").exists():
            template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
        if not template:
            raise ValueError(f"{directory}: the tokenizer has no chat template")
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.template = ChatTemplate(template, self.bos_token, self.eos_token)

    @cached_property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        # The chat template already wrote BOS and role markers as text.
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    @cached_property
    def _bytes(self) -> list[bytes]:
        return token_bytes_table(self.directory / "tokenizer.json")

    def token_bytes(self, token_id: int) -> bytes:
        """The token's bytes (special tokens and ids past the vocabulary: none)."""
        table = self._bytes
        return table[token_id] if 0 <= token_id < len(table) else b""

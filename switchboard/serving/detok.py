"""Incremental detokenization that only ever emits whole UTF-8 characters.

A byte-level BPE token can end in the middle of a multi-byte character (most Chinese
characters are three bytes), and SentencePiece-style decoders change leading spaces depending
on what precedes a token. Decoding a short window of recent tokens and emitting only the new
suffix, holding back while it ends in an incomplete character, handles both (the approach of
vLLM and TGI).
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, decode):
        self._decode = decode  # ids -> str, special tokens skipped
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this are already emitted
        self.text = ""

    def add(self, token_ids: list[int]) -> str:
        """Feed new ids; return the text that became final (possibly empty)."""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if full_text.endswith(REPLACEMENT) or len(full_text) <= len(prefix_text):
            return ""  # an incomplete character: wait for the next token
        delta = full_text[len(prefix_text) :]
        self._prefix = self._read
        self._read = len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of generation: whatever is left, replacement characters included."""
        full_text = self._decode(self._ids[self._prefix :])
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        delta = full_text[len(prefix_text) :] if full_text.startswith(prefix_text) else ""
        self._prefix = self._read = len(self._ids)
        self.text += delta
        return delta

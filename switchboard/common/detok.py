"""Incremental detokenization that only ever emits whole UTF-8 characters.

A byte-level BPE token can end in the middle of a multi-byte character (most Chinese
characters are three bytes), and SentencePiece-style decoders change leading spaces depending
on what precedes a token. Decoding a short window of recent tokens and emitting only the new
suffix, holding back while it ends in an incomplete character, handles both (the approach of
vLLM and TGI).

A replacement character at the end is not always an incomplete character: a model can write
bytes that no later byte completes (a lone continuation byte, a lead byte followed by another
lead); vLLM and TGI then hold everything back until a token ends cleanly, and a random or badly
trained model that repeats such a token streams nothing for the rest of its answer. Given each
token's bytes (``token_bytes``, ``TextTokenizer.token_bytes``), only the characters of the bytes
that could still begin a character are held (llama.cpp's rule); the rest goes out at once,
invalid bytes as U+FFFD.
"""

from __future__ import annotations

from collections.abc import Callable

REPLACEMENT = "\ufffd"


def incomplete_utf8_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 character that more bytes could
    complete (0: none)."""
    for back in range(1, min(4, len(data)) + 1):
        c = data[-back]
        if c & 0xC0 == 0x80:  # a continuation byte: its lead is further back
            continue
        need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0


class IncrementalDetokenizer:
    def __init__(self, decode, token_bytes: Callable[[int], bytes] | None = None):
        """``decode``: ids -> str, special tokens skipped. ``token_bytes``: a token's bytes as the
        decoder joins them (None: any trailing U+FFFD is taken for an incomplete character)."""
        self._decode = decode
        self._bytes = token_bytes
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this are already emitted
        self._sent = 0  # characters emitted past the window's first _read ids (while it holds)
        self.text = ""

    def add(self, token_ids: list[int]) -> str:
        """Feed new ids; return the text that became final (possibly empty)."""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        held = self._held(full_text)
        done = len(prefix_text) + self._sent  # this window's text already emitted
        if len(full_text) - held <= done:
            return ""  # an incomplete character: wait for the next token
        delta = full_text[done : len(full_text) - held]
        if held:
            self._sent += len(delta)  # the window stays until its text ends cleanly
        else:
            self._prefix, self._read, self._sent = self._read, len(self._ids), 0
        self.text += delta
        return delta

    def _held(self, full_text: str) -> int:
        """Characters at the end of ``full_text`` that later tokens may still change."""
        if not full_text.endswith(REPLACEMENT):
            return 0
        if self._bytes is None:
            return len(full_text)  # no bytes to tell: all of it
        tail = b""
        for token in reversed(self._ids[self._read :]):  # the last 4 bytes at most
            tail = self._bytes(token) + tail
            if len(tail) >= 4:
                break
        # A byte-level decoder writes one U+FFFD for those bytes, a byte-fallback one per byte:
        # holding as many characters as bytes covers both (a final one held a token longer at most)
        return incomplete_utf8_tail(tail)

    def flush(self) -> str:
        """At the end of generation: whatever is left, replacement characters included."""
        full_text = self._decode(self._ids[self._prefix :])
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        done = len(prefix_text) + self._sent
        delta = full_text[done:] if full_text.startswith(prefix_text) else ""
        self._prefix = self._read = len(self._ids)
        self._sent = 0
        self.text += delta
        return delta

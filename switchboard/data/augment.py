"""Noisy copies of training questions, so the model answers paraphrases it never saw.

Each FAQ entry has about six phrasings; a small model trained on them learns those strings
rather than what they ask. Customers write "when r u shipping my stuff" and "退货的快递费要我出吗":
lower case, no punctuation, words left out. Dropping words (English) or characters (Chinese)
and changing case and punctuation make the answer depend on the question's content words
instead of its exact form. Slot placeholders (``{order_id}``, lower case already) are never
dropped: the values that fill them must be copied exactly.
"""

from __future__ import annotations

import random
import re

_SLOT = re.compile(r"(\{\w+\})")
_PUNCT = re.compile(r"[?？!！.。,，、;；:：'\"“”]")


def _pieces(question: str, lang: str) -> list[str]:
    """Words (English) or characters (Chinese); a placeholder stays whole."""
    if lang != "zh":
        return question.split()
    return [c for part in _SLOT.split(question) for c in ([part] if _SLOT.fullmatch(part) else part)]


def noisy(rng: random.Random, question: str, lang: str, p_drop: float = 0.15) -> str:
    """One random rewrite of a question template."""
    pieces = _pieces(question, lang)
    kept = [x for x in pieces if _SLOT.search(x) or rng.random() >= p_drop]
    if not any(not _SLOT.search(x) for x in kept):
        kept = pieces
    text = (" " if lang != "zh" else "").join(kept)
    if rng.random() < 0.5:
        text = _PUNCT.sub("", text)
    if lang != "zh" and rng.random() < 0.5:
        text = text.lower()
    return " ".join(text.split()) if lang != "zh" else text.strip()

"""Word and character error rates, the accuracy measure of the ASR gate and reports.

English is scored by words, Mandarin by characters (it has no spaces), both after the same
normalization: case folded, punctuation (ASCII and CJK) dropped, whitespace collapsed, so
"Where's my order?" and "where's my order" score 0.
"""

from __future__ import annotations

import re
import unicodedata

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def normalize(text: str) -> str:
    """Case-folded text without punctuation, single spaces (apostrophes inside words kept)."""
    text = unicodedata.normalize("NFKC", text).casefold().replace("\u2019", "'")
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch == "'" or not (cat.startswith("P") or cat.startswith("S")):
            kept.append(ch)
        else:
            kept.append(" ")
    words = [w.strip("'") for w in "".join(kept).split()]
    return " ".join(w for w in words if w)


def units(text: str, lang: str | None = None) -> list[str]:
    """What is scored: characters (no spaces) for Mandarin or any text with CJK, else words."""
    norm = normalize(text)
    if lang == "zh" or (lang is None and _CJK.search(norm)):
        return [c for c in norm if not c.isspace()]
    return norm.split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance (substitutions, insertions, deletions all cost 1)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def error_rate(refs: list[str], hyps: list[str], lang: str | None = None) -> float:
    """Corpus-level rate: total edits over total reference units (WER for English, CER for
    Mandarin); 0.0 for no reference units and no hypothesis units."""
    edits = total = 0
    for ref, hyp in zip(refs, hyps, strict=True):
        r, h = units(ref, lang), units(hyp, lang)
        edits += edit_distance(r, h)
        total += len(r)
    if total == 0:
        return 0.0 if edits == 0 else 1.0
    return edits / total


def exact_share(refs: list[str], hyps: list[str]) -> float:
    """The share of ``hyps`` equal to their reference after ``normalize`` (word for word)."""
    pairs = list(zip(refs, hyps, strict=True))
    return sum(normalize(r) == normalize(h) for r, h in pairs) / len(pairs) if pairs else 0.0

"""The answer a customer gets when the model cannot answer in time: FAQ retrieval.

When the engines are overloaded (a chat waited too long for a slot, or a pool rejected or
timed out) or broken (a pool's stub died), ``chat`` answers with the FAQ entry whose questions
are closest to the customer's message, marked ``"fallback": true`` in ``stats``. Retrieval is
TF-IDF cosine over English words and Chinese character bigrams, scored through an inverted index
(only the questions sharing a feature with the message are touched): tens of microseconds per
message, no model, so it keeps working exactly when the model does not.

Answers in the FAQ carry slot placeholders (``{order_id}``, ...) that training fills with random
values; here they become neutral words ("your order"), never invented numbers.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_WORD = re.compile(r"[a-z0-9]+")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+")
_SLOT = re.compile(r"\{(\w+)\}")
_GENERIC = {
    "en": {
        "order_id": "your order",
        "sku": "the item",
        "price": "the amount",
        "product": "the product",
        "tracking": "your parcel",
        "phone": "your phone number",
        "days": "a few",
    },
    "zh": {
        "order_id": "您的订单",
        "sku": "该商品",
        "price": "相应金额",
        "product": "该商品",
        "tracking": "您的包裹",
        "phone": "您的手机号",
        "days": "几",
    },
}
_STOP = {
    "the",
    "a",
    "an",
    "i",
    "my",
    "is",
    "to",
    "do",
    "you",
    "it",
    "of",
    "and",
    "can",
    "me",
    "for",
    "in",
    "on",
    "what",
    "how",
    "be",
    "are",
    "does",
    "your",
    "this",
    "that",
    "with",
    "when",
    "will",
    "if",
    "have",
}
DEFAULT_ANSWER = {
    "en": "Sorry, our assistant is very busy right now. Please try again in a minute, or ask for a human agent.",
    "zh": "抱歉，客服助手现在非常繁忙，请稍后再试，或转人工客服。",
}


def features(text: str) -> Counter:
    text = text.lower()
    feats = Counter(w for w in _WORD.findall(text) if w not in _STOP)
    for run in _CJK.findall(text):
        feats.update(run[i : i + 2] for i in range(max(1, len(run) - 1)))
    return feats


def language(text: str) -> str:
    return "zh" if _CJK.search(text) else "en"


def neutral(answer: str, lang: str) -> str:
    words = _GENERIC["zh" if lang == "zh" else "en"]
    return _SLOT.sub(lambda m: words.get(m.group(1), ""), answer)


@dataclass(frozen=True)
class Answer:
    text: str
    entry_id: str | None  # None: nothing matched, the generic "busy" answer
    score: float


class FaqFallback:
    def __init__(self, entries: list[dict], min_score: float = 0.15):
        """``entries``: rows of ``corpus/faq.jsonl`` (``id``, ``lang``, ``questions``, ``answer``)."""
        self.min_score = min_score
        docs = []
        for e in entries:
            for q in e["questions"]:
                docs.append((e, features(q)))
        df = Counter(f for _, feats in docs for f in feats)
        self._idf = {f: math.log((1 + len(docs)) / (1 + n)) + 1.0 for f, n in df.items()}
        self._entries = [e for e, _ in docs]
        # feature -> [(question index, weight)]: a message scores only the questions it shares a
        # feature with, instead of every question.
        self._postings: dict[str, list[tuple[int, float]]] = {}
        for i, (_, feats) in enumerate(docs):
            for f, w in self._vector(feats).items():
                self._postings.setdefault(f, []).append((i, w))

    @classmethod
    def from_file(cls, path: Path) -> "FaqFallback":
        rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        if not rows:
            raise ValueError(f"{path}: no FAQ entries")
        return cls(rows)

    def _vector(self, feats: Counter) -> dict[str, float]:
        v = {f: c * self._idf.get(f, 0.0) for f, c in feats.items()}
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {f: x / norm for f, x in v.items()}

    def answer(self, text: str) -> Answer:
        scores: dict[int, float] = {}
        for f, w in self._vector(features(text)).items():
            for i, d in self._postings.get(f, ()):
                scores[i] = scores.get(i, 0.0) + w * d
        best, best_score = None, 0.0
        if scores:
            i = min(scores, key=lambda i: (-scores[i], i))  # the highest score, the first question on ties
            if scores[i] > 0.0:
                best, best_score = self._entries[i], scores[i]
        lang = language(text)
        if best is None or best_score < self.min_score:
            return Answer(DEFAULT_ANSWER[lang], None, best_score)
        return Answer(neutral(best["answer"], best.get("lang", lang)), best["id"], round(best_score, 3))

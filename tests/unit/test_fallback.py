"""FAQ retrieval used when the engines cannot answer."""

from __future__ import annotations

import pytest

from switchboard.data.corpus import CORPUS_DIR
from switchboard.serving.fallback import DEFAULT_ANSWER, FaqFallback


@pytest.fixture(scope="module")
def faq():
    return FaqFallback.from_file(CORPUS_DIR / "faq.jsonl")


@pytest.mark.parametrize(
    "question, entry",
    [
        ("Where is my order?", "en-order-status"),
        ("wheres my stuff", "en-order-status"),
        ("How do I return a damaged item?", "en-return-damaged"),
        ("我的订单什么时候发货？", "zh-ship-when"),
        ("退款多久到账", "zh-refund-time"),
    ],
)
def test_known_questions_get_their_faq_answer(faq, question, entry):
    assert faq.answer(question).entry_id == entry


def test_held_out_paraphrases_mostly_find_their_entry(faq):
    import json

    rows = [json.loads(line) for line in (CORPUS_DIR / "heldout.jsonl").read_text().splitlines() if line.strip()]
    pairs = [(r["id"], q) for r in rows for q in r["questions"]]
    hits = sum(faq.answer(q).entry_id == i for i, q in pairs)
    assert hits / len(pairs) > 0.5, f"{hits}/{len(pairs)}"


def test_nonsense_gets_the_generic_answer_in_its_language(faq):
    assert faq.answer("asdf qwer zxcv").text == DEFAULT_ANSWER["en"]
    assert faq.answer("🙂🙂").entry_id is None
    assert faq.answer("嗯嗯嗯").text == DEFAULT_ANSWER["zh"]


def test_slots_become_neutral_words_never_placeholders(faq):
    for question in ("What is the status of order SB12345678?", "订单SB12345678的退款进度", "Is SKU-A1B23 in stock?"):
        text = faq.answer(question).text
        assert "{" not in text and "}" not in text, text


def test_empty_faq_file_fails_loudly(tmp_path):
    (tmp_path / "faq.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no FAQ entries"):
        FaqFallback.from_file(tmp_path / "faq.jsonl")


def test_the_index_finds_what_scoring_every_question_finds(faq):
    """The inverted index is an optimization: same entry and score as cosine against every question."""
    import json

    from switchboard.serving.fallback import features

    rows = [json.loads(line) for line in (CORPUS_DIR / "faq.jsonl").read_text().splitlines() if line.strip()]
    questions = [(r, faq._vector(features(q))) for r in rows for q in r["questions"]]
    held = [json.loads(line) for line in (CORPUS_DIR / "heldout.jsonl").read_text().splitlines() if line.strip()]
    for text in [q for r in held for q in r["questions"]] + ["refund refund", "where", "我的订单"]:
        v = faq._vector(features(text))
        best, best_score = None, 0.0
        for row, d in questions:
            score = sum(w * d.get(f, 0.0) for f, w in v.items())
            if score > best_score:
                best, best_score = row, score
        got = faq.answer(text)
        if best is not None and best_score >= faq.min_score:
            assert (got.entry_id, got.score) == (best["id"], round(best_score, 3)), text
        else:
            assert got.entry_id is None, text

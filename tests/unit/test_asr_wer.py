"""switchboard.asr.wer: one normalization, words for English, characters for Mandarin."""

import pytest

from switchboard.asr.wer import edit_distance, error_rate, exact_share, normalize, units


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Where's my order?", "where's my order"),
        ("Where\u2019s my ORDER", "where's my order"),  # a curly apostrophe is the same word
        ("'quoted' words", "quoted words"),
        ("It costs $5.99!", "it costs 5 99"),
        ("rock-n-roll", "rock n roll"),
        ("\uff21\uff22\uff23  def", "abc def"),  # full-width letters fold (NFKC)
        ("你好，世界！", "你好 世界"),  # CJK punctuation dropped
        ("  ...  ", ""),
        ("", ""),
    ],
)
def test_normalize(text, expected):
    assert normalize(text) == expected


def test_units_are_words_for_english_and_characters_for_mandarin():
    assert units("Where's my order?", "en") == ["where's", "my", "order"]
    assert units("我的订单在哪里？", "zh") == list("我的订单在哪里")
    assert units("我的订单 在哪里") == list("我的订单在哪里")  # detected without a language
    assert units("where is my order") == ["where", "is", "my", "order"]
    assert units("", "zh") == [] and units("") == []


def test_edit_distance():
    assert edit_distance(list("kitten"), list("sitting")) == 3
    assert edit_distance([], ["a", "b"]) == 2
    assert edit_distance(["a", "b"], []) == 2
    assert edit_distance(["a"], ["a"]) == 0


def test_wer_counts_substitutions_insertions_deletions():
    assert error_rate(["the cat sat"], ["the cat sit"]) == pytest.approx(1 / 3)
    assert error_rate(["the cat sat"], ["the cat sat down"]) == pytest.approx(1 / 3)
    assert error_rate(["the cat sat"], ["the sat"]) == pytest.approx(1 / 3)
    assert error_rate(["Where's my order?"], ["where's my order"]) == 0.0


def test_rate_is_corpus_level_not_a_mean_of_sentences():
    # 1 error in 1 word and 0 in 9: 1/10, not the mean of 1.0 and 0.0
    refs = ["hello", "one two three four five six seven eight nine"]
    hyps = ["yellow", "one two three four five six seven eight nine"]
    assert error_rate(refs, hyps) == pytest.approx(0.1)


def test_cer_for_mandarin():
    assert error_rate(["我的订单在哪里"], ["我的定单在哪里"], "zh") == pytest.approx(1 / 7)
    assert error_rate(["我的订单在哪里？"], ["我的订单在哪里"], "zh") == 0.0


def test_empty_references():
    assert error_rate([""], [""]) == 0.0
    assert error_rate([""], ["something"]) == 1.0
    assert error_rate([], []) == 0.0


def test_refs_and_hyps_must_pair_up():
    with pytest.raises(ValueError):
        error_rate(["a", "b"], ["a"])


def test_exact_share_counts_transcripts_equal_after_normalization():
    refs = ["Where is my order?", "退货要多久？", "hello there"]
    assert exact_share(refs, ["where is my order", "退货要多久", "hello their"]) == pytest.approx(2 / 3)
    assert exact_share([], []) == 0.0
    with pytest.raises(ValueError):
        exact_share(refs, refs[:2])

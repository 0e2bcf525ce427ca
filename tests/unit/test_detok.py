import random

import pytest

from switchboard.common.detok import IncrementalDetokenizer, incomplete_utf8_tail


# A byte-level vocabulary: every id is one byte, so Chinese characters span three ids.
def decode(ids):
    return bytes(ids).decode("utf-8", errors="replace")


def test_multibyte_characters_are_held_back_until_complete():
    text = "订单SB123已发货 ✅"
    d = IncrementalDetokenizer(decode)
    deltas = [d.add([byte]) for byte in text.encode()]
    assert "".join(deltas) + d.flush() == text
    assert all("\ufffd" not in x for x in deltas)
    assert deltas[0] == "" and deltas[2] == "订"  # nothing until the third byte of 订


def test_flush_emits_an_unfinished_tail_as_replacement():
    d = IncrementalDetokenizer(decode)
    assert d.add(list("ok".encode())) == "ok"
    assert d.add([0xE8]) == ""
    assert d.flush() == "\ufffd"


def _one_byte_per_id(i):
    return bytes([i])


def test_bytes_no_later_byte_completes_stream_at_once():
    # A random model repeating a lone continuation byte: each one is U+FFFD for good.
    d = IncrementalDetokenizer(decode, _one_byte_per_id)
    assert [d.add([0x80]) for _ in range(3)] == ["\ufffd"] * 3
    assert d.add([0xE4]) == ""  # a lead byte: more bytes may complete it
    assert d.add([0xB8]) == "" and d.add([0xAD]) == "中"
    assert d.add([0xE4, 0x41]) == "\ufffdA"  # a lead byte cut short by ASCII
    # A repeated lead byte: each one is final once the next arrives, only the last is held.
    assert [d.add([0xF4]) for _ in range(4)] == ["", "\ufffd", "\ufffd", "\ufffd"]
    assert d.add([0x8F, 0xBF, 0xBF]) == "\U0010ffff" and d.flush() == ""
    # Without the bytes, a trailing U+FFFD is always taken for an incomplete character.
    d = IncrementalDetokenizer(decode)
    assert [d.add([0x80]) for _ in range(3)] == ["", "", ""] and d.add(list(b"ok")) == "\ufffd" * 3 + "ok"


def test_multibyte_characters_are_still_held_back_given_the_bytes():
    text = "订单SB123已发货 ✅ 🙂"
    d = IncrementalDetokenizer(decode, _one_byte_per_id)
    deltas = [d.add([byte]) for byte in text.encode()]
    assert "".join(deltas) + d.flush() == text and all("\ufffd" not in x for x in deltas)


@pytest.mark.parametrize(
    "data, incomplete",
    [
        (b"", 0), (b"a", 0), (b"\xe4", 1), (b"\xe4\xb8", 2), (b"\xe4\xb8\xad", 0), (b"\xf0\x9f\x99", 3),
        (b"\xf0\x9f\x99\x82", 0), (b"\x80", 0), (b"\x80\x80\x80\x80", 0), (b"\xe4\x80\x80\x80", 0), (b"\xc3", 1),
        (b"a\xc3", 1), (b"\xff", 0), (b"\xf4\xf4", 1),
    ],
)  # fmt: skip
def test_incomplete_utf8_tail(data, incomplete):
    assert incomplete_utf8_tail(data) == incomplete


def test_what_streams_is_what_the_whole_answer_decodes_to():
    rng = random.Random(0)
    pieces = [b"\x80", b"\xe4", b"\xb8\xad", b"\xf4", b"\xf0\x9f", b"\x99\x82", b"a", b" ", b"\xc3", b"\xa9"]
    vocab = {i: p for i, p in enumerate(pieces)}
    for _ in range(300):
        ids = [rng.randrange(len(pieces)) for _ in range(rng.randrange(1, 30))]
        whole = b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")
        d = IncrementalDetokenizer(
            lambda xs: b"".join(vocab[i] for i in xs).decode("utf-8", errors="replace"), vocab.get
        )
        streamed = "".join(d.add([i]) for i in ids) + d.flush()
        assert streamed == whole, ids

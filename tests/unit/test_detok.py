from switchboard.serving.detok import IncrementalDetokenizer


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

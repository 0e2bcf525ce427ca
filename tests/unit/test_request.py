import json
import math
import re

import numpy as np
import pytest

from switchboard.serving.request import Limits, RequestError, parse_chat_request
from switchboard.serving.router import Router
from switchboard.serving.session import longest_common_prefix

LIMITS = Limits()


def b(x):
    return np.asarray([[x]], dtype=np.object_)


def parse(params=None, **inputs):
    return parse_chat_request(inputs, params or {}, LIMITS)


def test_defaults():
    r = parse(text=b("Where is my order?".encode()))
    assert (r.text, r.session_id, r.max_new_tokens, r.temperature, r.top_p, r.priority) == (
        "Where is my order?",
        None,
        LIMITS.default_max_new_tokens,
        0.0,
        1.0,
        2,
    )


def test_all_fields():
    r = parse(
        {"chat_priority": 1, "seed": 7},
        text=b("你好".encode()),
        session_id=b(b"s-1"),
        max_new_tokens=np.asarray([[12]], np.int32),
        temperature=np.asarray([[0.7]], np.float32),
        top_p=np.asarray([[0.9]], np.float32),
        presence_penalty=np.asarray([[-2.0]], np.float32),
        frequency_penalty=np.asarray([[0.5]], np.float32),
    )
    assert (r.text, r.session_id, r.max_new_tokens, r.priority, r.seed) == ("你好", "s-1", 12, 1, 7)
    assert math.isclose(r.temperature, 0.7, rel_tol=1e-6)
    assert (r.presence_penalty, r.frequency_penalty) == (-2.0, 0.5)
    assert parse(text=b(b"hi")).presence_penalty == parse(text=b(b"hi")).frequency_penalty == 0.0


@pytest.mark.parametrize(
    "inputs, params, message",
    [
        ({}, {}, "text: required"),
        ({"text": b(b"")}, {}, "text: empty"),
        ({"text": b(b"   \n\t")}, {}, "text: empty"),
        ({"text": b(b"\xff\xfe")}, {}, "not valid UTF-8"),
        ({"text": b(b"\x00\x1b")}, {}, "text: empty"),  # control characters are dropped, then nothing is left
        ({"text": b(b"hi"), "session_id": b(b"a\x00b")}, {}, "session_id: contains control character U+0000"),
        ({"text": b(b"x" * 20000)}, {}, "over the limit"),
        ({"text": np.asarray([[b"a"], [b"b"]], np.object_)}, {}, "exactly one value"),
        ({"text": b(b"hi"), "session_id": b(b"")}, {}, "session_id: empty"),
        ({"text": b(b"hi"), "session_id": b(b"s" * 300)}, {}, "session_id: 300 bytes"),
        ({"text": b(b"hi"), "max_new_tokens": np.asarray([[-1]], np.int32)}, {}, "max_new_tokens: -1"),
        ({"text": b(b"hi"), "max_new_tokens": np.asarray([[0]], np.int32)}, {}, "max_new_tokens: 0"),
        ({"text": b(b"hi"), "max_new_tokens": np.asarray([[100000]], np.int32)}, {}, "max_new_tokens: 100000"),
        ({"text": b(b"hi"), "temperature": np.asarray([[np.nan]], np.float32)}, {}, "temperature"),
        ({"text": b(b"hi"), "temperature": np.asarray([[-1]], np.float32)}, {}, "temperature"),
        ({"text": b(b"hi"), "top_p": np.asarray([[0]], np.float32)}, {}, "top_p"),
        ({"text": b(b"hi"), "top_p": np.asarray([[np.inf]], np.float32)}, {}, "top_p"),
        (
            {"text": b(b"hi"), "presence_penalty": np.asarray([[2.5]], np.float32)},
            {},
            "presence_penalty: 2.5 is outside",
        ),
        ({"text": b(b"hi"), "frequency_penalty": np.asarray([[np.nan]], np.float32)}, {}, "frequency_penalty: nan"),
        ({"text": b(b"hi")}, {"chat_priority": 3}, "chat_priority: 3"),
        ({"text": b(b"hi")}, {"chat_priority": "high"}, "chat_priority"),
        ({"text": b(b"hi")}, {"chat_priority": True}, "chat_priority"),
        ({"text": b(b"hi"), "response_format": b(b"{")}, {}, "response format: not JSON"),
        ({"text": b(b"hi"), "response_format": b(b'{"type": "xml"}')}, {}, '"type" must be'),
        ({"text": b(b"hi"), "response_format": b(b'{"type": "json_schema"}')}, {}, 'needs a "schema"'),
        ({"text": b(b"hi"), "response_format": b(b" " * 70000)}, {}, "response_format: 70000 bytes"),
    ],
)
def test_rejects(inputs, params, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        parse(params, **inputs)


def test_a_response_format_is_carried_as_normalized_json():
    spec = {"type": "json_schema", "schema": {"type": "object", "required": ["a"]}}
    r = parse(text=b(b"hi"), response_format=b(json.dumps(spec, indent=2).encode()))
    assert json.loads(r.response_format) == spec and "\n" not in r.response_format
    assert parse(text=b(b"hi")).response_format is None
    # the client's order of properties is kept: the grammar writes them in that order
    ordered = {"type": "json_schema", "schema": {"properties": {"z": {}, "a": {}, "m": {}}}}
    r = parse(text=b(b"hi"), response_format=b(json.dumps(ordered).encode()))
    assert list(json.loads(r.response_format)["schema"]["properties"]) == ["z", "a", "m"]


def test_control_characters_in_a_message_are_dropped_but_tab_and_newlines_kept():
    # OpenAI's API accepts them, and a conversation sent back may hold one an earlier answer wrote.
    assert parse(text=b(b"hi\x00 the\x1b[0mre\x7f\x10\xc2\x85!\t\r\n")).text == "hi the[0mre!\t\r\n"


def test_accepts_unicode_that_is_not_control():
    for text in ["emoji 😀📦", "e\u0301", "مرحبا بك", "订单 SKU-A7X92 多少钱？"]:
        assert parse(text=b(text.encode())).text == text


def test_lcp_and_router():
    assert longest_common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert longest_common_prefix([], [1]) == 0
    router = Router(10)
    assert router.route(10) == ("short", "engine_short")
    assert router.route(11) == ("long", "engine_long")

"""chat's answer as OpenAI's responses: stop sequences, usage, the shapes of a response and its chunks."""

from __future__ import annotations

import json

import pytest

from switchboard.gateway.openai_response import Completion, StopScanner, usage
from switchboard.wire import ChatStats, FinishReason


@pytest.mark.parametrize(
    "stops, deltas, out, stopped",
    [
        ((), ["ab", "cd"], "abcd", False),
        (("cd",), ["ab", "c", "de"], "ab", True),
        (("END",), ["xxE", "N", "Dyy"], "xx", True),
        (("END",), ["xxE", "Nope"], "xxENope", False),
        (("a", "bc"), ["xb", "ca"], "x", True),
        (("。",), ["您好", "。再见"], "您好", True),
    ],
)
def test_stop_sequences_cut_the_text_across_deltas(stops, deltas, out, stopped):
    s = StopScanner(stops)
    text = "".join(s.feed(d) for d in deltas) + s.flush()
    assert (text, s.stopped) == (out, stopped)


def test_usage_counts_cached_tokens_and_the_shapes():
    stats = ChatStats(prompt_tokens=70, reused_tokens=64, generated_tokens=9, finish_reason=FinishReason.LENGTH)
    assert usage(stats) == {
        "prompt_tokens": 70,
        "completion_tokens": 9,
        "total_tokens": 79,
        "prompt_tokens_details": {"cached_tokens": 64},
    }
    c = Completion("m")
    r = c.response("hi", stats, False, with_stats=True)
    assert r["choices"][0]["finish_reason"] == "length" and r["switchboard"]["reused_tokens"] == 64
    assert "engine_queue_ms" not in r["switchboard"]  # internals stay in
    assert c.response("hi", stats, True, with_stats=False)["choices"][0]["finish_reason"] == "stop"
    assert "switchboard" not in c.response("hi", stats, False, with_stats=False)
    chunk = c.chunk({"content": "x"}, include_usage=True)
    assert chunk["usage"] is None and chunk["id"] == r["id"] and json.dumps(chunk)
    assert c.usage_chunk(stats, False)["choices"] == []

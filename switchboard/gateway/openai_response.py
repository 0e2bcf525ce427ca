"""``chat``'s answer and stats as OpenAI Chat Completions responses: the whole response, the
stream's chunks and its server-sent events, the finish reason and usage, stop sequences cut
from streamed text, and the stats a caller may see. Pure functions and dataclasses: no HTTP,
no gRPC; the request's side is ``openai_request``.

A voice chat's transcript comes back under ``switchboard.asr`` (``Completion``).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from switchboard.wire import ChatStats, FinishReason


class StopScanner:
    """Cuts streamed text at the first of the stop sequences. Holds back the last
    ``longest - 1`` characters, which could be the start of one, until the next delta."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.pending = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        """The text that can go out now; after a stop sequence, nothing more."""
        if self.stopped:
            return ""
        if not self.stops:
            return delta
        self.pending += delta
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending, self.stopped = self.pending[:cut], "", True
            return out
        if self.hold == 0:
            out, self.pending = self.pending, ""
            return out
        out, self.pending = self.pending[: -self.hold], self.pending[-self.hold :]
        return out

    def flush(self) -> str:
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out


def finish_reason(stats: ChatStats | None, stopped: bool) -> str:
    if stopped:
        return "stop"
    if stats is not None and stats.finish_reason == FinishReason.LENGTH:
        return "length"
    if stats is not None and stats.finish_reason == FinishReason.TOOL_CALLS:
        return "tool_calls"
    return "stop"  # a stop token, or the FAQ's whole answer (stats.fallback)


def usage(stats: ChatStats | None) -> dict:
    prompt, completion, cached = (
        (stats.prompt_tokens, stats.generated_tokens, stats.reused_tokens) if stats else (0, 0, 0)
    )
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


# The stats a client may see with X-Switchboard-Stats (the web page's "stats"): what the answer
# cost and where it came from, no internals beyond that.
PUBLIC_STATS = (
    "prompt_tokens",
    "reused_tokens",
    "generated_tokens",
    "ttft_ms",
    "total_ms",
    "route",
    "fallback",
    "fallback_reason",
    "cache_miss",
    "dropped_turns",
    "finish_reason",
    "priority",
    "asr",  # a voice chat's: transcript, language, asr_ms, audio_s
)


def public_stats(stats: ChatStats | None) -> dict:
    d = stats.to_dict() if stats else {}
    return {k: d[k] for k in PUBLIC_STATS if k in d}


@dataclass
class Completion:
    """The ids and times one response's chunks share."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    def response(
        self,
        text: str,
        stats: ChatStats | None,
        stopped: bool,
        with_stats: bool,
        heard: dict | None = None,
        scored: list[dict] | None = None,
        tool_calls: list[dict] | None = None,
    ) -> dict:
        """The whole answer (with ``tool_calls``, its content is null when it wrote no text);
        ``heard`` (a voice chat's transcript, language, asr_ms, audio_s) under ``switchboard.asr``
        whether or not the stats were asked for: it is what the caller said."""
        out = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None if tool_calls and not text.strip() else text,
                        "refusal": None,
                        **({"tool_calls": tool_calls} if tool_calls else {}),
                    },
                    "finish_reason": finish_reason(stats, stopped),
                    "logprobs": None if scored is None else {"content": scored, "refusal": None},
                }
            ],
            "usage": usage(stats),
            "system_fingerprint": None,
        }
        if with_stats:
            out["switchboard"] = public_stats(stats)
        if heard is not None:
            out.setdefault("switchboard", {})["asr"] = heard
        return out

    def chunk(
        self,
        delta: dict,
        finish: str | None = None,
        include_usage: bool = False,
        heard: dict | None = None,
        scored: list[dict] | None = None,
    ) -> dict:
        """One chunk of the stream; the first of a voice chat's carries ``switchboard.asr``
        (``heard``), so a client shows what was heard before the answer."""
        out = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "finish_reason": finish,
                    "logprobs": {"content": scored, "refusal": None} if scored else None,
                }
            ],
            "system_fingerprint": None,
        }
        if include_usage:
            out["usage"] = None  # OpenAI: null on every chunk but the last, which has no choices
        if heard is not None:
            out["switchboard"] = {"asr": heard}
        return out

    def usage_chunk(self, stats: ChatStats | None, with_stats: bool) -> dict:
        out = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(stats),
            "system_fingerprint": None,
        }
        if with_stats:
            out["switchboard"] = public_stats(stats)
        return out


def sse(data: dict | str) -> bytes:
    """One server-sent event."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()

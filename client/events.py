"""What the SDK's transports give back, whichever carried it: the events of a stream (text
deltas, ``TokenLogprobs``, ``ToolCallDeltas``, ``Heard``, ``ChatStats``, ``AsrResult``), the
whole replies they add up to, ``ChatError``, and the decoders that turn one response's outputs
into events."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from switchboard.wire import Asr, AsrResult, Chat, ChatStats, VoiceChat, untag


class ChatError(RuntimeError):
    """The server refused or failed the chat. ``code`` is the gRPC status (e.g. INVALID_ARGUMENT)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


# Triton's own refusals that a retry later can get past: its queue in front of chat is full or
# its wait ran out (overloaded), or the server is stopping or has not loaded chat yet (restart).
# No status code reaches a stream client for them in 2.51, only these messages.
TRITON_RETRYABLE = (
    "Exceeds maximum queue size",
    "Request timeout expired",
    "Server is stopping",
    "has no available versions",
)


def error_code(message: str, status: str | None = None) -> tuple[str | None, str]:
    """(gRPC status name or None, message) of an error: the code the model wrote at the head of
    its message (switchboard.wire), else the call's own ``status`` (``StatusCode.UNAVAILABLE``
    when the server is gone), else UNAVAILABLE for Triton's retryable refusals, else None
    (Triton's own dtype/shape checks)."""
    code, message = untag(message)
    if code is None and status:
        code = status.split(".")[-1]
    if code is None and any(m in message for m in TRITON_RETRYABLE):
        code = "UNAVAILABLE"  # overloaded or restarting: retry later
    return code, message


@dataclass
class ToolCallDeltas:
    """With tools: the calls as the answer writes them, OpenAI's stream deltas: a call's first
    ``{"index", "id", "type": "function", "function": {"name", "arguments"}}``, then ``{"index",
    "function": {"arguments"}}`` with more of its arguments."""

    deltas: list[dict]

    def joined(self, calls: list[dict]) -> list[dict]:
        """``calls`` (whole calls so far) with these deltas added."""
        calls = [dict(c, function=dict(c["function"])) for c in calls]
        for d in self.deltas:
            if d["index"] >= len(calls):
                calls.append({"id": d.get("id"), "type": "function", "function": {"name": "", "arguments": ""}})
            fn = calls[d["index"]]["function"]
            fn["name"] = d.get("function", {}).get("name") or fn["name"]
            fn["arguments"] += d.get("function", {}).get("arguments", "")
        return calls


@dataclass
class TokenLogprobs:
    """With ``logprobs``: the tokens' log-probabilities up to the text delta that follows, as
    OpenAI's ``logprobs.content`` entries (``token``, ``logprob``, ``bytes``, ``top_logprobs``)."""

    entries: list[dict]


@dataclass(frozen=True)
class ChatReply:
    text: str
    stats: ChatStats
    logprobs: list[dict] | None = None  # with logprobs asked: every token's entry (TokenLogprobs)
    # with tools: the calls the answer made, OpenAI's {"id", "type": "function", "function":
    # {"name", "arguments": JSON text}} (stats.finish_reason "tool_calls")
    tool_calls: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Heard:
    """What the recognizer heard: ``voice_chat``'s first event, before the answer. An empty
    ``transcript`` (silence) is followed by no answer, only the stats."""

    transcript: str
    language: str | None = None
    asr_ms: float | None = None
    audio_s: float | None = None  # seconds of audio

    @classmethod
    def from_dict(cls, d: dict) -> "Heard":
        return cls(str(d.get("transcript") or ""), d.get("language"), d.get("asr_ms"), d.get("audio_s"))

    def to_dict(self) -> dict:
        return {
            "transcript": self.transcript,
            "language": self.language,
            "asr_ms": self.asr_ms,
            "audio_s": self.audio_s,
        }


@dataclass(frozen=True)
class VoiceReply:
    """A whole voice chat: what was heard, the answer (empty after silence), its stats."""

    heard: Heard
    text: str
    stats: ChatStats | None


def collect_reply(events) -> ChatReply:
    """A chat's events as one ``ChatReply``."""
    parts, stats, scored, calls = [], None, None, []
    for event in events:
        if isinstance(event, ChatStats):
            stats = event
        elif isinstance(event, TokenLogprobs):
            scored = (scored or []) + event.entries
        elif isinstance(event, ToolCallDeltas):
            calls = event.joined(calls)
        else:
            parts.append(event)
    return ChatReply("".join(parts), stats, scored, calls)


def collect_voice(events: list) -> VoiceReply:
    heard = next((e for e in events if isinstance(e, Heard)), Heard(""))
    stats = next((e for e in events if isinstance(e, ChatStats)), None)
    return VoiceReply(heard, "".join(e for e in events if isinstance(e, str)), stats)


def collect_transcript(events: list) -> AsrResult:
    result = next((e for e in events if isinstance(e, AsrResult)), None)
    if result is None:  # the stream ended without its result: the server went away mid-transcript
        raise ChatError("the transcription ended without its result", "UNAVAILABLE")
    return result


# -- responses: each model's outputs as events -----------------------------------------------------
# A decoder takes one response's outputs (name -> the bytes of its [1, 1] BYTES tensor; absent
# outputs absent) and gives (its events, whether it is the request's last response).
def chat_decoder(outputs: dict[str, bytes]) -> tuple[list, bool]:
    """chat: text deltas (str), each after its ``TokenLogprobs`` when asked, then its ``ChatStats``
    on the last response."""
    events: list = []
    if outputs.get(Chat.LOGPROBS_OUTPUT):
        events.append(TokenLogprobs(json.loads(outputs[Chat.LOGPROBS_OUTPUT])))
    if outputs.get(Chat.TOOL_CALLS):
        events.append(ToolCallDeltas(json.loads(outputs[Chat.TOOL_CALLS])))
    if outputs.get(Chat.TEXT_OUTPUT):
        events.append(outputs[Chat.TEXT_OUTPUT].decode("utf-8"))
    if Chat.STATS in outputs:
        events.append(ChatStats.from_json(outputs[Chat.STATS]))
    return events, Chat.STATS in outputs


def asr_decoder(outputs: dict[str, bytes]) -> tuple[list, bool]:
    """asr: transcript deltas (str), then the ``AsrResult`` (its ``result`` is "" before the last)."""
    events: list = []
    if outputs.get(Asr.TEXT):
        events.append(outputs[Asr.TEXT].decode("utf-8"))
    if outputs.get(Asr.RESULT):
        events.append(AsrResult.from_json(outputs[Asr.RESULT]))
    return events, bool(outputs.get(Asr.RESULT))


def voice_decoder(outputs: dict[str, bytes]) -> tuple[list, bool]:
    """voice_chat: ``Heard`` (its first response's stats name the transcript), then chat's
    deltas and ``ChatStats`` (with ``asr``), which end it."""
    events: list = []
    if outputs.get(VoiceChat.TEXT_OUTPUT):
        events.append(outputs[VoiceChat.TEXT_OUTPUT].decode("utf-8"))
    if not outputs.get(VoiceChat.STATS):
        return events, False
    stats = json.loads(outputs[VoiceChat.STATS])
    if "transcript" in stats:
        return [Heard.from_dict(stats), *events], False
    return [*events, ChatStats.from_dict(stats)], True

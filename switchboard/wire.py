"""The wire contract between Switchboard's server and its clients (the SDK, perf tools, the
``chat`` model calling its pools): what both sides must agree on, in one place. The SDK imports
only this module and switchboard.codec (the messages themselves) from the server side.

Priorities. ``1`` (live/VIP) or ``2`` (default), sent as Triton's request priority (which
orders the model's queue) and as the request parameter ``chat_priority``, which the pipeline
carries to the engine's scheduler (Python models in Triton 2.51 cannot read Triton's
priority).

Status codes are carried in the text of error messages. Over a gRPC stream, Triton 2.51 sends
a model's error code only when the client opens the stream with the header
``triton_grpc_error: true``, and that mode ends the stream with a gRPC status, a path in which
2.51 can crash (docs/reliability.md). So the models put the code at the head of the message,
``[INVALID_ARG] text: empty message``, which any client sees (the SDK, perf_analyzer, a
hand-written client) and the SDK turns back into a gRPC status name.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from enum import Enum, StrEnum

PRIORITY_LIVE, PRIORITY_DEFAULT = 1, 2
PRIORITY_PARAMETER = "chat_priority"
# The request parameter carrying a request's W3C trace context (switchboard/common/tracing.py)
# from the gateway to chat and from chat to a pool.
TRACE_PARAMETER = "traceparent"
# gRPC metadata the SDK sends with a session's chats: a balancer in front of several replicas
# hashes it to keep the session on one replica (switchboard/ops/balancer.py).
SESSION_HEADER = "x-session-id"
# A stream the SDK keeps open between chats is ended rather than reused once this old: a balancer
# routes a stream once, so its chats move to a replica added (or off one drained) within this
# time, as gRPC's max connection age does for connections.
STREAM_MAX_AGE_S = 15.0


MAX_TOP_LOGPROBS = 5  # logprobs: alternatives per token at most (the engine scores; OpenAI allows 20)


class Chat:
    """Tensor names of the ``chat`` model (model_repository/chat/config.pbtxt)."""

    TEXT = "text"  # BYTES [1]: the customer's message (UTF-8)
    SESSION_ID = "session_id"  # BYTES [1], optional: multi-turn session
    MAX_NEW_TOKENS = "max_new_tokens"  # INT32 [1], optional
    TEMPERATURE = "temperature"  # FP32 [1], optional (0: greedy)
    TOP_P = "top_p"  # FP32 [1], optional
    # BYTES [1], optional, instead of session_id: the conversation before ``text`` as the client
    # keeps it (JSON list of {"role", "content"}; stateless, as OpenAI's API; the pools reuse its
    # prefix's KV blocks by content, no session needed)
    HISTORY = "history"
    # BYTES [1], optional: what the answer must be, as JSON: {"type": "json_object"} or
    # {"type": "json_schema", "schema": {...}} (switchboard/artifact/grammar.py)
    RESPONSE_FORMAT = "response_format"
    LOGPROBS = "logprobs"  # INT32 [1], optional: each token's logprob and this many alternatives (0-5)
    # BYTES [1], optional: the functions the answer may call, OpenAI's ``tools`` as JSON
    # ([{"type": "function", "function": {"name", "description", "parameters"}}])
    TOOLS = "tools"
    # BYTES [1], optional: "auto" (the default with tools), "none", "required", or one
    # function's name to call (OpenAI's {"type": "function", ...} as JSON works too)
    TOOL_CHOICE = "tool_choice"
    # BYTES [1], optional: the results of the last answer's calls, JSON list of
    # {"tool_call_id", "content"}; they come before ``text``, which may then be left out
    TOOL_RESULTS = "tool_results"
    # FP32 [1], optional, -2 to 2 (0: none): OpenAI's repetition control, over the answer's own tokens
    PRESENCE_PENALTY = "presence_penalty"
    FREQUENCY_PENALTY = "frequency_penalty"
    INPUTS = (
        TEXT,
        SESSION_ID,
        MAX_NEW_TOKENS,
        TEMPERATURE,
        TOP_P,
        HISTORY,
        RESPONSE_FORMAT,
        LOGPROBS,
        TOOLS,
        TOOL_CHOICE,
        TOOL_RESULTS,
        PRESENCE_PENALTY,
        FREQUENCY_PENALTY,
    )
    TEXT_OUTPUT = "text_output"  # BYTES [1]: a text delta
    STATS = "stats"  # BYTES [1], on the last response: ChatStats as JSON
    # BYTES [1], when logprobs were asked: JSON list, per token up to this response's text, of
    # {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]} (OpenAI's)
    LOGPROBS_OUTPUT = "logprobs"
    # BYTES [1], when the answer calls tools: JSON list of OpenAI's stream deltas, the first of a
    # call {"index", "id", "type": "function", "function": {"name", "arguments"}}, then
    # {"index", "function": {"arguments"}} as its arguments arrive
    TOOL_CALLS = "tool_calls"


class Asr:
    """Tensor names of the ``asr`` model (model_repository/asr/config.pbtxt)."""

    AUDIO = "audio"  # BYTES [1]: an audio file as uploaded (WAV, FLAC, OGG Vorbis/Opus, ...)
    LANGUAGE = "language"  # BYTES [1], optional: "en", "zh", ... ("" or absent: detected)
    INPUTS = (AUDIO, LANGUAGE)
    TEXT = "text"  # BYTES [1]: a transcript delta
    RESULT = "result"  # BYTES [1]: "" but on the last response: AsrResult as JSON
    OUTPUTS = (TEXT, RESULT)
    # request parameter (bool, default true): false sends no text deltas, only the last response
    # with the result, for a caller that does not stream (every response is a send through the
    # server and a message for the client to read)
    DELTAS = "asr_deltas"


class AsrError(StrEnum):
    """Why an audio file was refused: ``[INVALID_ARG] [code] message`` (the gateway answers
    TOO_LONG with 413, the others with 400)."""

    EMPTY = "empty"  # 0 bytes
    NOT_AUDIO = "not_audio"  # not an audio file the server can read
    UNSUPPORTED = "unsupported"  # an audio container whose codec or sample format is not read
    TOO_LONG = "too_long"  # over the server's max_audio_s
    NO_SAMPLES = "no_samples"  # a valid file with 0 samples
    TRUNCATED = "truncated"  # the header promises more than the file holds
    BAD_LANGUAGE = "bad_language"  # a language the recognizer does not know


class VoiceChat:
    """Tensor names of ``voice_chat``: audio in, ``chat``'s answer out (model_repository/voice_chat).

    Its inputs are chat's with ``audio`` (and ``language``) in place of ``text``; its outputs are
    chat's. The first response carries no text and stats ``{"transcript", "language", "asr_ms",
    "audio_s"}``; the last one's stats are chat's with those under ``"asr"``."""

    AUDIO = Asr.AUDIO
    LANGUAGE = Asr.LANGUAGE
    INPUTS = (AUDIO, LANGUAGE) + tuple(name for name in Chat.INPUTS if name != Chat.TEXT)
    TEXT_OUTPUT = Chat.TEXT_OUTPUT
    STATS = Chat.STATS


class Pool:
    """Tensor and parameter names of a generation pool (``engine_short``, ``engine_long``)."""

    INPUT_IDS = "input_ids"  # INT32 [tokens]
    MAX_NEW_TOKENS = "max_new_tokens"
    TEMPERATURE = "temperature"
    TOP_P = "top_p"
    PRESENCE_PENALTY = "presence_penalty"  # FP32 [1], optional (Chat's)
    FREQUENCY_PENALTY = "frequency_penalty"
    TOKEN_IDS = "token_ids"  # INT32 [n]: generated tokens
    STATS = "stats"  # on the last response: EngineStats as JSON
    # BYTES [1], with token_ids when asked (parameter LOGPROBS): JSON, per token
    # [logprob, [[id, logprob], ...]] (the likeliest alternatives)
    LOGPROBS = "logprobs"
    OUTPUTS = (TOKEN_IDS, STATS, LOGPROBS)
    # request parameters
    FINGERPRINT = "fingerprint"  # the model variant chat built the prompt for (KV reuse only if the pool's)
    KV_REUSE = "kv_reuse"  # true: reuse the prompt's stored KV blocks and store the new ones
    EXPECTED_REUSE = "expected_reuse"  # prompt tokens the session stored KV for (for the miss reason)
    SEED = "seed"
    RESPONSE_FORMAT = "response_format"  # the answer's constraint as chat checked it (JSON), if any
    # also a parameter: -1 (absent) none; 0-5 each token's logprob and that many alternatives
    PING = "ping"  # true: answer at once, before the engine (is the stub alive?)


# Triton's error codes (TRITONSERVER_Error_Code) to the gRPC status names clients know.
GRPC_NAMES = {
    "UNKNOWN": "UNKNOWN",
    "INTERNAL": "INTERNAL",
    "NOT_FOUND": "NOT_FOUND",
    "INVALID_ARG": "INVALID_ARGUMENT",
    "UNAVAILABLE": "UNAVAILABLE",
    "UNSUPPORTED": "UNIMPLEMENTED",
    "ALREADY_EXISTS": "ALREADY_EXISTS",
    "CANCELLED": "CANCELLED",
}

_TAG = re.compile(r"\[([A-Z_]+)\] ")


def tag(code: str, message: str) -> str:
    """``message`` headed by the Triton code name, e.g. ``tag("INVALID_ARG", "text: empty")``."""
    if code not in GRPC_NAMES:
        raise ValueError(f"unknown Triton error code {code!r}")
    return f"[{code}] {message}"


def untag(message: str) -> tuple[str | None, str]:
    """(gRPC status name or None, message without its tag). Messages Triton wrote itself (a
    wrong dtype or shape, refused before the model runs) carry no tag and give None."""
    match = _TAG.match(message)
    if match is None or match.group(1) not in GRPC_NAMES:
        return None, message
    return GRPC_NAMES[match.group(1)], message[match.end() :]


# gRPC backs off between attempts to reach a server that is down, 1 s growing to 120 s, and
# every channel of a process to the same address shares that state (one subchannel): after a
# restart by switchboard.ops.supervisor even a channel opened once the server was back
# failed at once with UNAVAILABLE for seconds, and a supervisor probe in such a process failed
# on the new, healthy server. Capped at 1 s, clients reach it within about a second.
RECONNECT_BACKOFF_MS = 1000


def channel_args(private: bool = False) -> list[tuple[str, int]]:
    """tritonclient's channel options with the reconnect backoff capped. ``private``: a
    subchannel of its own (a new connection), for a health check that must see the server,
    not the state this process's other channels are in."""
    import tritonclient.grpc as grpcclient

    keepalive = grpcclient.KeepAliveOptions()
    args = [
        ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
    ]
    if private:
        args.append(("grpc.use_local_subchannel_pool", 1))
    return args


# -- closed sets: their values are the strings the JSON has always carried ---------------------
class FinishReason(StrEnum):
    STOP = "stop"  # a stop token
    LENGTH = "length"  # max_new_tokens or the context window
    CANCELLED = "cancelled"  # the client left
    FALLBACK = "fallback"  # answered from the FAQ
    TOOL_CALLS = "tool_calls"  # the answer ended after calling tools


class SessionStatus(StrEnum):
    NONE = "none"  # a one-off chat (no session_id)
    MISS = "miss"  # no entry (new, expired, or the model changed)
    HIT = "hit"
    UNAVAILABLE = "unavailable"  # Redis did not answer in time: answered without the history
    REJECTED = "rejected"  # an entry failed its checks (digest, shape, dtype): not used
    SKIPPED = "skipped"  # answered from the FAQ before the session was read


class CacheMiss(StrEnum):
    """Why a turn reused fewer prompt tokens than its session had stored."""

    NONE_STORED = "none_stored"  # nothing stored for this prompt (a first turn, a one-off chat)
    EVICTED = "evicted"  # stored blocks are gone (evicted, expired, or their write failed)
    FINGERPRINT_CHANGED = "fingerprint_changed"  # the session was written by another model variant
    WINDOW_SLID = "window_slid"  # older turns left the prompt, so its start changed
    REDIS_UNAVAILABLE = "redis_unavailable"
    DIGEST_FAILED = "digest_failed"  # a block failed its checks: the reused prefix ends before it


class FallbackReason(StrEnum):
    QUEUE_FORECAST = "queue_forecast"  # would not get a generation slot in time
    QUEUE_TIMEOUT = "queue_timeout"  # waited out max_queue_wait_s
    QUEUE_FULL = "queue_full"  # max_pending chats already waited
    SHUTTING_DOWN = "shutting_down"
    ENGINE_TIMEOUT = "engine_timeout"  # a pool sent nothing in time
    ENGINE_ERROR = "engine_error"  # both pools failed
    LATENCY_BREAKER = "latency_breaker"  # priority 2 while recent P99 time to first token is over its bound


class Route(StrEnum):
    SHORT = "short"
    LONG = "long"


# -- stats: the JSON in the ``stats`` output, typed ---------------------------------------------
def _plain(value):
    return value.value if isinstance(value, Enum) else value


def _enum(kind, value):
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        return value  # a newer server's value: kept as the string it is


@dataclass
class EngineStats:
    """What a pool reports with its last response (``chat`` reads it)."""

    reason: FinishReason | None = None
    generated: int = 0
    queue_ms: float | None = None  # waiting for a row
    prefill_ms: float | None = None
    batch_size: int | None = None  # rows in the batch it joined
    engine_ms: float | None = None  # from submission to the last token
    reused: int = 0  # prompt tokens whose KV came from stored blocks
    kv_local_blocks: int = 0  # of them, blocks found in the pool's own cache
    kv_redis_blocks: int = 0  # and blocks read from Redis
    cache_miss: CacheMiss | None = None  # why fewer than expected_reuse tokens were found
    drafted: int = 0  # tokens drafted for it and verified (speculative decoding)
    accepted: int = 0  # ... and kept: forward passes it did not need

    def to_json(self) -> str:
        return json.dumps({k: _plain(v) for k, v in asdict(self).items()})

    @classmethod
    def from_json(cls, blob: bytes | str) -> EngineStats:
        d = json.loads(blob)
        known = {f.name for f in fields(cls)}
        out = cls(**{k: v for k, v in d.items() if k in known})
        out.reason = _enum(FinishReason, out.reason)
        out.cache_miss = _enum(CacheMiss, out.cache_miss)
        return out


@dataclass
class ChatStats:
    """The ``stats`` of a chat's final response; the SDK returns it as the last event."""

    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from stored blocks (this session's or shared)
    kv_local_blocks: int = 0  # blocks of them found in the pool's own cache (no KV moved)
    kv_redis_blocks: int = 0  # blocks of them read from Redis
    cache_miss: CacheMiss | None = None  # why the prompt reused less than it could have; None: it did not
    generated_tokens: int = 0
    route: Route | None = None  # None: answered from the FAQ
    ttft_ms: float | None = None
    total_ms: float | None = None
    fallback: bool = False
    fallback_reason: FallbackReason | None = None  # in the JSON only when fallback
    faq_id: str | None = None  # in the JSON only when fallback; None: no entry matched
    session: SessionStatus = SessionStatus.NONE
    dropped_turns: int = 0  # old turns left out of the prompt to fit the context window
    finish_reason: FinishReason | None = None
    engine_queue_ms: float | None = None
    engine_prefill_ms: float | None = None  # from its prompt's first prefill chunk to its first token
    engine_ms: float | None = None
    batch_size: int | None = None
    drafted_tokens: int = 0  # speculative decoding: tokens drafted for the answer and verified
    accepted_tokens: int = 0  # ... and kept (generated in fewer forward passes than tokens)
    priority: int = PRIORITY_DEFAULT
    model_version: int | None = None  # the pools' model version that served it (a canary's during a rollout)
    failover_tokens: int = 0  # tokens streamed before a pool failed mid-answer and the other went on (0: none)
    # voice_chat only (in the JSON only then): the question's AsrResult.voice() (transcript,
    # language, asr_ms, audio_s)
    asr: dict | None = None
    extra: dict = field(default_factory=dict, repr=False)  # keys this version does not know

    def to_dict(self) -> dict:
        """The stats as plain JSON values (enums as their strings)."""
        d = {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name != "extra"}
        if not self.fallback:
            del d["fallback_reason"], d["faq_id"]
        if self.asr is None:
            del d["asr"]
        return {**d, **self.extra}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @property
    def raw(self) -> dict:
        """The stats as the JSON carried them."""
        return self.to_dict()

    @classmethod
    def from_dict(cls, d: dict) -> ChatStats:
        known = {f.name for f in fields(cls)} - {"extra"}
        out = cls(**{k: v for k, v in d.items() if k in known}, extra={k: v for k, v in d.items() if k not in known})
        out.route = _enum(Route, out.route)
        out.fallback_reason = _enum(FallbackReason, out.fallback_reason)
        out.session = _enum(SessionStatus, out.session)
        out.cache_miss = _enum(CacheMiss, out.cache_miss)
        out.finish_reason = _enum(FinishReason, out.finish_reason)
        out.fallback = bool(out.fallback)
        return out

    @classmethod
    def from_json(cls, blob: bytes | str) -> ChatStats:
        return cls.from_dict(json.loads(blob))


@dataclass
class AsrResult:
    """The ``result`` of an ``asr`` request's last response."""

    text: str = ""
    language: str | None = None
    duration: float = 0.0  # seconds of audio
    # [{"id", "start", "end", "text"}]: one per chunk the audio was cut into at silences
    segments: list = field(default_factory=list)
    asr_ms: float | None = None  # arrival to the last text
    queue_ms: float | None = None  # arrival to the first batch that took it
    batch_size: int | None = None  # chunks in the (first) batch it ran in
    chunks: int = 0  # 0: silence, answered without the model

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, blob: bytes | str) -> AsrResult:
        d = json.loads(blob)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def voice(self) -> dict:
        """What ``voice_chat`` reports of the question: its first response's stats, and under
        ``"asr"`` in its last one's."""
        return {"transcript": self.text, "language": self.language, "asr_ms": self.asr_ms, "audio_s": self.duration}

"""``chat``'s metrics, counted in the process: what each finished chat adds (``ChatMetrics``).

Publishing them costs a round trip to the server per update in Triton's Python backend, so the
chat path only records here (a lock and a few dictionary updates); the glue
(switchboard/triton/chat_metrics.py) publishes what accumulated once a second on Triton's
metrics port. Names and units follow Prometheus' conventions (seconds, ``_total``); the list is
in docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from switchboard.common.tally import Tally
from switchboard.serving.order_demo import NAMES as DEMO_TOOLS
from switchboard.wire import ChatStats, SessionStatus

PREFIX = "switchboard_chat_"
# Seconds. The seeds' alert thresholds (800 ms time to first token, 1.5 s) are bucket bounds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0)

# name -> (kind, help, label names, buckets)
METRICS = {
    "time_to_first_token_seconds": (
        "histogram",
        "from the request's arrival at chat to its first text, answered chats and FAQ answers",
        ("priority", "route", "version"),
        LATENCY_BUCKETS,
    ),
    "inter_token_seconds": (
        "histogram",
        "a generated answer's mean time between tokens (after the first)",
        ("priority", "route"),
        ITL_BUCKETS,
    ),
    "duration_seconds": (
        "histogram",
        "from the request's arrival to its final response",
        ("priority", "route", "version"),
        LATENCY_BUCKETS,
    ),
    "requests_total": (
        "counter",
        "chats by outcome (generated, fallback: FAQ answer, invalid, unavailable, cancelled, error) and by the "
        "model version that served them (none: refused before one was chosen)",
        ("outcome", "version"),
        None,
    ),
    "fallbacks_total": ("counter", "FAQ answers by reason", ("reason",), None),
    "sessions_total": (
        "counter",
        "chats by session status (none, miss, hit, rejected, unavailable, skipped)",
        ("status",),
        None,
    ),
    "cache_misses_total": (
        "counter",
        "chats that reused less KV than their session stored, by reason",
        ("reason",),
        None,
    ),
    "generated_tokens_total": ("counter", "tokens generated for answered chats", ("priority",), None),
    # Business metrics (docs/metrics.md, "Business"): conversations, hand-overs, abandoned chats.
    "conversations_total": (
        "counter",
        "conversations started: answers (generated or FAQ) to a conversation's first turn (a new or expired "
        "session, a history with no assistant message, a one-off chat)",
        (),
        None,
    ),
    "tool_calls_total": (
        "counter",
        "tool calls in answers, by tool (the demo's tools by name, any other tool as other)",
        ("tool",),
        None,
    ),
    "handovers_total": (
        "counter",
        "answers that handed the conversation over to a person (called transfer_to_human), at most one an answer",
        (),
        None,
    ),
    "abandoned_total": (
        "counter",
        "chats the client left before their final response, by stage (waiting: before the answer started, "
        "answering: mid-answer)",
        ("stage",),
        None,
    ),
}
HANDOVER_TOOL = "transfer_to_human"
TOOLS = (*DEMO_TOOLS, "other")  # the tool label's values: tools are the client's, their names unbounded
STAGES = ("waiting", "answering")


def tool_label(name: str) -> str:
    """The ``tool`` label of a call of ``name``: the demo's tools by name, any other as ``other``."""
    return name if name in DEMO_TOOLS else "other"


def called_tools(deltas: Iterable[dict]) -> list[str]:
    """The names of the calls that begin in a response's tool-call ``deltas`` (OpenAI's
    streaming shape: a call's first delta names its function, later ones add arguments)."""
    return [d["function"]["name"] for d in deltas if d.get("function", {}).get("name")]


def starts_conversation(session_id: str | None, history: Sequence[dict] | None, session: SessionStatus) -> bool:
    """Whether a chat is its conversation's first turn: a stateless chat whose ``history`` has no
    assistant message, a session chat whose session was not found (new, or expired: a customer
    coming back after the TTL starts a new conversation), a one-off chat (neither). A session
    chat whose session could not be read (unavailable, rejected, or an FAQ answer given before
    reading it: skipped) is not counted: whether it was the first turn is unknown."""
    if history is not None:
        return not any(m.get("role") == "assistant" for m in history)
    if session_id is None:
        return True
    return session == SessionStatus.MISS


def _route(stats: ChatStats) -> str:
    return str(stats.route) if stats.route is not None else "faq"


def version_label(version: int | None) -> str:
    return str(version) if version is not None else "none"


class ChatMetrics(Tally):
    """What finished chats add up to since the last ``drain``."""

    def chat(self, stats: ChatStats, tools: Sequence[str] = (), first_turn: bool = False) -> None:
        """A chat's final response was sent with ``stats``; ``tools``: the names of the calls in
        its answer; ``first_turn``: it started a conversation (``starts_conversation``)."""
        version = ("version", version_label(stats.model_version))
        where = (("priority", str(stats.priority)), ("route", _route(stats)), version)
        with self._lock:
            self._counts["requests_total", (("outcome", "fallback" if stats.fallback else "generated"), version)] += 1
            if stats.fallback and stats.fallback_reason is not None:
                self._counts["fallbacks_total", (("reason", str(stats.fallback_reason)),)] += 1
            self._counts["sessions_total", (("status", str(stats.session)),)] += 1
            if stats.cache_miss is not None:
                self._counts["cache_misses_total", (("reason", str(stats.cache_miss)),)] += 1
            if stats.generated_tokens:
                self._counts["generated_tokens_total", (("priority", str(stats.priority)),)] += stats.generated_tokens
            first = stats.ttft_ms if stats.ttft_ms is not None else stats.total_ms if stats.fallback else None
            if first is not None:
                self._observed.append(("time_to_first_token_seconds", where, first / 1000))
            if stats.total_ms is not None:
                self._observed.append(("duration_seconds", where, stats.total_ms / 1000))
            if stats.ttft_ms is not None and stats.total_ms is not None and stats.generated_tokens > 1:
                gap = (stats.total_ms - stats.ttft_ms) / 1000 / (stats.generated_tokens - 1)
                self._observed.append(("inter_token_seconds", where[:2], gap))
            if first_turn:
                self._counts["conversations_total", ()] += 1
            for name in tools:
                self._counts["tool_calls_total", (("tool", tool_label(name)),)] += 1
            if HANDOVER_TOOL in tools:
                self._counts["handovers_total", ()] += 1

    def failed(self, outcome: str, version: int | None = None) -> None:
        """A chat that ended with an error: ``invalid``, ``unavailable``, ``cancelled`` or
        ``error``; ``version``: the model version it was routed to (None: not yet routed)."""
        with self._lock:
            self._counts["requests_total", (("outcome", outcome), ("version", version_label(version)))] += 1

    def abandoned(self, stage: str, version: int | None = None) -> None:
        """The client left before the final response (``stage``: waiting or answering): a
        ``cancelled`` chat, and an abandoned one."""
        with self._lock:
            self._counts["requests_total", (("outcome", "cancelled"), ("version", version_label(version)))] += 1
            self._counts["abandoned_total", (("stage", stage),)] += 1

"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, each with its
HTTP status; and the mapping from what ``chat`` refuses (the SDK's ``ChatError``: a gRPC status
name and a message naming a field of ``chat``) to the field the HTTP client sent, and from what
``asr`` refuses (``[reason] message``, the reason a ``switchboard.wire.AsrError``) to 400 or 413.

Nothing here puts a traceback, a Python repr or a server path into a message: the messages are
``chat``'s own (written for clients) or written here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# OpenAI's error types by status; its client maps the status to an exception class.
TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
    504: "server_error",
}


@dataclass
class APIError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        super().__init__(self.message)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def overloaded(status: int, message: str, retry_after_s: int) -> APIError:
    """429 (this gateway's limit) or 503 (the server refused or is restarting), with ``Retry-After``."""
    code = "rate_limit_exceeded" if status == 429 else "overloaded"
    return APIError(status, message, None, code, {"Retry-After": str(retry_after_s)})


# chat's field names (the head of its INVALID_ARG messages) to the request's: (param, how to name it).
_CHAT_FIELDS = [
    (re.compile(r"^text is too long"), "messages", None),
    (re.compile(r"^text: "), "messages", "the last user message: "),
    (re.compile(r"^history(\[\d+\])?(\.\w+)?: "), "messages", "the messages before the last: "),
    (re.compile(r"^max_new_tokens: "), "max_tokens", "{max_tokens}: "),
    (re.compile(r"^temperature: "), "temperature", "temperature: "),
    (re.compile(r"^top_p: "), "top_p", "top_p: "),
    (re.compile(r"^presence_penalty: "), "presence_penalty", "presence_penalty: "),
    (re.compile(r"^frequency_penalty: "), "frequency_penalty", "frequency_penalty: "),
    (re.compile(r"^parameter seed: "), "seed", "seed: "),
    (re.compile(r"^parameter chat_priority: "), "priority", "priority: "),
    (re.compile(r"^json_schema: "), "response_format", "response_format.json_schema.schema: "),
    (re.compile(r"^response.format: "), "response_format", "response_format: "),
    (re.compile(r"^(?=tools)"), "tools", ""),  # tools[2].function.name: ..., tools: ... (as sent)
    (re.compile(r"^(?=tool_choice: )"), "tool_choice", ""),
    (re.compile(r"^tool_results(\[\d+\])?(\.\w+)?: "), "messages", "the tool messages that end the conversation: "),
]


def from_chat_error(
    code: str | None, message: str, retry_after_s: int, max_tokens_param: str = "max_tokens", service: str = "chat"
):
    """The ``APIError`` for a chat that ``chat`` (or Triton in front of it) refused; ``service``
    names what refused it in the messages of the statuses that are not the client's fault."""
    if code == "INVALID_ARGUMENT":
        for pattern, param, head in _CHAT_FIELDS:
            m = pattern.match(message)
            if m is None:
                continue
            if head is None:  # the prompt does not fit the model's context window
                return bad_request(
                    message.replace("text is too long", "messages are too long", 1), param, "context_length_exceeded"
                )
            param = max_tokens_param if param == "max_tokens" else param
            return bad_request(head.format(max_tokens=max_tokens_param) + message[m.end() :], param)
        return bad_request(message)
    if code == "UNAVAILABLE":
        return overloaded(
            503, f"the {service} service is overloaded or restarting, retry later ({message})", retry_after_s
        )
    if code == "DEADLINE_EXCEEDED":
        return APIError(504, f"the {service} service did not answer in time ({message})", None, "timeout")
    if code == "RESOURCE_EXHAUSTED":
        return overloaded(503, f"the {service} service is overloaded, retry later ({message})", retry_after_s)
    # INTERNAL, UNKNOWN, or Triton's own refusal without a code: the message is the server's.
    return APIError(500, f"the {service} service failed: {message}", None, "server_error")


_AUDIO_REASON = re.compile(r"^\[([a-z_]+)\] ")
# asr's reasons (switchboard.wire.AsrError) whose status is not 400.
AUDIO_STATUS = {"too_long": 413}


def from_audio_error(message: str, param: str, head: str, language_param: str) -> APIError | None:
    """The ``APIError`` for audio that ``asr`` refused (an INVALID_ARGUMENT message headed
    ``[reason] ``); None for any other message. ``param``/``head``: the field that carried the
    audio and how messages name it ("file", "file: "); a refused language names
    ``language_param`` instead. The reason is the error's ``code``."""
    m = _AUDIO_REASON.match(message)
    if m is None:
        return None
    reason, text = m.group(1), message[m.end() :]
    if reason == "bad_language":
        return APIError(400, f"{language_param}: {text}", language_param, reason)
    return APIError(AUDIO_STATUS.get(reason, 400), f"{head}{text}", param, reason)


def speech_not_ready(retry_after_s: int) -> APIError:
    """503 while the speech recognizer is not loaded (``make serve`` builds the default one in the
    background after text chat is up): a client retries after ``Retry-After``."""
    return APIError(
        503,
        f"the speech model is still being built or loaded; text chat works, retry voice in {retry_after_s} s",
        None,
        "speech_model_not_ready",
        {"Retry-After": str(retry_after_s)},
    )

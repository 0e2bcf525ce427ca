"""Switchboard client: a gRPC SDK for the ``chat``, ``asr`` and ``voice_chat`` models and the
``switchboard-chat`` CLI.

from switchboard.client import ChatClient
client = ChatClient("127.0.0.1:8001")
for event in client.chat("Where is my order?", session_id="c-42", priority=1):
    ...  # str deltas, then one ChatStats

One request type per turn (``request``: ``ChatRequest``, ``VoiceRequest``), two transports
(``sync``: ``ChatClient`` on tritonclient; ``aio``: ``AsyncChatClient`` on grpc.aio), one set of
events (``events``), and Triton's messages encoded once (``switchboard.codec``).
"""

from switchboard.client.aio import AsyncChatClient
from switchboard.client.events import ChatError, ChatReply, Heard, TokenLogprobs, ToolCallDeltas, VoiceReply
from switchboard.client.request import ChatRequest, VoiceRequest
from switchboard.client.sync import ChatClient
from switchboard.wire import ChatStats

__all__ = [
    "AsyncChatClient",
    "ChatClient",
    "ChatError",
    "ChatReply",
    "ChatRequest",
    "ChatStats",
    "Heard",
    "TokenLogprobs",
    "ToolCallDeltas",
    "VoiceReply",
    "VoiceRequest",
]

"""Switchboard client: a gRPC SDK over tritonclient and the ``switchboard-chat`` CLI.

from switchboard.client import ChatClient
client = ChatClient("127.0.0.1:8001")
for event in client.chat("Where is my order?", session_id="c-42", priority=1):
    ...  # str deltas, then one ChatStats
"""

from switchboard.client.sdk import (
    AsyncChatClient,
    ChatClient,
    ChatError,
    ChatReply,
    ChatStats,
    Heard,
    TokenLogprobs,
    ToolCallDeltas,
    VoiceReply,
)

__all__ = [
    "AsyncChatClient",
    "ChatClient",
    "ChatError",
    "ChatReply",
    "ChatStats",
    "Heard",
    "TokenLogprobs",
    "ToolCallDeltas",
    "VoiceReply",
]

"""What the gateway's handlers share, at ``app.state.gateway``: the configuration, the chats in
flight, and the SDK client that reaches ``chat``, ``asr`` and ``voice_chat`` (one per app, made
in its lifespan)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from switchboard.gateway.keys import KeyTable


@dataclass
class GatewayConfig:
    grpc_url: str = "127.0.0.1:8001"
    model: str = "switchboard"  # the model id clients name (GET /v1/models)
    chat_model: str = "chat"  # the Triton model behind it
    keys: KeyTable = field(default_factory=KeyTable)
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 1 << 20
    max_inflight: int = 256  # chats at once through this gateway; beyond: 429
    retry_after_s: int = 1
    timeout_s: float = 120.0  # no response from chat for this long: 504
    # the voice channel
    asr_model: str = "asr"  # the Triton model behind /v1/audio/transcriptions
    voice_model: str = "voice_chat"  # the one behind a chat completion whose last message is audio
    transcription_model: str = "switchboard-asr"  # the model id transcriptions name (GET /v1/models)
    # also accepted for transcriptions: what OpenAI's clients and examples send
    transcription_aliases: tuple[str, ...] = ("whisper-1",)
    max_audio_bytes: int = 25 * 1024 * 1024  # an audio file, uploaded or base64 in a chat (OpenAI's 25 MB)
    voice_retry_after_s: int = 30  # Retry-After while the speech model is not loaded yet (being built)

    def transcription_models(self) -> tuple[str, ...]:
        return (self.transcription_model, *(a for a in self.transcription_aliases if a != self.transcription_model))


class Slots:
    """Chats in flight through this gateway. Used from the event loop's thread only."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def take(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used -= 1


@dataclass
class GatewayState:
    config: GatewayConfig
    slots: Slots
    started: int  # the model card's "created"
    # AsyncChatClient, or anything with its stream(), ready() and close(); set by the lifespan.
    client: Any = None

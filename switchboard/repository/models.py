"""The models of the repository, by name: the public ``chat``, its generation pools, and the
speech models. Rendering, installing and versioning all name them from here.
"""

from __future__ import annotations

from dataclasses import dataclass

CHAT = "chat"
ASR = "asr"
VOICE_CHAT = "voice_chat"
# Each model's glue module in switchboard/triton/ (the pools: engine_model).
GLUE = {CHAT: "chat_model", ASR: "asr_model", VOICE_CHAT: "voice_chat_model"}
SPEECH = (ASR, VOICE_CHAT)


@dataclass(frozen=True)
class Pool:
    name: str
    max_batch_size: int  # requests per execute at most
    engine_batch: int  # sequences the engine decodes together
    max_prompt: int  # longest prompt routed here (profile / documentation)
    blurb: str

    @property
    def model(self) -> str:
        """The pool's model in the repository (``engine_short``)."""
        return f"engine_{self.name}"


LONG_PROMPT_TOKENS = 160
POOLS = (
    Pool(
        "short",
        16,
        16,
        LONG_PROMPT_TOKENS,
        "Prompts up to long_prompt_tokens (chat/config.pbtxt): larger batches.",
    ),
    Pool(
        "long",
        8,
        8,
        1024,
        "Long prompts: smaller batches so one long prefill does not stall many short chats.",
    ),
)
# The pools' models, in POOLS order: what a rollout installs and loads version by version.
POOL_MODELS = tuple(pool.model for pool in POOLS)

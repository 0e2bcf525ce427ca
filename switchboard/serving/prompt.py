"""Prompts for multi-turn chat: chat template, sliding window, append-only token history.

A session keeps the exact token ids the model saw (the prompt plus the answer it generated).
The next turn's prompt reuses those ids and tokenizes only the new text, so it extends the
cached prefix token for token and the KV cache of the earlier turns applies. When that is not
possible (the window slid, or the template does not render conversations as prefixes of their
continuations), the whole prompt is tokenized again and reuse falls back to the longest
common prefix, never to wrong output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from switchboard.artifact.tokenizer import TextTokenizer

DEFAULT_SYSTEM_PROMPT = "You are the customer service assistant of an online store. 你是网店的客服助手。"


class PromptTooLong(ValueError):
    """The new message alone does not fit in the context window."""


@dataclass
class Conversation:
    """What a session stores between turns (plain data, JSON-serializable)."""

    messages: list[dict] = field(default_factory=list)  # user/assistant turns in the window
    tokens: list[int] = field(default_factory=list)  # ids of system + messages as the model saw them
    kv_tokens: int = 0  # tokens[:kv_tokens] had their KV computed (and stored as blocks by the pool)


@dataclass
class Prompt:
    ids: list[int]
    messages: list[dict]
    max_new_tokens: int
    dropped_turns: int = 0


class PromptBuilder:
    def __init__(self, tokenizer: TextTokenizer, system_prompt: str | None, max_turns: int, context_window: int):
        self.tok = tokenizer
        self.system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.max_messages = 2 * max_turns - 1  # the last `max_turns` user turns and answers between
        self.context_window = context_window

    def build(self, history: Conversation | None, text: str, max_new_tokens: int, system: str | None = None) -> Prompt:
        """``system``: the client's system prompt for this chat instead of the server's."""
        history = history or Conversation()
        head = self.system if system is None else [{"role": "system", "content": system}]
        messages = [*history.messages, {"role": "user", "content": text}]
        dropped = 0
        while len(messages) > self.max_messages:
            messages, dropped = messages[2:], dropped + 1
        ids = self._encode(head + messages, history if dropped == 0 else None)
        while len(ids) + max_new_tokens > self.context_window and len(messages) > 1:
            messages, dropped = messages[2:], dropped + 1
            ids = self._encode(head + messages, None)
        room = self.context_window - len(ids)
        if room < 1:
            raise PromptTooLong(
                f"text is too long: the prompt takes {len(ids)} tokens and the context window is {self.context_window}"
            )
        return Prompt(ids, messages, min(max_new_tokens, room), dropped)

    def _encode(self, messages: list[dict], history: Conversation | None) -> list[int]:
        text = self.tok.template.render(messages, add_generation_prompt=True)
        if history and history.tokens:
            seen = self.tok.decode(history.tokens, skip_special_tokens=False)
            if text.startswith(seen):
                return history.tokens + self.tok.encode(text[len(seen) :])
        return self.tok.encode(text)

    @staticmethod
    def after_answer(prompt: Prompt, answer_ids: list[int], answer_text: str, end_id: int) -> Conversation:
        """The conversation to store once the model answered ``prompt``."""
        tokens = prompt.ids + answer_ids
        kv_tokens = len(tokens) - 1  # the last generated token was sampled, never fed back
        if not answer_ids or answer_ids[-1] != end_id:
            tokens.append(end_id)  # stopped by length: close the turn the way the template does
        return Conversation([*prompt.messages, {"role": "assistant", "content": answer_text}], tokens, kv_tokens)

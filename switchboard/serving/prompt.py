"""Prompts for multi-turn chat: chat template, sliding window, append-only token history.

A session keeps the exact token ids the model saw (the prompt plus the answer it generated).
The next turn's prompt reuses those ids and tokenizes only the new text, so it extends the
cached prefix token for token and the KV cache of the earlier turns applies. When that is not
possible (the window slid, or the template does not render conversations as prefixes of their
continuations), the whole prompt is tokenized again and reuse falls back to the longest
common prefix, never to wrong output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from switchboard.artifact.tokenizer import TextTokenizer

DEFAULT_SYSTEM_PROMPT = "You are the customer service assistant of an online store. 你是网店的客服助手。"


class PromptTooLong(ValueError):
    """The new message alone does not fit in the context window."""


@dataclass
class Conversation:
    """What a session stores between turns (plain data, JSON-serializable)."""

    # user/assistant turns in the window (an answer's tool calls with it, their results as
    # ``tool`` messages)
    messages: list[dict] = field(default_factory=list)
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
        self.max_turns = max_turns  # the last `max_turns` user turns and what answered them
        self.context_window = context_window

    def build(
        self,
        history: Conversation | None,
        text: str,
        max_new_tokens: int,
        system: str | None = None,
        tools: tuple[dict, ...] = (),
        tool_results: tuple[dict, ...] = (),
    ) -> Prompt:
        """``system``: the client's system prompt for this chat instead of the server's;
        ``tools``: the functions the template shows the model; ``tool_results``: ``tool``
        messages answering the last answer's calls, before ``text`` (which may then be "")."""
        history = history or Conversation()
        head = self.system if system is None else [{"role": "system", "content": system}]
        messages = [*history.messages, *tool_results, *([{"role": "user", "content": text}] if text else [])]
        dropped = 0
        while sum(m["role"] == "user" for m in messages) > self.max_turns and (rest := _without_first_turn(messages)):
            messages, dropped = rest, dropped + 1
        tools = list(tools) or None
        ids = self._encode(head + messages, history if dropped == 0 else None, tools)
        while len(ids) + max_new_tokens > self.context_window and (rest := _without_first_turn(messages)):
            messages, dropped = rest, dropped + 1
            ids = self._encode(head + messages, None, tools)
        room = self.context_window - len(ids)
        if room < 1:
            raise PromptTooLong(
                f"text is too long: the prompt takes {len(ids)} tokens and the context window is {self.context_window}"
            )
        return Prompt(ids, messages, min(max_new_tokens, room), dropped)

    def _encode(self, messages: list[dict], history: Conversation | None, tools: list[dict] | None) -> list[int]:
        text = self.tok.template.render(messages, add_generation_prompt=True, tools=tools)
        if history and history.tokens:
            seen = self.tok.decode(history.tokens, skip_special_tokens=False)
            if text.startswith(seen):
                return history.tokens + self.tok.encode(text[len(seen) :])
        return self.tok.encode(text)

    @staticmethod
    def after_answer(
        prompt: Prompt, answer_ids: list[int], answer_text: str, end_id: int, tool_calls: list[dict] | None = None
    ) -> Conversation:
        """The conversation to store once the model answered ``prompt`` (``answer_text``: its
        content; ``tool_calls``: the calls it made, OpenAI's, arguments as JSON text)."""
        tokens = prompt.ids + answer_ids
        kv_tokens = len(tokens) - 1  # the last generated token was sampled, never fed back
        if not answer_ids or answer_ids[-1] != end_id:
            tokens.append(end_id)  # stopped by length: close the turn the way the template does
        answer = {"role": "assistant", "content": answer_text}
        if tool_calls:
            answer["tool_calls"] = [_parsed(c) for c in tool_calls]
        return Conversation([*prompt.messages, answer], tokens, kv_tokens)


def _parsed(call: dict) -> dict:
    """A call with its arguments as an object, as templates take them (text cut short by the
    answer's length stays text)."""
    fn = call["function"]
    try:
        args = json.loads(fn["arguments"])
    except ValueError:
        args = fn["arguments"]
    return {"id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": args}}


def _without_first_turn(messages: list[dict]) -> list[dict] | None:
    """``messages`` less the oldest turn (a user message and all that answered it); None when
    only the last turn is left."""
    nxt = next((i for i, m in enumerate(messages) if i > 0 and m["role"] == "user"), None)
    return messages[nxt:] if nxt is not None else None


def check_tool_results(messages: list[dict], results: tuple[dict, ...]) -> None:
    """``ValueError`` naming the first result that answers no call of the last answer."""
    last = messages[-1] if messages else {}
    calls = {c["id"] for c in last.get("tool_calls", ())} if last.get("role") == "assistant" else set()
    for i, r in enumerate(results):
        if r["tool_call_id"] not in calls:
            raise ValueError(
                f"tool_results[{i}].tool_call_id: {r['tool_call_id'][:64]!r} is not a call of the last answer"
                + ("" if calls else " (it made none)")
            )

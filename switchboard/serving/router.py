"""Length-aware routing: short prompts to one pool, long ones to the other (seed 001: long
requests in a pool of their own, so they do not hold up the short ones). Length is what the
pool must compute: the prompt's tokens past what the session stored KV for. A session's later
turns, long prompts mostly reused, stay in the pool whose memory holds their blocks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Router:
    """Length-aware routing: prompts with up to ``threshold`` tokens to compute go to the short pool."""

    threshold: int
    short_pool: str = "engine_short"
    long_pool: str = "engine_long"

    def route(self, prompt_tokens: int) -> tuple[str, str]:
        """(route name, pool) for a prompt with ``prompt_tokens`` to compute."""
        return ("short", self.short_pool) if prompt_tokens <= self.threshold else ("long", self.long_pool)

    def other(self, pool: str) -> str:
        """The pool a chat retries on when ``pool`` fails: both serve every length."""
        return self.long_pool if pool == self.short_pool else self.short_pool

    def name(self, pool: str) -> str:
        return "short" if pool == self.short_pool else "long"

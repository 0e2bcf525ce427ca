"""A chat's events (the SDK's text deltas, then one ``ChatStats``) as OpenAI's answer: whole
(``collect``) or as server-sent events (``sse_stream`` in a ``ChatStreamResponse``); and the
watch on the HTTP client, whose leaving cancels the chat (``or_gone``)."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import Request
from fastapi.responses import StreamingResponse

from switchboard.client import ChatError, TokenLogprobs, ToolCallDeltas
from switchboard.gateway.errors import APIError, from_chat_error
from switchboard.gateway.openai_request import CompletionCall
from switchboard.gateway.openai_response import Completion, StopScanner, finish_reason, sse
from switchboard.wire import ChatStats


class ClientGone(Exception):
    """The HTTP client disconnected."""


class ChatStreamResponse(StreamingResponse):
    """A streaming response whose ``cleanup`` always runs: the body finished, the client left
    (Starlette then stops iterating, without closing the iterator), or the body never started."""

    def __init__(self, content, cleanup, **kw):
        super().__init__(content, **kw)
        self.cleanup = cleanup

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            await self.cleanup()


async def until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def or_gone(request: Request, awaitable):
    """``awaitable``'s result, or ``ClientGone`` (and ``awaitable`` cancelled) if the client leaves first."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(until_disconnected(request))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if work not in done:
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        raise ClientGone()
    return work.result()


async def next_event(events, call: CompletionCall, retry_after_s: int):
    """The next event of a chat (text delta or ChatStats), ChatError as APIError; None at the end."""
    try:
        return await events.__anext__()
    except StopAsyncIteration:
        return None
    except ChatError as e:
        raise from_chat_error(e.code, str(e), retry_after_s, call.max_tokens_param) from None


async def collect(
    events, first, call: CompletionCall, retry_after_s: int
) -> tuple[str, ChatStats | None, bool, list[dict] | None, list[dict]]:
    """The whole answer: (text cut at the first stop sequence, stats, whether a stop sequence cut
    it, the tokens' logprobs when asked for, the tool calls it made)."""
    scanner, parts, event, calls = StopScanner(call.stop), [], first, []
    scored = None if call.logprobs is None else []
    while event is not None and not isinstance(event, ChatStats):
        if isinstance(event, TokenLogprobs):  # only when asked: scored is a list then
            if not scanner.stopped:
                scored += event.entries
        elif isinstance(event, ToolCallDeltas):
            calls = event.joined(calls)
        else:
            parts.append(scanner.feed(event))
        event = await next_event(events, call, retry_after_s)  # after a stop sequence: on to the stats (usage)
    parts.append(scanner.flush())
    return "".join(parts), event, scanner.stopped, scored, calls


async def sse_stream(
    events,
    first,
    call: CompletionCall,
    completion: Completion,
    with_stats: bool,
    retry_after_s: int,
    heard: dict | None = None,
):
    """The chat as OpenAI's stream: a first chunk with the role (and a voice chat's transcript,
    ``heard``, under ``switchboard.asr``), content and tool-call deltas, a chunk with the finish reason, the
    usage chunk when asked for (with the stats under ``switchboard`` when asked for too),
    ``[DONE]``. An error after the first chunk is an ``error`` event (the status line is gone)."""
    scanner, event, opened, finished = StopScanner(call.stop), first, False, False
    usage = call.include_usage
    scored: list[dict] = []  # logprobs for the next content chunk
    try:
        while event is not None and not isinstance(event, ChatStats):
            if isinstance(event, TokenLogprobs):
                scored += event.entries  # the SDK yields them only when asked
                event = await next_event(events, call, retry_after_s)
                continue
            if isinstance(event, ToolCallDeltas):
                delta = {"tool_calls": event.deltas}
                if not opened:
                    delta = {"role": "assistant", "content": None, **delta}
                yield sse(completion.chunk(delta, include_usage=usage, heard=None if opened else heard, scored=scored))
                opened, scored = True, []
                event = await next_event(events, call, retry_after_s)
                continue
            text = scanner.feed(event)
            if not finished and (text or not opened):
                if opened:
                    yield sse(completion.chunk({"content": text}, include_usage=usage, scored=scored))
                else:
                    delta = {"role": "assistant", "content": text}
                    yield sse(completion.chunk(delta, include_usage=usage, heard=heard, scored=scored))
                opened, scored = True, []
            if scanner.stopped and not finished:
                finished = True
                yield sse(completion.chunk({}, "stop", include_usage=usage))
                if not usage:
                    break  # nothing more to send: the chat is cancelled (release)
            event = await next_event(events, call, retry_after_s)  # after a stop sequence: on to the stats (usage)
        stats = event if isinstance(event, ChatStats) else None
        if heard is not None and not opened:  # an empty answer: what was heard still goes out
            yield sse(completion.chunk({"role": "assistant", "content": ""}, include_usage=usage, heard=heard))
        if not finished:
            tail = scanner.flush()
            if tail or scored:
                yield sse(completion.chunk({"content": tail}, include_usage=usage, scored=scored))
            yield sse(completion.chunk({}, finish_reason(stats, False), include_usage=usage))
        if usage:
            yield sse(completion.usage_chunk(stats, with_stats))
    except APIError as e:
        yield sse(e.body())
    yield sse("[DONE]")

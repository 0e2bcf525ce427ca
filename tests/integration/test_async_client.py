"""The asyncio SDK against the real server: same answers as the threaded client, many chats
on one channel, refusals as ChatError."""

from __future__ import annotations

import asyncio

import pytest

from switchboard.client import AsyncChatClient, ChatError, ChatStats

QUESTIONS = [
    "Where is my order?",
    "Can I change the delivery address?",
    "How do I return a damaged item?",
    "我的订单什么时候发货？",
]


def test_async_answers_match_the_threaded_client(stack, client):
    async def main():
        async with AsyncChatClient(stack.grpc_url, timeout_s=120) as aclient:
            events = [e async for e in aclient.stream(QUESTIONS[0], priority=1, temperature=0.0)]
            reply = await aclient.chat(QUESTIONS[1], temperature=0.0)
            return events, reply

    events, reply = asyncio.run(main())
    assert isinstance(events[-1], ChatStats) and all(isinstance(e, str) for e in events[:-1])
    assert not any(isinstance(e, ChatStats) for e in events[:-1])
    sync = client.chat(QUESTIONS[0], stream=False, priority=1, temperature=0.0)
    assert "".join(events[:-1]) == sync.text and sync.text.strip()
    assert events[-1].generated_tokens == sync.stats.generated_tokens
    assert reply.text == client.chat(QUESTIONS[1], stream=False, temperature=0.0).text


def test_many_concurrent_chats_share_one_client(stack):
    async def main():
        async with AsyncChatClient(stack.grpc_url, timeout_s=120) as aclient:
            return await asyncio.gather(
                *(aclient.chat(QUESTIONS[i % 4], priority=1 + i % 2, max_new_tokens=16) for i in range(24))
            )

    replies = asyncio.run(main())
    assert len(replies) == 24
    assert all(r.text.strip() and r.stats.generated_tokens > 0 for r in replies)
    assert {r.stats.raw["priority"] for r in replies} == {1, 2}


def test_refusal_is_a_chat_error_with_the_grpc_code(stack):
    async def main():
        async with AsyncChatClient(stack.grpc_url, timeout_s=60) as aclient:
            with pytest.raises(ChatError) as bad:
                await aclient.chat("hi", max_new_tokens=-5)
            after = await aclient.chat("hi", max_new_tokens=8)  # the channel is still good
            return bad.value, after

    error, after = asyncio.run(main())
    assert error.code == "INVALID_ARGUMENT" and "max_new_tokens: -5" in str(error)
    assert after.text.strip()


def test_unreachable_server_is_unavailable_not_a_hang():
    async def main():
        async with AsyncChatClient("127.0.0.1:1", timeout_s=10) as aclient:
            await aclient.chat("hi")

    with pytest.raises(ChatError) as e:
        asyncio.run(main())
    assert e.value.code == "UNAVAILABLE"

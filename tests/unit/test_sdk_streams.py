"""The asyncio SDK on Triton's gRPC API: its requests encode as tritonclient's would, and it
keeps streams open between chats (one write per chat), never reusing one whose chat was left
or failed. Against an in-process gRPC server that answers like ``chat`` (the real server:
tests/integration/test_async_client.py)."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import _utils as triton_utils
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import serialize_byte_tensor

from switchboard.client import AsyncChatClient, ChatClient, ChatError, ChatRequest
from switchboard.client.aio import response_events
from switchboard.client.sync import stream_kwargs
from switchboard.wire import SESSION_HEADER, Chat, ChatStats


def test_the_request_is_the_one_tritonclient_would_send():
    args = dict(priority=1, max_new_tokens=32, temperature=0.7, top_p=0.9, seed=5)
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    penalties = {"presence_penalty": 0.5, "frequency_penalty": -1.25}
    for session_id, hist, extra in ((None, history, {}), ("s-1", None, penalties)):
        call = ChatRequest("你好, where is my order?", session_id=session_id, history=hist, **args, **extra).call(
            "chat"
        )
        ours, kw = call.message(), stream_kwargs(call)
        names = {i.name for i in ours.inputs}
        assert (Chat.PRESENCE_PENALTY in names) == bool(extra) and (Chat.FREQUENCY_PENALTY in names) == bool(extra)
        theirs = triton_utils._get_inference_request(
            kw["model_name"],
            kw["inputs"],
            "",
            ours.id,
            kw["outputs"],
            0,
            False,
            False,
            kw["priority"],
            None,
            kw["parameters"],
        )
        assert ours == theirs


def test_a_value_that_does_not_fit_its_tensor_is_invalid_argument():
    with pytest.raises(ChatError) as e:
        ChatRequest("hi", max_new_tokens=1 << 40).call("chat").message()
    assert e.value.code == "INVALID_ARGUMENT" and "max_new_tokens" in str(e.value)
    with pytest.raises(ChatError) as e:  # the synchronous transport alike, before it connects
        list(ChatClient("127.0.0.1:1", timeout_s=1).chat("hi", temperature=1e40))
    assert e.value.code == "INVALID_ARGUMENT" and "temperature" in str(e.value)


def bytes_output(name: str, value: bytes) -> tuple:
    return service_pb2.ModelInferResponse.InferOutputTensor(name=name, datatype="BYTES", shape=(1, 1)), (
        serialize_byte_tensor(np.asarray([[value]], np.object_)).item()
    )


def response(text: str | None = None, stats: ChatStats | None = None) -> service_pb2.ModelStreamInferResponse:
    outputs = []
    if text is not None:
        outputs.append(bytes_output(Chat.TEXT_OUTPUT, text.encode()))
    if stats is not None:
        outputs.append(bytes_output(Chat.STATS, stats.to_json().encode()))
    message = service_pb2.ModelStreamInferResponse()
    for meta, raw in outputs:
        message.infer_response.outputs.append(meta)
        message.infer_response.raw_output_contents.append(raw)
    return message


def test_responses_decode_to_deltas_then_the_final_stats():
    assert response_events(response("订单")) == ("订单", None, False)
    delta, stats, last = response_events(response("!", ChatStats(generated_tokens=3)))
    assert (delta, stats.generated_tokens, last) == ("!", 3, True)
    with pytest.raises(ChatError) as e:
        response_events(service_pb2.ModelStreamInferResponse(error_message="[INVALID_ARG] text: required"))
    assert e.value.code == "INVALID_ARGUMENT" and str(e.value) == "text: required"


class FakeChat(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers each request of a stream with two deltas and the stats, like ``chat``; text
    "slow" waits between deltas, "bad" gets an error response. Records every stream."""

    def __init__(self, drops: int = 0):
        self.streams: list[dict] = []
        self.drops = drops  # text "drop": the first ``drops`` streams end before answering

    async def ModelStreamInfer(self, requests, context):
        stream = {"requests": 0, "cancelled": False, "ended": False, "metadata": dict(context.invocation_metadata())}
        self.streams.append(stream)
        try:
            async for request in requests:
                stream["requests"] += 1
                text = request.raw_input_contents[0][4:].decode()
                if text == "bad":
                    yield service_pb2.ModelStreamInferResponse(error_message="[INVALID_ARG] text: bad")
                    continue
                if text == "drop" and self.drops:  # as when the replica behind a balancer dies
                    self.drops -= 1
                    await context.abort(grpc.StatusCode.CANCELLED, "upstream reset")
                for word in ("Hello", " there"):
                    yield response(word)
                    if text == "slow":
                        await asyncio.sleep(30)
                    if text == "cut":  # the replica died mid-answer
                        await context.abort(grpc.StatusCode.CANCELLED, "upstream reset")
                yield response("", ChatStats(generated_tokens=2))
            stream["ended"] = True  # the client half-closed: the server ends the stream
        except asyncio.CancelledError:
            stream["cancelled"] = True
            raise


async def serve(servicer, port: int):
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def answer(client, text="hi", **kw) -> str:
    return (await client.chat(text, **kw)).text


def test_chats_one_after_another_share_one_stream():
    async def main():
        fake, port = FakeChat(), free_port()
        server = await serve(fake, port)
        async with AsyncChatClient(f"127.0.0.1:{port}", timeout_s=5) as client:
            texts = [await answer(client) for _ in range(3)]
            together = await asyncio.gather(*(answer(client) for _ in range(3)))
        await server.stop(None)
        return fake.streams, texts + together

    streams, texts = asyncio.run(main())
    assert texts == ["Hello there"] * 6
    # 3 in a row on one stream; then 3 at once: one of them on that stream, two on new ones
    assert [s["requests"] for s in streams] == [4, 1, 1]


def test_a_stream_past_its_age_is_ended_and_the_next_chat_opens_a_new_one():
    """Behind a balancer a stream stays where it was routed: aged, it is ended (not cancelled),
    so the client's chats move to replicas added or off replicas drained."""

    async def main():
        fake, port = FakeChat(), free_port()
        server = await serve(fake, port)
        async with AsyncChatClient(f"127.0.0.1:{port}", timeout_s=5, stream_max_age_s=0.5) as client:
            texts = [await answer(client) for _ in range(2)]
            await asyncio.sleep(0.6)
            texts.append(await answer(client))
            await asyncio.sleep(0.2)
            aged = [(s["requests"], s["ended"], s["cancelled"]) for s in fake.streams]
        async with AsyncChatClient(f"127.0.0.1:{port}", timeout_s=5, stream_max_age_s=0) as client:
            texts += [await answer(client) for _ in range(2)]
        await asyncio.sleep(0.2)
        await server.stop(None)
        return texts, aged, [(s["requests"], s["ended"], s["cancelled"]) for s in fake.streams[2:]]

    texts, aged, never_pooled = asyncio.run(main())
    assert texts == ["Hello there"] * 5
    assert aged == [(2, True, False), (1, False, False)], "two chats on the first stream, ended once aged"
    assert never_pooled == [(1, True, False), (1, True, False)]


def test_a_chat_left_early_cancels_its_stream_and_the_next_chat_gets_a_new_one():
    async def main():
        fake, port = FakeChat(), free_port()
        server = await serve(fake, port)
        async with AsyncChatClient(f"127.0.0.1:{port}", timeout_s=5) as client:
            events = client.stream("slow")
            assert await events.__anext__() == "Hello"
            await events.aclose()
            after = await answer(client)
            await asyncio.sleep(0.2)
        await server.stop(None)
        return fake.streams, after

    streams, after = asyncio.run(main())
    assert after == "Hello there"
    assert len(streams) == 2 and streams[0]["cancelled"] and streams[0]["requests"] == 1


def test_an_error_is_a_chat_error_and_its_stream_is_not_reused():
    async def main():
        fake, port = FakeChat(), free_port()
        server = await serve(fake, port)
        async with AsyncChatClient(f"127.0.0.1:{port}", timeout_s=5) as client:
            with pytest.raises(ChatError) as e:
                await answer(client, "bad")
            after = await answer(client)
        await server.stop(None)
        return fake.streams, e.value, after

    streams, error, after = asyncio.run(main())
    assert error.code == "INVALID_ARGUMENT" and after == "Hello there"
    assert [s["requests"] for s in streams] == [1, 1]


def test_a_stream_that_broke_while_idle_does_not_fail_the_next_chat():
    async def main():
        port = free_port()
        first, second = FakeChat(), FakeChat()
        server = await serve(first, port)
        async with AsyncChatClient(f"127.0.0.1:{port}", timeout_s=10) as client:
            before = await answer(client)
            await server.stop(None)  # a restart: the idle stream is gone
            server = await serve(second, port)
            after = await answer(client)
        await server.stop(None)
        return before, after, second.streams

    before, after, streams = asyncio.run(main())
    assert before == after == "Hello there" and [s["requests"] for s in streams] == [1]


class BrokenCall:
    """An idle stream whose end the client has not seen yet: it fails when used."""

    def done(self):
        return False

    async def write(self, request):
        raise asyncio.InvalidStateError("RPC already finished")

    def cancel(self):
        pass


def test_a_chat_on_a_stream_that_fails_when_used_goes_once_more_on_a_new_one():
    async def main():
        fake, port = FakeChat(), free_port()
        server = await serve(fake, port)
        async with AsyncChatClient(f"127.0.0.1:{port}", timeout_s=5) as client:
            client._idle[:] = [(BrokenCall(), time.monotonic())]
            after = await answer(client)
        await server.stop(None)
        return after, fake.streams

    after, streams = asyncio.run(main())
    assert after == "Hello there" and [s["requests"] for s in streams] == [1]


def test_a_session_gets_a_stream_of_its_own_with_its_header():
    async def main():
        fake, port = FakeChat(), free_port()
        server = await serve(fake, port)
        async with AsyncChatClient(f"127.0.0.1:{port}", timeout_s=5) as client:
            for _ in range(2):
                await answer(client, session_id="s-1")
            await answer(client)
        await server.stop(None)
        return fake.streams

    streams = asyncio.run(main())
    assert len(streams) == 3 and all(SESSION_HEADER in s["metadata"] for s in streams[:2])
    assert SESSION_HEADER not in streams[2]["metadata"]


def test_a_stream_of_its_own_is_ended_by_the_client_half_closing_not_cancelled():
    """Cancelled as its last response goes out, Triton 2.51 can keep the model referenced (it
    then never unloads): a session's stream, answered, is half-closed and ended by the server."""

    async def main():
        fake, port = FakeChat(), free_port()
        server = await serve(fake, port)
        async with AsyncChatClient(f"127.0.0.1:{port}", timeout_s=5) as client:
            text = await answer(client, session_id="s-1")
            ended = [(s["ended"], s["cancelled"]) for s in fake.streams]
        await server.stop(None)
        return text, ended

    text, ended = asyncio.run(main())
    assert text == "Hello there"
    assert ended == [(True, False)]  # already ended when the answer was returned


def test_closing_the_client_ends_its_idle_streams():
    async def main():
        fake, port = FakeChat(), free_port()
        server = await serve(fake, port)
        async with AsyncChatClient(f"127.0.0.1:{port}", timeout_s=5) as client:
            await asyncio.gather(*(answer(client) for _ in range(2)))
        await asyncio.sleep(0.2)
        await server.stop(None)
        return [(s["requests"], s["ended"], s["cancelled"]) for s in fake.streams]

    assert asyncio.run(main()) == [(1, True, False), (1, True, False)]


def test_an_unreachable_server_is_unavailable():
    async def main():
        async with AsyncChatClient(f"127.0.0.1:{free_port()}", timeout_s=5) as client:
            await answer(client)

    with pytest.raises(ChatError) as e:
        asyncio.run(main())
    assert e.value.code == "UNAVAILABLE"


def _dropped(drops: int, text: str = "drop"):
    async def main():
        fake, port = FakeChat(drops), free_port()
        server = await serve(fake, port)
        try:
            async with AsyncChatClient(f"127.0.0.1:{port}", timeout_s=5) as client:
                return await answer(client, text), fake.streams
        except ChatError as e:
            return e, fake.streams
        finally:
            await server.stop(None)

    return asyncio.run(main())


def test_a_chat_whose_new_stream_broke_before_any_answer_goes_once_more_on_another():
    after, streams = _dropped(1)
    assert after == "Hello there" and len(streams) == 2


def test_a_chat_is_sent_at_most_twice():
    error, streams = _dropped(2)
    assert isinstance(error, ChatError) and error.code == "CANCELLED" and len(streams) == 2


def test_a_stream_that_broke_after_the_first_answer_is_an_error_not_a_second_answer():
    error, streams = _dropped(0, "cut")
    assert isinstance(error, ChatError) and error.code == "CANCELLED" and len(streams) == 1


def test_a_request_is_the_text_and_its_options_or_a_request_with_some_replaced():
    base = ChatRequest("hi", session_id="s-1", max_new_tokens=8)
    assert ChatRequest.of("hi", session_id="s-1", max_new_tokens=8) == base
    assert ChatRequest.of(base) is base
    assert ChatRequest.of(base, priority=1) == ChatRequest("hi", session_id="s-1", max_new_tokens=8, priority=1)
    with pytest.raises(TypeError):
        ChatRequest.of("hi", max_tokens=8)  # not a field: refused as a signature would
    call = base.call("chat")
    assert call.headers is not None and call.pooled and call.outputs == (Chat.TEXT_OUTPUT, Chat.STATS)
    assert ChatRequest("hi", logprobs=2, tools=[{}]).outputs()[-2:] == (Chat.LOGPROBS_OUTPUT, Chat.TOOL_CALLS)

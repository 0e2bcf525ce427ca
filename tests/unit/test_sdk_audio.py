"""The SDK's voice calls, ``transcribe`` and ``voice_chat``, in both clients (``ChatClient`` over
tritonclient, ``AsyncChatClient`` on its own stubs), against an in-process gRPC server that
answers like ``asr`` (transcript deltas, then the result) and ``voice_chat`` (what was heard,
then chat's answer, then its stats with ``asr``). The real models:
tests/integration/test_voice_gateway.py."""

from __future__ import annotations

import asyncio
import json
import socket
from concurrent import futures

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import serialize_byte_tensor

from switchboard.client import AsyncChatClient, ChatClient, ChatError, Heard, VoiceReply
from switchboard.client.events import asr_decoder, voice_decoder
from switchboard.client.request import audio_inputs
from switchboard.wire import PRIORITY_PARAMETER, Asr, AsrResult, ChatStats

HEARD = {"transcript": "Where is my order?", "language": "en", "asr_ms": 40.0, "audio_s": 1.5}
RESULT = AsrResult(text="Where is my order?", language="en", duration=1.5, segments=[], asr_ms=40.0)
SILENCE = b"\x00" * 64


def _response(**outputs: bytes) -> service_pb2.ModelStreamInferResponse:
    message = service_pb2.ModelStreamInferResponse()
    for name, value in outputs.items():
        message.infer_response.outputs.append(
            service_pb2.ModelInferResponse.InferOutputTensor(name=name, datatype="BYTES", shape=(1, 1))
        )
        message.infer_response.raw_output_contents.append(
            serialize_byte_tensor(np.asarray([[value]], np.object_)).item()
        )
    return message


def _inputs(request) -> dict[str, bytes]:
    return {t.name: raw[4:] for t, raw in zip(request.inputs, request.raw_input_contents)}


class FakeTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """``asr``, ``voice_chat`` and ``chat`` as the real ones answer; audio b"refuse" is refused
    as too long, silence is heard as nothing, and asr sends no delta when asked not to. Records
    each request (model, inputs, priority, whether asr was asked for deltas)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.streams = 0
        self.open = 0  # streams not ended yet

    def ModelStreamInfer(self, requests, context):
        self.streams += 1
        self.open += 1
        context.add_callback(self._ended)
        yield from self._answer(requests)

    def _ended(self):
        self.open -= 1

    def _answer(self, requests):
        for request in requests:
            inputs = _inputs(request)
            self.requests.append(
                {
                    "model": request.model_name,
                    "inputs": inputs,
                    "priority": request.parameters["priority"].uint64_param,
                    "chat_priority": request.parameters[PRIORITY_PARAMETER].int64_param,
                    "deltas": request.parameters[Asr.DELTAS].bool_param if Asr.DELTAS in request.parameters else True,
                }
            )
            audio = inputs.get("audio")
            if audio == b"refuse":
                yield service_pb2.ModelStreamInferResponse(
                    error_message="[INVALID_ARG] [too_long] 7200.0 s of audio is over the limit of 600 s"
                )
                continue
            if request.model_name == "asr":
                if audio != SILENCE and self.requests[-1]["deltas"]:
                    yield _response(text=b"Where is", result=b"")
                    yield _response(text=b" my order?", result=b"")
                result = RESULT if audio != SILENCE else AsrResult(text="", language="en", duration=2.0)
                yield _response(text=b"", result=result.to_json().encode())
            elif request.model_name == "voice_chat":
                heard = dict(HEARD, transcript="" if audio == SILENCE else HEARD["transcript"])
                yield _response(text_output=b"", stats=json.dumps(heard).encode())
                if audio != SILENCE:
                    yield _response(text_output=b"In My ")
                    yield _response(text_output=b"Orders.")
                yield _response(text_output=b"", stats=ChatStats(generated_tokens=2, asr=heard).to_json().encode())
            else:
                yield _response(text_output=b"Hello")
                yield _response(text_output=b"", stats=ChatStats(generated_tokens=1).to_json().encode())

    def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        if request.name == "missing":
            context.abort(grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'missing' is not found")
        return service_pb2.ModelReadyResponse(ready=request.name in ("chat", "asr"))


@pytest.fixture(scope="module")
def triton():
    """(url, fake) of the fake server."""
    fake = FakeTriton()
    server = grpc.server(futures.ThreadPoolExecutor(8))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", fake
    server.stop(None)


# -- ChatClient ---------------------------------------------------------------------------------------
def test_transcribe_gives_the_result_or_the_deltas_then_the_result(triton):
    url, fake = triton
    client = ChatClient(url, timeout_s=10)
    result = client.transcribe(b"RIFF....", language="en", priority=1)
    assert isinstance(result, AsrResult) and result.text == "Where is my order?" and result.duration == 1.5
    request = fake.requests[-1]
    assert request["model"] == "asr" and request["inputs"] == {"audio": b"RIFF....", "language": b"en"}
    assert request["priority"] == request["chat_priority"] == 1
    assert request["deltas"] is False  # the whole result: no delta sent to be read
    events = list(client.transcribe(b"RIFF", stream=True))
    assert events[:2] == ["Where is", " my order?"] and events[2] == RESULT
    assert fake.requests[-1]["deltas"] is True
    assert "language" not in fake.requests[-1]["inputs"]  # none given: the recognizer decides
    assert client.transcribe(SILENCE).text == ""


def test_voice_chat_streams_what_was_heard_then_the_answer_then_the_stats(triton):
    url, fake = triton
    client = ChatClient(url, timeout_s=10)
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    events = list(client.voice_chat(b"RIFF", max_new_tokens=16, language="zh", history=history, priority=1))
    assert events[0] == Heard("Where is my order?", "en", 40.0, 1.5)
    assert events[1:3] == ["In My ", "Orders."]
    assert isinstance(events[3], ChatStats) and events[3].asr == HEARD and len(events) == 4
    request = fake.requests[-1]
    assert request["model"] == "voice_chat" and request["inputs"]["language"] == b"zh"
    assert json.loads(request["inputs"]["history"]) == history and "text" not in request["inputs"]
    reply = client.voice_chat(b"RIFF", session_id="s-1", stream=False)
    assert reply == VoiceReply(events[0], "In My Orders.", reply.stats) and reply.stats.asr == HEARD
    assert fake.requests[-1]["inputs"]["session_id"] == b"s-1"


def test_a_voice_chat_of_silence_hears_nothing_and_answers_nothing(triton):
    reply = ChatClient(triton[0], timeout_s=10).voice_chat(SILENCE, stream=False)
    assert reply.heard.transcript == "" and reply.text == "" and reply.stats.asr["transcript"] == ""


def test_refused_audio_is_a_chat_error_with_the_reason_at_its_head(triton):
    client = ChatClient(triton[0], timeout_s=10)
    for call in (lambda: client.transcribe(b"refuse"), lambda: list(client.voice_chat(b"refuse"))):
        with pytest.raises(ChatError) as e:
            call()
        assert e.value.code == "INVALID_ARGUMENT" and str(e.value).startswith("[too_long] 7200.0 s")


def test_readiness_of_any_model(triton):
    client = ChatClient(triton[0], timeout_s=10)
    assert client.ready() and client.ready("asr") and not client.ready("voice_chat")


def test_audio_must_be_bytes():
    with pytest.raises(TypeError, match="audio: expected the file's bytes, got str"):
        audio_inputs("question.wav")
    assert audio_inputs(bytearray(b"RIFF"))[0][1] == b"RIFF"


def test_the_decoders_tell_the_last_response():
    assert asr_decoder({"text": b"Hi", "result": b""}) == (["Hi"], False)
    assert asr_decoder({"text": b"", "result": RESULT.to_json().encode()}) == ([RESULT], True)
    assert voice_decoder({"text_output": b"", "stats": json.dumps(HEARD).encode()}) == ([Heard(**HEARD)], False)
    assert voice_decoder({"text_output": b"ok"}) == (["ok"], False)
    events, last = voice_decoder({"text_output": b"", "stats": ChatStats(asr=HEARD).to_json().encode()})
    assert last and events[0].asr == HEARD


# -- AsyncChatClient -------------------------------------------------------------------------------------
def test_the_async_client_transcribes_and_voice_chats_on_streams_it_closes(triton):
    url, fake = triton

    async def main():
        async with AsyncChatClient(url, timeout_s=10) as client:
            result = await client.transcribe(b"RIFF", language="en", priority=1)
            asked = [fake.requests[-1]["deltas"]]
            deltas = [e async for e in client.transcribe_stream(b"RIFF")]
            asked.append(fake.requests[-1]["deltas"])
            alone = [e async for e in client.transcribe_stream(b"RIFF", deltas=False)]
            voice = await client.voice_chat(b"RIFF", max_new_tokens=8)
            streamed = [e async for e in client.voice_stream(b"RIFF")]
            chat = await client.chat("hi")
            with pytest.raises(ChatError) as refused:
                await client.transcribe(b"refuse")
            ready = [await client.model_ready(m) for m in ("asr", "voice_chat", "missing")]
            for _ in range(100):  # the speech streams' ends reach the server a moment later
                if fake.open - open_before <= 1:
                    break
                await asyncio.sleep(0.05)
            return result, deltas, alone, asked, voice, streamed, chat, refused.value, ready, fake.open - open_before

    streams, open_before = fake.streams, fake.open
    result, deltas, alone, asked, voice, streamed, chat, refused, ready, still_open = asyncio.run(main())
    assert result == RESULT and deltas == ["Where is", " my order?", RESULT] and alone == [RESULT]
    assert asked == [False, True]  # transcribe wants the result alone, transcribe_stream the deltas
    assert voice.heard.transcript == "Where is my order?" and voice.text == "In My Orders." and voice.stats.asr == HEARD
    assert isinstance(streamed[0], Heard) and streamed[1:3] == ["In My ", "Orders."] and streamed[3].asr == HEARD
    assert chat.text == "Hello"
    assert refused.code == "INVALID_ARGUMENT" and str(refused).startswith("[too_long]")
    assert ready == [True, False, False]  # loaded; not loaded; unknown to the server
    # Speech on streams of its own, closed when done (Triton cannot unload a model a stream
    # still holds); the chat on a stream kept for the next one.
    assert fake.streams == streams + 7 and still_open == 1


def test_an_unreachable_server_has_no_ready_model():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"127.0.0.1:{s.getsockname()[1]}"

    async def main():
        async with AsyncChatClient(url, timeout_s=2) as client:
            return await client.model_ready("asr", timeout_s=0.5)

    assert asyncio.run(main()) is None


# -- switchboard-chat --audio ----------------------------------------------------------------------------
def test_the_cli_prints_what_was_heard_then_the_answer(triton, tmp_path, capsys):
    from switchboard.client.cli import main

    url, fake = triton
    question = tmp_path / "q.wav"
    question.write_bytes(b"RIFF....")
    assert main(["--url", url, "--audio", str(question), "--language", "en", "--priority", "1"]) == 0
    out, err = capsys.readouterr()
    assert out == "heard: Where is my order?\nIn My Orders.\n"
    assert "heard 1.5 s of audio in 40 ms" in err
    assert fake.requests[-1]["inputs"]["language"] == b"en" and fake.requests[-1]["priority"] == 1

    question.write_bytes(SILENCE)
    assert main(["--url", url, "--audio", str(question)]) == 1
    assert "no speech heard" in capsys.readouterr().err
    question.write_bytes(b"refuse")
    assert main(["--url", url, "--audio", str(question)]) == 2
    assert "error (INVALID_ARGUMENT): [too_long]" in capsys.readouterr().err
    assert main(["--url", url, "--audio", str(tmp_path / "missing.wav")]) == 2
    assert "cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--url", url, "--audio", str(question), "hello"])  # a message or audio, not both

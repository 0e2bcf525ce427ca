"""VoiceTurn with a fake engine client: the turn's order, error codes, and streams read to their end."""

from __future__ import annotations

import numpy as np
import pytest

from switchboard.serving.engine_client import EngineStreamError
from switchboard.serving.voice import VoiceError, VoiceMetrics, VoiceRequest, VoiceTurn
from switchboard.wire import Asr, AsrResult, Chat, ChatStats


def blob(text: str | bytes) -> np.ndarray:
    return np.asarray([[text if isinstance(text, bytes) else text.encode()]], np.object_)


class FakeStream:
    """Responses (output dicts, or an EngineStreamError to raise), then the stream's end."""

    def __init__(self, responses):
        self.responses, self.read, self.ended, self.cancelled = list(responses), 0, False, False

    def __iter__(self):
        while self.read < len(self.responses):
            response = self.responses[self.read]
            self.read += 1
            if isinstance(response, Exception):
                raise response
            yield response
        self.ended = True

    def cancel(self):
        self.cancelled = True


class FakeClient:
    def __init__(self, *streams):
        self.streams, self.models, self.requests = list(streams), [], []

    def stream(self, request, timeout_s=None):
        self.models.append(request.model_name)
        self.requests.append(request)
        return self.streams[len(self.models) - 1]


class Sink:
    def __init__(self):
        self.events = []

    def transcript(self, asr):
        self.events.append(("transcript", asr))

    def text(self, delta):
        self.events.append(("text", delta))

    def final(self, text, stats_json):
        self.events.append(("final", text, ChatStats.from_json(stats_json)))


HEARD = AsrResult(text="Where is my order?", language="en", duration=2.0, asr_ms=120.0, chunks=1)


def asr_stream(result: AsrResult = HEARD) -> FakeStream:
    return FakeStream(
        [
            {Asr.TEXT: blob(" Where is my order?"), Asr.RESULT: blob("")},
            {Asr.TEXT: blob(""), Asr.RESULT: blob(result.to_json())},
        ]
    )


def chat_stream(*deltas: str) -> FakeStream:
    final = {Chat.TEXT_OUTPUT: blob(""), Chat.STATS: blob(ChatStats(session="hit").to_json())}
    return FakeStream([*({Chat.TEXT_OUTPUT: blob(d)} for d in deltas), final])


def request(**kw) -> VoiceRequest:
    return VoiceRequest(audio=b"RIFF", language=kw.get("language"), chat_inputs={}, priority=2, parameters={})


def test_the_transcript_then_the_answer_and_both_streams_read_to_their_end():
    asr, chat = asr_stream(), chat_stream("It is ", "on its way.")
    client, sink = FakeClient(asr, chat), Sink()
    VoiceTurn(client).run(request(), sink, lambda: False)
    assert client.models == ["asr", "chat"]
    assert sink.events[0] == ("transcript", HEARD.voice())
    assert sink.events[1:3] == [("text", "It is "), ("text", "on its way.")]
    kind, text, stats = sink.events[3]
    assert kind == "final" and stats.asr == HEARD.voice() and stats.session == "hit"
    # read to their end, not left for the collector to cancel (Triton 2.51 could not unload asr)
    assert asr.ended and chat.ended and not asr.cancelled and not chat.cancelled
    # the transcript is read whole: asr is asked for no deltas
    assert client.requests[0].parameters[Asr.DELTAS].bool_param is False
    assert Asr.DELTAS not in client.requests[1].parameters


def test_an_answered_turn_is_counted_a_silent_one_is_not():
    metrics = VoiceMetrics()
    VoiceTurn(FakeClient(asr_stream(), chat_stream("Hi")), metrics=metrics).run(request(), Sink(), lambda: False)
    silent = AsrResult(text="", language="en", duration=1.0, asr_ms=3.0)
    VoiceTurn(FakeClient(asr_stream(silent)), metrics=metrics).run(request(), Sink(), lambda: False)
    counts, _ = metrics.drain()
    assert counts == {("turns_total", ()): 1, ("conversations_total", ()): 1}  # no session: a one-off


def test_silence_ends_the_turn_without_a_chat():
    silent = AsrResult(text="", language="en", duration=1.0, asr_ms=3.0)
    client, sink = FakeClient(asr_stream(silent)), Sink()
    VoiceTurn(client).run(request(), sink, lambda: False)
    assert client.models == ["asr"] and [e[0] for e in sink.events] == ["transcript", "final"]
    assert sink.events[1][1] == "" and sink.events[1][2].asr == silent.voice()


def test_a_refused_file_keeps_its_code():
    refused = FakeStream([EngineStreamError("[INVALID_ARG] [bad_language] language 'fr': this recognizer knows en")])
    with pytest.raises(VoiceError) as e:
        VoiceTurn(FakeClient(refused)).run(request(language="fr"), Sink(), lambda: False)
    assert e.value.code == "INVALID_ARG" and str(e.value).startswith("[bad_language]")


def test_a_caller_that_leaves_mid_answer_cancels_the_chat():
    chat = chat_stream("It is ", "on its way.")
    calls = iter([False, False, False, True])  # asr's two responses, the first delta, then gone
    with pytest.raises(VoiceError) as e:
        VoiceTurn(FakeClient(asr_stream(), chat)).run(request(), Sink(), lambda: next(calls))
    assert e.value.code == "CANCELLED" and chat.cancelled


def test_a_stream_that_ends_without_its_result_is_internal():
    cut = FakeStream([{Asr.TEXT: blob(" Where"), Asr.RESULT: blob("")}])
    with pytest.raises(VoiceError) as e:
        VoiceTurn(FakeClient(cut)).run(request(), Sink(), lambda: False)
    assert e.value.code == "INTERNAL"

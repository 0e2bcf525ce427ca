"""The gateway's voice routes on the wire, in front of a fake server: OpenAI's transcriptions
through the official ``openai`` client (every response format, the streamed events, the model
ids), the multipart body's limits and faults, asr's refusals as 400/413 naming the field, 503
with Retry-After while the recognizer is not loaded, and chat completions whose last message is
audio (``input_audio``) answered with the transcript under ``switchboard.asr``. The real server:
tests/integration/test_voice_gateway.py."""

from __future__ import annotations

import asyncio
import base64
import http.client
import io
import json
import socket
import threading
import time
import wave

import openai
import pytest
import uvicorn

from switchboard.client import ChatError, Heard
from switchboard.gateway.app import GatewayConfig, create_app
from switchboard.gateway.server import HTTP_PROTOCOL
from switchboard.gateway.uploads import read_form
from switchboard.wire import AsrResult, ChatStats

LIMIT = 1 << 20  # the gateway's audio limit in these tests (25 MiB in production)
HEARD = "Where is my order?"
ANSWER = ["It is ", "on its way."]
SEGMENTS = [
    {"id": 0, "start": 0.0, "end": 0.9, "text": "Where is"},
    {"id": 1, "start": 1.1, "end": 1.6, "text": " my order?"},
]
REFUSALS = {  # audio content -> what the fake asr says (code, message), as the real one words it
    b"too-long": ("INVALID_ARGUMENT", "[too_long] 7200.0 s of audio is over the limit of 600 s"),
    b"not-audio": ("INVALID_ARGUMENT", "[not_audio] not an audio file the server can read"),
    b"truncated": ("INVALID_ARGUMENT", "[truncated] the WAV header promises 32000 bytes, the file holds 12"),
    b"bad-language": ("INVALID_ARGUMENT", "[bad_language] 'xx' is not a language this recognizer knows"),
    b"overloaded": ("UNAVAILABLE", "the recognizer has 1800 s of audio waiting; retry later"),
    b"unready": (None, "Request for unknown model: 'asr' is not found"),
}


def wav(seconds: float = 0.5, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x01\x00" * int(seconds * rate))
    return out.getvalue()


class FakeServer:
    """``AsyncChatClient``'s face for the voice routes: a recognizer that hears ``HEARD`` in two
    deltas (silence: a file of zeros hears nothing), a voice chat that answers ``ANSWER``, and the
    refusals of ``REFUSALS`` by content. ``ready``: which models Triton has loaded."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.deltas: list[bool] = []  # whether each transcription asked asr for its deltas
        self.loaded = {"chat", "asr", "voice_chat"}
        self.open = 0  # requests whose events have not been closed

    def _refusal(self, audio: bytes):
        if audio in REFUSALS:
            code, message = REFUSALS[audio]
            if audio == b"unready":
                self.loaded.discard("asr")
            raise ChatError(message, code)

    def transcribe_stream(self, audio, language=None, priority=2, *, deltas=True):
        self.calls.append(("asr", audio, language, priority))
        self.deltas.append(deltas)
        return self._track(self._transcribe(audio, deltas))

    async def _transcribe(self, audio, deltas=True):
        self._refusal(audio)
        if audio.strip(b"\x00") == b"":
            yield AsrResult(text="", language="en", duration=2.0, segments=[], asr_ms=3.0, chunks=0)
            return
        if deltas:  # as the server: asked for the result alone, it sends no delta
            yield "Where is"
            yield " my order?"
        yield AsrResult(text=HEARD, language="en", duration=1.6, segments=SEGMENTS, asr_ms=41.0, queue_ms=2.0)

    def voice_stream(self, request):
        ask = (request.max_new_tokens, request.temperature, request.top_p, request.seed)
        self.calls.append(("voice_chat", request.audio, request.language, request.priority, ask, request.history))
        self.penalties = {"presence_penalty": request.presence_penalty, "frequency_penalty": request.frequency_penalty}
        return self._track(self._voice(request.audio))

    async def _voice(self, audio):
        self._refusal(audio)
        heard = Heard("" if audio.strip(b"\x00") == b"" else HEARD, "en", 41.0, 1.6)
        yield heard
        if not heard.transcript:
            yield ChatStats(asr=heard.to_dict())
            return
        for delta in ANSWER:
            yield delta
        yield ChatStats(prompt_tokens=12, generated_tokens=5, asr=heard.to_dict())

    def stream(self, request):
        self.calls.append(("chat", request.text, request.priority))
        return self._track(self._chat())

    async def _chat(self):
        for delta in ANSWER:
            yield delta
        yield ChatStats(prompt_tokens=12, generated_tokens=5)

    async def _track(self, events):
        self.open += 1
        try:
            async for event in events:
                yield event
        finally:
            self.open -= 1

    async def ready(self) -> bool:
        return "chat" in self.loaded

    async def model_ready(self, model: str, timeout_s: float = 5.0):
        if model == "voice_chat":  # the glue is loaded; what it calls may not be
            return True
        return model in self.loaded


@pytest.fixture(scope="module")
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture(autouse=True)
def everything_loaded(server):
    server.loaded = {"chat", "asr", "voice_chat"}
    yield
    deadline = time.monotonic() + 5
    while server.open and time.monotonic() < deadline:  # the app closes them as the response ends
        time.sleep(0.01)
    assert server.open == 0, "a request's events were left open"


@pytest.fixture(scope="module")
def gateway(server):
    """(host, port) of the app as ``python -m switchboard.gateway`` serves it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = GatewayConfig(max_audio_bytes=LIMIT, cors_origins=("https://shop.example",))
    app = create_app(config, client=server)
    uv = uvicorn.Server(uvicorn.Config(app, http=HTTP_PROTOCOL, log_level="warning"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield sock.getsockname()
    uv.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="module")
def oai(gateway) -> openai.OpenAI:
    host, port = gateway
    return openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="sk-any", max_retries=0, timeout=30)


def transcribe(oai, audio=None, **kw):
    return oai.audio.transcriptions.create(
        file=("q.wav", wav() if audio is None else audio), **{"model": "whisper-1", **kw}
    )


# -- transcriptions through the official client ---------------------------------------------------
def test_a_transcription_in_each_response_format(oai, server):
    r = transcribe(oai)
    assert r.text == HEARD and r.usage.type == "duration" and r.usage.seconds == 2
    assert transcribe(oai, response_format="text").strip() == HEARD
    v = transcribe(oai, response_format="verbose_json", timestamp_granularities=["segment"], language="EN")
    assert (v.text, v.language, v.duration) == (HEARD, "english", 1.6)
    assert [(s.id, s.start, s.end, s.text) for s in v.segments] == [
        (0, 0.0, 0.9, "Where is"),
        (1, 1.1, 1.6, " my order?"),
    ]
    assert server.calls[-1][2] == "en"  # the language went to asr, lowercased
    assert transcribe(oai, response_format="srt") == (
        "1\n00:00:00,000 --> 00:00:00,900\nWhere is\n\n2\n00:00:01,100 --> 00:00:01,600\nmy order?\n"
    )
    assert transcribe(oai, response_format="vtt").startswith("WEBVTT\n\n00:00:00.000 --> 00:00:00.900\nWhere is\n")


def test_a_streamed_transcription_is_openais_events(oai, server):
    events = list(transcribe(oai, model="switchboard-asr", stream=True))
    assert [e.type for e in events] == ["transcript.text.delta"] * 2 + ["transcript.text.done"]
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == HEARD
    assert server.deltas[-1] is True


def test_a_transcription_not_streamed_asks_the_recognizer_for_its_result_alone(oai, server):
    """Every delta is a response through Triton and a message to read: a caller of the JSON
    response gets none sent (asr_deltas false)."""
    assert transcribe(oai).text == HEARD
    assert server.deltas[-1] is False


def test_silence_is_an_empty_transcript(oai):
    assert transcribe(oai, b"\x00" * 64).text == ""


def test_the_stats_header_adds_the_recognizers_timings(gateway):
    status, _, body = upload(gateway, fields={"model": "whisper-1"}, headers={"X-Switchboard-Stats": "1"})
    assert status == 200 and json.loads(body)["switchboard"]["asr_ms"] == 41.0


def test_the_model_list_names_the_recognizer(oai):
    assert [m.id for m in oai.models.list().data] == ["switchboard", "switchboard-asr", "whisper-1"]
    assert oai.models.retrieve("whisper-1").id == "whisper-1"
    with pytest.raises(openai.NotFoundError) as e:
        transcribe(oai, model="gpt-4o-transcribe")
    assert e.value.param == "model" and e.value.code == "model_not_found" and "whisper-1" in e.value.message


def test_the_priority_header_reaches_asr(oai, server):
    oai.audio.transcriptions.create(
        file=("q.wav", wav()), model="whisper-1", extra_headers={"X-Switchboard-Priority": "2"}
    )
    assert server.calls[-1][3] == 2
    with pytest.raises(openai.BadRequestError) as e:
        oai.audio.transcriptions.create(
            file=("q.wav", wav()), model="whisper-1", extra_headers={"X-Switchboard-Priority": "9"}
        )
    assert e.value.param == "X-Switchboard-Priority"


# -- what asr refuses, and a recognizer not loaded yet ---------------------------------------------------
@pytest.mark.parametrize(
    "audio, status, param, code",
    [
        (b"too-long", 413, "file", "too_long"),
        (b"not-audio", 400, "file", "not_audio"),
        (b"truncated", 400, "file", "truncated"),
        (b"bad-language", 400, "language", "bad_language"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_refused_audio_is_a_4xx_naming_the_field(oai, audio, status, param, code, stream):
    with pytest.raises(openai.APIStatusError) as e:
        r = transcribe(oai, audio, stream=stream)
        list(r) if stream else None
    assert (e.value.status_code, e.value.param, e.value.code) == (status, param, code)
    assert e.value.body["message"].startswith(f"{param}: ") and "[" not in e.value.body["message"]


def test_an_overloaded_recognizer_is_503_and_not_the_speech_model_being_built(oai):
    with pytest.raises(openai.InternalServerError) as e:
        transcribe(oai, b"overloaded")
    assert e.value.status_code == 503 and e.value.code == "overloaded"
    assert e.value.response.headers["retry-after"] == "1"


@pytest.mark.parametrize("stream", [False, True])
def test_a_recognizer_not_loaded_yet_is_503_with_retry_after(oai, stream):
    with pytest.raises(openai.InternalServerError) as e:
        r = transcribe(oai, b"unready", stream=stream)
        list(r) if stream else None
    assert e.value.status_code == 503 and e.value.code == "speech_model_not_ready"
    assert e.value.response.headers["retry-after"] == "30"
    assert "still being built" in e.value.message and "text chat works" in e.value.message


# -- the form: fields, limits, faults ------------------------------------------------------------------
def multipart(fields: dict, file: bytes | None = b"RIFF", name: str = "file", boundary: str = "b0und4ry") -> bytes:
    out = b""
    for key, value in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'.encode()
    if file is not None:
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="q.wav"\r\n'.encode()
        out += b"Content-Type: audio/wav\r\n\r\n" + file + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def upload(
    gateway, body: bytes | None = None, fields=None, headers=None, content_type="multipart/form-data; boundary=b0und4ry"
):
    """(status, headers, body) of a transcription posted by hand."""
    body = multipart(fields or {"model": "whisper-1"}, wav()) if body is None else body
    conn = http.client.HTTPConnection(*gateway, timeout=30)
    try:
        h = {"Content-Type": content_type} if content_type else {}
        conn.request("POST", "/v1/audio/transcriptions", body=body, headers={**h, **(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


BAD_FORMS = [
    ("no-file", multipart({"model": "whisper-1"}, None), 400, "file", "file: required"),
    ("empty-file", multipart({"model": "whisper-1"}, b""), 400, "file", "file: the file is empty"),
    ("file-as-text", multipart({"model": "whisper-1", "file": "abc"}, None), 400, "file", "got a text field"),
    ("file-misnamed", multipart({"model": "whisper-1"}, b"RIFF", name="audio"), 400, "file", "part named 'file'"),
    ("model-missing", multipart({}), 400, "model", "model: required"),
    (
        "model-twice",
        multipart({"model": "whisper-1"}).replace(
            b"--b0und4ry--",
            b'--b0und4ry\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n--b0und4ry--',
        ),
        400,
        "model",
        "sent 2 times",
    ),
    ("unknown-field", multipart({"model": "whisper-1", "speed": "2"}), 400, "speed", "Unrecognized request argument"),
    (
        "format-diarized",
        multipart({"model": "whisper-1", "response_format": "diarized_json"}),
        400,
        "response_format",
        "not supported",
    ),
    (
        "stream-verbose",
        multipart({"model": "whisper-1", "response_format": "verbose_json", "stream": "true"}),
        400,
        "stream",
        "only with response_format json or text",
    ),
    ("stream-word", multipart({"model": "whisper-1", "stream": "yes"}), 400, "stream", "expected true or false"),
    ("temperature", multipart({"model": "whisper-1", "temperature": "0.4"}), 400, "temperature", "only 0"),
    (
        "temperature-word",
        multipart({"model": "whisper-1", "temperature": "warm"}),
        400,
        "temperature",
        "expected a number",
    ),
    ("prompt", multipart({"model": "whisper-1", "prompt": "Orders"}), 400, "prompt", "not supported"),
    (
        "words",
        multipart({"model": "whisper-1", "response_format": "verbose_json", "timestamp_granularities[]": "word"}),
        400,
        "timestamp_granularities",
        "segment only",
    ),
    ("logprobs", multipart({"model": "whisper-1", "include[]": "logprobs"}), 400, "include", "not supported"),
    (
        "language-sentence",
        multipart({"model": "whisper-1", "language": "English please"}),
        400,
        "language",
        "ISO-639-1",
    ),
    (
        "chunking",
        multipart({"model": "whisper-1", "chunking_strategy": '{"type": "server_vad"}'}),
        400,
        "chunking_strategy",
        "only 'auto'",
    ),
    (
        "field-not-utf8",
        multipart({"model": "whisper-1"}).replace(b"whisper-1", b"wh\xffisper"),
        400,
        "model",
        "not valid UTF-8",
    ),
    ("cut-short", multipart({"model": "whisper-1"}, wav())[:-20], 400, None, "ended before its closing boundary"),
    ("not-multipart-inside", b"just bytes", 400, None, "not valid multipart/form-data"),
    ("too-many-parts", multipart({f"f{i}": "x" for i in range(40)}), 400, None, "more than 32 form fields"),
    ("field-too-long", multipart({"model": "x" * 70000}), 400, "model", "over the limit of 65536 bytes"),
    (
        "two-files",
        multipart({"model": "whisper-1"}, b"RIFF").replace(
            b"--b0und4ry--",
            b'--b0und4ry\r\nContent-Disposition: form-data; name="file"; filename="b.wav"\r\n\r\nRIFF\r\n--b0und4ry--',
        ),
        400,
        "file",
        "more than one file",
    ),
]


@pytest.mark.parametrize("case, body, status, param, needle", BAD_FORMS, ids=[c[0] for c in BAD_FORMS])
def test_a_bad_form_is_400_naming_the_problem(gateway, server, case, body, status, param, needle):
    before = len(server.calls)
    code, _, raw = upload(gateway, body)
    error = json.loads(raw)["error"]
    assert code == status, (case, raw)
    assert needle in error["message"] and error["param"] == param, (case, error)
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert len(server.calls) == before  # refused before asr was asked


@pytest.mark.parametrize(
    "content_type, status, needle",
    [
        (None, 415, "Content-Type: missing"),
        ("application/json", 415, "expected multipart/form-data, got 'application/json'"),
        ("multipart/form-data", 400, "without a boundary"),
    ],
)
def test_the_body_must_be_a_multipart_form(gateway, content_type, status, needle):
    code, _, raw = upload(gateway, content_type=content_type)
    assert code == status and needle in json.loads(raw)["error"]["message"]


def test_an_upload_over_the_limit_is_413_before_it_is_read(oai, gateway, server):
    before = len(server.calls)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as e:
        transcribe(oai, b"\x01" * (3 * LIMIT))  # declared with its length: refused on the headers
    assert e.value.status_code == 413 and e.value.code == "file_too_large" and e.value.param == "file"
    assert time.monotonic() - started < 10 and len(server.calls) == before
    assert transcribe(oai).text == HEARD  # the connection and the server are fine


def test_an_upload_without_a_length_is_cut_off_at_the_limit(gateway, server):
    """Chunked, no Content-Length: the file is counted as it streams in, refused at the limit."""
    before = len(server.calls)
    conn = http.client.HTTPConnection(*gateway, timeout=30)
    body = multipart({"model": "whisper-1"}, b"\x01" * (LIMIT + 10))
    try:
        conn.putrequest("POST", "/v1/audio/transcriptions")
        conn.putheader("Content-Type", "multipart/form-data; boundary=b0und4ry")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        for i in range(0, len(body), 65536):
            part = body[i : i + 65536]
            conn.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
        conn.send(b"0\r\n\r\n")
        r = conn.getresponse()
        error = json.loads(r.read())["error"]
    finally:
        conn.close()
    assert r.status == 413 and error["code"] == "file_too_large" and str(LIMIT) in error["message"]
    assert len(server.calls) == before


def test_a_page_of_another_origin_may_not_upload(gateway):
    code, _, raw = upload(gateway, headers={"Origin": "https://evil.example"})
    assert code == 403 and json.loads(raw)["error"]["code"] == "origin_not_allowed"
    host, port = gateway
    assert upload(gateway, headers={"Origin": f"http://{host}:{port}"})[0] == 200  # the gateway's own page
    assert upload(gateway, headers={"Origin": "https://shop.example"})[0] == 200  # --cors-origins


def test_the_form_reader_takes_a_body_split_anywhere():
    body = multipart({"model": "whisper-1", "language": "zh"}, wav(0.1))

    async def chunks(size):
        for i in range(0, len(body), size):
            yield body[i : i + size]

    for size in (1, 7, 64, len(body)):
        form = asyncio.run(read_form(chunks(size), "multipart/form-data; boundary=b0und4ry", None, LIMIT))
        assert form.fields == {"model": ["whisper-1"], "language": ["zh"]}
        assert form.file == wav(0.1) and form.filename == "q.wav" and form.content_type == "audio/wav"


# -- chat completions whose last message is audio -------------------------------------------------------
def audio_message(audio: bytes, fmt: str = "wav", **extra) -> dict:
    data = base64.b64encode(audio).decode()
    return {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": fmt, **extra}}]}


HISTORY = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]


def test_a_voice_chat_answers_with_what_was_heard(oai, server):
    r = oai.chat.completions.create(
        model="switchboard", messages=[*HISTORY, audio_message(wav())], max_tokens=20, frequency_penalty=0.5
    )
    assert r.choices[0].message.content == "".join(ANSWER)
    assert server.penalties == {"presence_penalty": None, "frequency_penalty": 0.5}, "a spoken answer's too"
    assert r.model_extra["switchboard"]["asr"] == {
        "transcript": HEARD,
        "language": "en",
        "asr_ms": 41.0,
        "audio_s": 1.6,
    }
    kind, audio, language, priority, ask, history = server.calls[-1]
    assert kind == "voice_chat" and audio == wav() and ask[0] == 20 and history == HISTORY


def test_a_streamed_voice_chat_says_what_was_heard_in_its_first_chunk(oai, server):
    chunks = list(
        oai.chat.completions.create(
            model="switchboard",
            messages=[audio_message(wav(), language="zh")],
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Switchboard-Stats": "1"},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].model_extra["switchboard"]["asr"]["transcript"] == HEARD
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "".join(ANSWER)
    assert chunks[-1].model_extra["switchboard"]["asr"]["transcript"] == HEARD  # in the stats too
    assert server.calls[-1][2] == "zh"


@pytest.mark.parametrize("stream", [False, True])
def test_a_voice_chat_of_silence_is_400_no_speech(oai, stream):
    with pytest.raises(openai.BadRequestError) as e:
        r = oai.chat.completions.create(model="switchboard", messages=[audio_message(b"\x00" * 640)], stream=stream)
        list(r) if stream else None
    assert e.value.code == "no_speech" and e.value.param == "messages" and "no speech" in e.value.message


@pytest.mark.parametrize("audio, status, code", [(b"too-long", 413, "too_long"), (b"not-audio", 400, "not_audio")])
def test_refused_audio_in_a_chat_names_the_messages(oai, audio, status, code):
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model="switchboard", messages=[audio_message(audio)])
    assert (e.value.status_code, e.value.code, e.value.param) == (status, code, "messages")


def test_a_voice_chat_while_the_recognizer_is_not_loaded_is_503_with_retry_after(oai):
    with pytest.raises(openai.InternalServerError) as e:
        oai.chat.completions.create(model="switchboard", messages=[audio_message(b"unready")])
    assert e.value.code == "speech_model_not_ready" and e.value.response.headers["retry-after"] == "30"
    assert oai.chat.completions.create(model="switchboard", messages=HISTORY[:1]).choices  # text chat works


def _b64(n: int) -> str:
    return base64.b64encode(b"\x01" * n).decode()


def raw_audio(input_audio: dict) -> dict:
    return {"role": "user", "content": [{"type": "input_audio", "input_audio": input_audio}]}


BAD_AUDIO = [
    ("not-base64", [raw_audio({"data": "%%%", "format": "wav"})], 400, "not valid base64"),
    ("data-url", [raw_audio({"data": "data:audio/wav;base64,UklGRg==", "format": "wav"})], 400, "not valid base64"),
    ("data-missing", [raw_audio({"format": "wav"})], 400, "data: required"),
    ("data-empty", [raw_audio({"data": "", "format": "wav"})], 400, "data: required"),
    ("format-pcm", [audio_message(wav(), "pcm16")], 400, 'format: "pcm16" is not supported'),
    ("language-bad", [audio_message(wav(), language="english")], 400, "language: expected a language code"),
    ("extra-field", [audio_message(wav(), voice="alloy")], 400, "field 'voice' is not supported"),
    (
        "with-text",
        [{"role": "user", "content": [{"type": "text", "text": "hi"}, audio_message(wav())["content"][0]]}],
        400,
        "must be the message's only part",
    ),
    (
        "not-last",
        [audio_message(wav()), {"role": "assistant", "content": "ok"}, {"role": "user", "content": "hi"}],
        400,
        "in the last message only",
    ),
    ("after-user", [{"role": "user", "content": "hi"}, audio_message(wav())], 400, "must follow an assistant's"),
    (
        "assistant-audio",
        [{"role": "assistant", "content": audio_message(wav())["content"]}],
        400,
        "in the last message only",
    ),
    ("too-large", [raw_audio({"data": _b64(LIMIT + 3), "format": "wav"})], 413, "over the limit of 1048576 bytes"),
]


@pytest.mark.parametrize("case, messages, status, needle", BAD_AUDIO, ids=[c[0] for c in BAD_AUDIO])
def test_bad_audio_in_a_chat_is_refused_by_name(gateway, server, case, messages, status, needle):
    before = len(server.calls)
    conn = http.client.HTTPConnection(*gateway, timeout=30)
    try:
        body = json.dumps({"model": "switchboard", "messages": messages})
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        code, error = r.status, json.loads(r.read())["error"]
    finally:
        conn.close()
    assert code == status and needle in error["message"] and error["param"] == "messages", (case, error)
    assert len(server.calls) == before


def test_a_chat_body_over_1_mib_is_taken_only_with_audio(oai, gateway):
    big = wav(40)  # 1.2 MB of WAV, 1.6 MB in base64: over the chat's 1 MiB, under the audio's limit
    r = oai.chat.completions.create(model="switchboard", messages=[audio_message(big[: LIMIT - 100])])
    assert r.choices[0].message.content
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model="switchboard", messages=[{"role": "user", "content": "a" * (LIMIT + 10)}])
    assert e.value.status_code == 413 and "without audio" in e.value.message


def test_readiness_says_whether_voice_is_ready_too(gateway, server):
    def readyz():
        conn = http.client.HTTPConnection(*gateway, timeout=10)
        try:
            conn.request("GET", "/readyz")
            r = conn.getresponse()
            return r.status, json.loads(r.read())
        finally:
            conn.close()

    assert readyz() == (200, {"status": "ready", "voice": "ready"})
    server.loaded.discard("asr")  # text chat is ready; the recognizer is still being built
    assert readyz() == (200, {"status": "ready", "voice": "not_ready"})

"""The voice channel through the gateway against the real stack: OpenAI's transcriptions with
the official ``openai`` client (json, text, verbose_json, srt, vtt, streamed), WAV at other
rates and channel counts, FLAC and OGG/Opus, the issue's bad-input list (each a 4xx in OpenAI's
error shape, or an empty transcript for silence; the server stays ready and a caller beside
them is unaffected), a chat completion whose last message is audio, the SDK and CLI, and 503
with Retry-After while the recognizer is not loaded.

The audio is spoken here by Debian's espeak-ng; nothing is downloaded. Needs a recognizer
installed in model_repository/asr/1 (``make serve`` builds and installs the default one;
``python -m switchboard.ops.voice join`` on a running stack does too).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf
import soxr

from switchboard import paths
from switchboard.asr.wer import error_rate
from switchboard.client import AsyncChatClient, ChatClient, ChatError, Heard
from switchboard.ops.launch import Ports, Stack, operator_key
from switchboard.ops.model_control import load_model
from tests.audiotools import encode_av, flac_of_unknown_length
from tests.integration.gatewaytools import LIVE_KEY, STANDARD_KEY, Gateway

ASR_INSTALLED = (paths.MODEL_REPOSITORY / "asr" / "1" / "asr.json").is_file()
pytestmark = [
    pytest.mark.skipif(
        not ASR_INSTALLED,
        reason="no recognizer installed in model_repository/asr/1 (no asr.json): `make serve` builds and "
        "installs the default one, or `python -m switchboard.ops.voice join`",
    ),
    pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="Debian's espeak-ng is not installed"),
]
MODEL = "whisper-1"
QUESTION = "Where is my order?"
MAX_WER = 0.5  # the embedded recognizer is small: the question must be recognizable, not verbatim
RATE = 16_000


# -- audio, spoken here ----------------------------------------------------------------------------
def speak(text: str, voice: str = "en-us") -> tuple[np.ndarray, int]:
    """espeak-ng's float samples of ``text`` and their rate."""
    wav = subprocess.run(["espeak-ng", "-v", voice, "--stdout", text], capture_output=True, check=True).stdout
    samples, rate = sf.read(io.BytesIO(wav), dtype="float32")
    return samples, rate


def encode(samples: np.ndarray, rate: int, fmt: str = "WAV", subtype: str = "PCM_16") -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, rate, format=fmt, subtype=subtype)
    return out.getvalue()


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    """The question at 16 kHz with a little silence around it."""
    samples, rate = speak(QUESTION)
    pad = np.zeros(int(0.3 * RATE), np.float32)
    return np.concatenate([pad, soxr.resample(samples, rate, RATE).astype(np.float32), pad])


@pytest.fixture(scope="module")
def question_wav(question) -> bytes:
    return encode(question, RATE)


def wer(text: str) -> float:
    return error_rate([QUESTION], [text], "en")


def wav_with(tag: int, bits: int = 16) -> bytes:
    """A WAV header with format tag ``tag`` (a sample format the reader may not know) and 1 s of data."""
    data = b"\x00\x01" * RATE
    fmt = struct.pack("<HHIIHH", tag, 1, RATE, RATE * bits // 8, bits // 8, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


# -- the gateway -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def speech_ready(stack):
    """The recognizer the stack loaded at start (its asr.json is installed) answers."""
    client = ChatClient(stack.grpc_url, timeout_s=120)
    deadline = time.monotonic() + 120
    while not (client.ready("asr") and client.ready("voice_chat")):
        assert time.monotonic() < deadline, "asr and voice_chat did not become ready"
        time.sleep(0.5)
    return client


@pytest.fixture(scope="module")
def gateway(stack, speech_ready, tmp_path_factory):
    g = Gateway(stack.grpc_url, tmp_path_factory.mktemp("voice-gateway"))
    yield g
    g.stop()
    assert "Traceback" not in g.logs(), g.logs()[-3000:]


def transcribe(oai, audio: bytes, name: str = "question.wav", **kw):
    return oai.audio.transcriptions.create(file=(name, audio), **{"model": MODEL, **kw})


# -- transcriptions -----------------------------------------------------------------------------------
def test_a_question_transcribed_in_each_response_format(oai, question_wav, question):
    r = transcribe(oai, question_wav)
    assert wer(r.text) <= MAX_WER, r.text
    assert r.usage.type == "duration" and r.usage.seconds == int(np.ceil(len(question) / RATE))
    assert transcribe(oai, question_wav, response_format="text").strip() == r.text.strip()
    v = transcribe(oai, question_wav, response_format="verbose_json", timestamp_granularities=["segment"])
    assert v.text == r.text and abs(v.duration - len(question) / RATE) < 0.05
    assert v.language in ("english", "en") and v.segments
    assert all(0 <= s.start < s.end <= v.duration + 0.01 for s in v.segments)
    srt = transcribe(oai, question_wav, response_format="srt")
    assert srt.startswith("1\n00:00:00,") and "-->" in srt
    assert transcribe(oai, question_wav, response_format="vtt").startswith("WEBVTT\n\n")


def test_a_streamed_transcript_is_openais_events_adding_up_to_the_whole(oai, question_wav):
    whole = transcribe(oai, question_wav).text
    events = list(transcribe(oai, question_wav, stream=True, model="switchboard-asr"))
    assert events and events[-1].type == "transcript.text.done"
    deltas = [e for e in events[:-1]]
    assert all(e.type == "transcript.text.delta" for e in deltas)
    assert "".join(e.delta for e in deltas).strip() == events[-1].text.strip() == whole.strip()


@pytest.mark.parametrize(
    "name, make",
    [
        ("44k-stereo.wav", lambda q: encode(np.stack([s := soxr.resample(q, RATE, 44100), s * 0.8], axis=1), 44100)),
        ("8k.wav", lambda q: encode(soxr.resample(q, RATE, 8000), 8000)),
        ("48k-float.wav", lambda q: encode(soxr.resample(q, RATE, 48000), 48000, "WAV", "FLOAT")),
        ("question.flac", lambda q: encode(q, RATE, "FLAC")),
        ("piped.flac", lambda q: flac_of_unknown_length(encode(q, RATE, "FLAC"))),  # no length in its header
        ("question.ogg", lambda q: encode(soxr.resample(q, RATE, 48000), 48000, "OGG", "OPUS")),
        ("browser.webm", lambda q: encode_av(soxr.resample(q, RATE, 48000), 48000, "webm", "libopus")),
        ("memo.m4a", lambda q: encode_av(soxr.resample(q, RATE, 44100), 44100, "ipod", "aac")),
    ],
)
def test_other_rates_channels_and_containers_are_heard_alike(oai, question, name, make):
    text = transcribe(oai, make(question), name).text
    assert wer(text) <= MAX_WER, (name, text)


# -- the bad input ------------------------------------------------------------------------------
def _two_hours_flac() -> bytes:
    return encode(np.zeros(8000 * 7200, np.float32), 8000, "FLAC")


def _noise() -> bytes:
    return encode(np.random.default_rng(38).normal(0, 0.25, 2 * RATE).clip(-1, 1).astype(np.float32), RATE)


# (case, audio maker (question wav ->) , extra create() arguments, status, code)
BAD = [
    ("empty-file", lambda q: b"", {}, 400, "empty"),
    ("not-audio", lambda q: b"Dear customer service, where is my order? " * 40, {}, 400, "not_audio"),
    ("truncated-wav-header", lambda q: q[:30], {}, 400, "truncated"),
    ("truncated-wav-data", lambda q: q[: len(q) // 2], {}, 400, "truncated"),
    ("zero-length-audio", lambda q: encode(np.zeros(0, np.float32), RATE), {}, 400, "no_samples"),
    ("two-hours", lambda q: _two_hours_flac(), {}, 413, "too_long"),
    ("two-hours-claimed", lambda q: q[:40] + struct.pack("<I", 7200 * RATE * 2) + q[44:], {}, 413, "too_long"),
    ("wrong-sample-format", lambda q: wav_with(0x2000), {}, 400, "unsupported"),
    ("fifty-mb-upload", lambda q: b"\x00" * (50 << 20), {}, 413, "file_too_large"),
    ("wrong-model", lambda q: q, {"model": "gpt-4o-transcribe"}, 404, "model_not_found"),
    ("bad-language", lambda q: q, {"language": "xx"}, 400, "bad_language"),
]


def _refused(oai, audio: bytes, **kw) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as e:
        transcribe(oai, audio, **kw)
    return e.value


def test_bad_input_is_a_4xx_in_openais_shape_and_a_caller_beside_it_is_unaffected(
    oai, gateway, stack, question_wav, speech_ready
):
    good: list[str] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def caller():  # a good caller all along, through the same gateway
        while not stop.is_set():
            try:
                good.append(transcribe(oai, question_wav).text)
            except BaseException as e:  # noqa: BLE001 (reported below)
                failures.append(e)
                return

    thread = threading.Thread(target=caller)
    thread.start()
    try:
        outcomes = {}
        for case, make, kw, _, _ in BAD:
            error = _refused(oai, make(question_wav), **kw)
            body = error.body
            outcomes[case] = (error.status_code, body.get("code"))
            assert set(body) == {"message", "type", "param", "code"}, (case, body)
            assert body["type"] == "invalid_request_error" and "Traceback" not in body["message"], (case, body)
            assert gateway.healthy() and stack.ready(), case
        # silence and noise are not errors: an empty transcript, and whatever noise sounds like
        assert transcribe(oai, encode(np.zeros(2 * RATE, np.float32), RATE)).text.strip() == ""
        assert len(transcribe(oai, _noise()).text) < 200
    finally:
        stop.set()
        thread.join(120)
    assert outcomes == {case: (status, code) for case, _, _, status, code in BAD}
    assert not failures, failures
    assert good and all(wer(text) <= MAX_WER for text in good), good
    assert speech_ready.ready("asr") and speech_ready.ready()


def test_the_model_list_names_the_recognizer(oai):
    ids = [m.id for m in oai.models.list().data]
    assert ids[0] == "switchboard" and "switchboard-asr" in ids and "whisper-1" in ids


# -- voice chat: a chat completion whose last message is audio -------------------------------------------
def audio_message(wav: bytes) -> dict:
    data = base64.b64encode(wav).decode()
    return {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}


def test_a_spoken_question_is_answered_with_what_was_heard(oai, question_wav):
    r = oai.chat.completions.create(model="switchboard", messages=[audio_message(question_wav)], max_tokens=32)
    heard = r.model_extra["switchboard"]["asr"]
    assert wer(heard["transcript"]) <= MAX_WER and heard["asr_ms"] > 0 and heard["audio_s"] > 1
    assert r.choices[0].message.content.strip() and r.usage.completion_tokens > 0

    history = [
        {"role": "user", "content": heard["transcript"]},
        {"role": "assistant", "content": r.choices[0].message.content},
    ]
    chunks = list(
        oai.chat.completions.create(
            model="switchboard",
            messages=[*history, audio_message(question_wav)],
            max_tokens=32,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Switchboard-Stats": "1"},
        )
    )
    assert chunks[0].model_extra["switchboard"]["asr"]["transcript"] == heard["transcript"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    stats = chunks[-1].model_extra["switchboard"]
    assert stats["asr"]["transcript"] == heard["transcript"] and stats["prompt_tokens"] > 0
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 16  # the first turn's blocks, by content


def test_a_spoken_question_of_silence_is_400_no_speech(oai):
    silence = encode(np.zeros(RATE, np.float32), RATE)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            r = oai.chat.completions.create(model="switchboard", messages=[audio_message(silence)], stream=stream)
            list(r) if stream else None
        assert e.value.code == "no_speech" and e.value.param == "messages"


def test_bad_audio_in_a_chat_names_the_messages(oai, question_wav):
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model="switchboard", messages=[audio_message(question_wav[:30])])
    assert (e.value.status_code, e.value.code, e.value.param) == (400, "truncated", "messages")
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model="switchboard", messages=[audio_message(_two_hours_flac())])
    assert (e.value.status_code, e.value.code) == (413, "too_long")


# -- the SDK and the CLI over gRPC ----------------------------------------------------------------------
def test_the_sdk_transcribes_and_talks(stack, speech_ready, question_wav):
    result = speech_ready.transcribe(question_wav, priority=1)
    assert wer(result.text) <= MAX_WER and result.asr_ms > 0
    events = list(speech_ready.voice_chat(question_wav, session_id="voice-sdk-1", max_new_tokens=24))
    assert isinstance(events[0], Heard) and events[0].transcript == result.text
    assert "".join(e for e in events if isinstance(e, str)).strip()
    assert events[-1].asr["transcript"] == result.text and events[-1].session in ("miss", "hit")
    second = speech_ready.voice_chat(question_wav, session_id="voice-sdk-1", max_new_tokens=24, stream=False)
    assert second.stats.session == "hit" and second.stats.reused_tokens > 0  # the first turn is its history
    with pytest.raises(ChatError) as e:
        speech_ready.transcribe(question_wav[:30])
    assert e.value.code == "INVALID_ARGUMENT" and str(e.value).startswith("[truncated]")

    async def asynchronous():
        async with AsyncChatClient(stack.grpc_url, timeout_s=120) as client:
            return await client.transcribe(question_wav), await client.voice_chat(question_wav, max_new_tokens=16)

    transcript, reply = asyncio.run(asynchronous())
    assert transcript.text == result.text and reply.heard.transcript == result.text and reply.text.strip()


def test_the_cli_asks_aloud(stack, speech_ready, question_wav, tmp_path):
    path = tmp_path / "question.wav"
    path.write_bytes(question_wav)
    cli = Path(sys.executable).parent / "switchboard-chat"
    proc = subprocess.run(
        [str(cli), "--url", stack.grpc_url, "--audio", str(path), "--max-new-tokens", "24"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    heard, _, answer = proc.stdout.partition("\n")
    assert heard.startswith("heard: ") and wer(heard.removeprefix("heard: ")) <= MAX_WER
    assert answer.strip() and "of audio in" in proc.stderr


# -- while the recognizer is not loaded ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def building(stack, tmp_path_factory):
    """A second server as a fresh `make serve` starts one while the recognizer is still being
    built: every model of the repository but asr (launch leaves asr out until it is installed),
    sharing the first one's Redis."""
    repository = tmp_path_factory.mktemp("without-asr")
    for model in sorted(Path(stack.repository).iterdir()):
        if model.name != "asr" and (model / "config.pbtxt").is_file():
            (repository / model.name).symlink_to(model.resolve())
    ports = Ports.free()
    ports.redis = stack.ports.redis
    server = Stack(ports, repository=repository, run_dir=tmp_path_factory.mktemp("without-asr-run"))
    server.start_triton()
    yield server
    server.stop_triton()


def test_until_the_recognizer_is_loaded_voice_is_503_with_retry_after_and_text_works(
    stack, building, question_wav, tmp_path
):
    gateway = Gateway(building.grpc_url, tmp_path)
    try:
        oai = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=STANDARD_KEY, max_retries=0, timeout=120)
        for call in (
            lambda: transcribe(oai, question_wav),
            lambda: list(transcribe(oai, question_wav, stream=True)),
            lambda: oai.chat.completions.create(model="switchboard", messages=[audio_message(question_wav)]),
            lambda: list(
                oai.chat.completions.create(model="switchboard", messages=[audio_message(question_wav)], stream=True)
            ),
        ):
            with pytest.raises(openai.InternalServerError) as e:
                call()
            assert e.value.status_code == 503 and e.value.code == "speech_model_not_ready"
            assert e.value.response.headers["retry-after"] == "30" and "still being built" in e.value.message
        text = oai.chat.completions.create(
            model="switchboard", messages=[{"role": "user", "content": QUESTION}], max_tokens=8
        )
        assert text.choices[0].message.content
        with urllib.request.urlopen(f"{gateway.url}/readyz", timeout=10) as r:
            assert json.loads(r.read()) == {"status": "ready", "voice": "not_ready"}

        # The recognizer is built: installed and loaded as switchboard.ops.voice does, the same
        # gateway serves voice without a restart.
        (Path(building.repository) / "asr").symlink_to((Path(stack.repository) / "asr").resolve())
        load_model(f"http://127.0.0.1:{building.ports.http}", "asr", operator_key(building.run_dir))
        assert wer(transcribe(oai, question_wav).text) <= MAX_WER
        r = oai.chat.completions.create(model="switchboard", messages=[audio_message(question_wav)], max_tokens=8)
        assert wer(r.model_extra["switchboard"]["asr"]["transcript"]) <= MAX_WER
        with urllib.request.urlopen(f"{gateway.url}/readyz", timeout=10) as r:
            assert json.loads(r.read())["voice"] == "ready"
    finally:
        gateway.stop()
    assert "Traceback" not in gateway.logs()


def test_a_live_key_may_ask_for_priority_1(gateway, question_wav):
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=LIVE_KEY, max_retries=0, timeout=120)
    r = client.audio.transcriptions.create(
        file=("q.wav", question_wav), model=MODEL, extra_headers={"X-Switchboard-Priority": "1"}
    )
    assert wer(r.text) <= MAX_WER

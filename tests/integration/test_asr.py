"""The recognizer over gRPC against the real stack: ``asr`` and ``voice_chat`` through the SDK
and raw tritonclient streams, with audio spoken here by Debian's espeak-ng.

A recording longer than ``chunk_s`` streams its chunks in order; a burst is batched and its bad
files fail alone; both priorities are served; a voice turn becomes the session's history; an
unknown language and a cancelled stream are answered cleanly. (The gateway's side, OpenAI's
shapes and the bad-input list, is tests/integration/test_voice_gateway.py.)

Needs a recognizer in model_repository/asr/1: ``make test-recognizer`` installs Whisper tiny.en
(``make test`` does), whose hearing the word checks below are set for.
"""

from __future__ import annotations

import io
import queue
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import soundfile as sf
import tritonclient.grpc as grpcclient

from switchboard import paths
from switchboard.asr.audio import decode, encode_wav
from switchboard.asr.wer import normalize
from switchboard.client import ChatClient, ChatError, Heard
from switchboard.client.sync import close_stream
from switchboard.wire import PRIORITY_PARAMETER, Asr, AsrResult, ChatStats

pytestmark = [
    pytest.mark.skipif(
        not (paths.MODEL_REPOSITORY / "asr" / "1" / "asr.json").is_file(),
        reason="no recognizer installed in model_repository/asr/1 (no asr.json): run `make test-recognizer` "
        "(Whisper tiny.en; `make test` does)",
    ),
    pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="Debian's espeak-ng is not installed"),
]
RATE = 16_000
CHUNK_S = 15.0  # asr/config.pbtxt's chunk_s
# corpus questions (corpus/), short enough for one breath each
LONG = [
    "Where can I download my invoice?",
    "How do I track my package?",
    "Can I use two coupons?",
    "Do you accept American Express?",
]
SHORT = [
    "Where is my order?",
    "How do I track my package?",
    "Can I use two coupons?",
    "I forgot my password.",
    "Do you accept American Express?",
    "Can I pay for faster shipping?",
]


# -- audio, spoken here ----------------------------------------------------------------------------
def speak(text: str) -> np.ndarray:
    """``text`` spoken by espeak-ng (en-us), as 16 kHz float samples."""
    wav = subprocess.run(["espeak-ng", "-v", "en-us", "--stdout", text], capture_output=True, check=True).stdout
    return decode(wav, 60.0).samples


def quiet(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), np.float32)


def heard(question: str, transcript: str) -> bool:
    """Most of the question's words are in the transcript (tiny.en hears espeak-ng well, not
    perfectly)."""
    words, got = normalize(question).split(), set(normalize(transcript).split())
    return sum(w in got for w in words) >= 0.6 * len(words)


@pytest.fixture(scope="module")
def long_recording() -> bytes:
    """About 40 s: each question followed by a pause of 8 s (a caller looking something up), so
    the recording is cut into chunks of at most 15 s with speech in three of them and the
    silence at its end one of its own."""
    parts = [quiet(0.5)]
    for question in LONG:
        parts += [speak(question), quiet(8.0)]
    samples = np.concatenate(parts)
    return encode_wav(np.concatenate([samples, quiet(40.0 - len(samples) / RATE)]))


@pytest.fixture(scope="module")
def short_wavs() -> list[bytes]:
    return [encode_wav(np.concatenate([quiet(0.3), speak(q), quiet(0.3)])) for q in SHORT]


@pytest.fixture(scope="module")
def speech(stack) -> ChatClient:
    """An SDK client once asr and voice_chat (loaded at start: the recognizer is installed) answer."""
    client = ChatClient(stack.grpc_url, timeout_s=120)
    deadline = time.monotonic() + 120
    while not (client.ready("asr") and client.ready("voice_chat")):
        assert time.monotonic() < deadline, "asr and voice_chat did not become ready"
        time.sleep(0.5)
    return client


def raw_asr(url: str, audio: bytes, parameters: dict | None = None, timeout: float = 120):
    """A hand-made request to ``asr`` (request parameters only, no Triton priority); returns
    (text deltas, AsrResult or None, error or None)."""
    responses: queue.Queue = queue.Queue()
    tensor = grpcclient.InferInput(Asr.AUDIO, [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.asarray([[audio]], np.object_))
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: responses.put((result, error)))
    deltas: list[str] = []
    try:
        c.async_stream_infer("asr", [tensor], parameters=parameters)
        while True:
            result, error = responses.get(timeout=timeout)
            if error is not None:
                return deltas, None, error
            text, blob = result.as_numpy(Asr.TEXT), result.as_numpy(Asr.RESULT)
            if text is not None and text.reshape(-1)[0]:
                deltas.append(text.reshape(-1)[0].decode("utf-8"))
            if blob is not None and blob.reshape(-1)[0]:
                return deltas, AsrResult.from_json(blob.reshape(-1)[0]), None
    finally:
        close_stream(c)


def test_a_caller_that_does_not_stream_gets_the_result_alone(stack, speech, short_wavs):
    """asr_deltas false (the SDK's transcribe, the gateway's JSON answer, voice_chat): no delta
    is sent, only the last response, whose result is what the deltas add up to."""
    import asyncio

    from switchboard.client import AsyncChatClient

    async def both():
        async with AsyncChatClient(stack.grpc_url, timeout_s=120) as client:
            streamed = [e async for e in client.transcribe_stream(short_wavs[2], "en")]
            alone = [e async for e in client.transcribe_stream(short_wavs[2], "en", deltas=False)]
            return streamed, alone

    streamed, alone = asyncio.run(both())
    assert len(alone) == 1 and isinstance(alone[0], AsrResult)
    assert len(streamed) > 1 and "".join(streamed[:-1]).strip() == streamed[-1].text == alone[0].text != ""


# -- a long recording ----------------------------------------------------------------------------------
def test_a_long_recording_streams_its_chunks_in_order_and_adds_up(speech, long_recording):
    events = list(speech.transcribe(long_recording, stream=True))
    result = events[-1]
    assert isinstance(result, AsrResult) and all(isinstance(e, str) for e in events[:-1])
    assert "".join(events[:-1]).strip() == result.text

    segments = result.segments
    assert len(segments) >= 3 and result.chunks == len(segments) and result.duration == pytest.approx(40.0, abs=0.1)
    assert [s["id"] for s in segments] == list(range(len(segments)))
    assert segments[0]["start"] == 0.0 and segments[-1]["end"] == pytest.approx(result.duration, abs=0.01)
    assert all(a["end"] == b["start"] and a["start"] < b["start"] for a, b in zip(segments, segments[1:]))
    assert all(0 < s["end"] - s["start"] <= CHUNK_S + 0.01 for s in segments)

    spoken = [s for s in segments if s["text"]]
    assert len(spoken) >= 3 and " ".join(s["text"] for s in spoken) == result.text
    assert heard(LONG[0], spoken[0]["text"]) and heard(LONG[-1], spoken[-1]["text"]), segments
    # a chunk of nothing but the recording's closing silence never reaches the model (which
    # would hear "you" in it): an empty segment
    samples, _ = sf.read(io.BytesIO(long_recording), dtype="int16")
    silent = [s for s in segments if not samples[round(s["start"] * RATE) : round(s["end"] * RATE)].any()]
    assert silent and all(s["text"] == "" for s in silent), segments


# -- a burst ---------------------------------------------------------------------------------------------
def _burst(speech: ChatClient, audios: list[bytes]) -> list[AsrResult | ChatError]:
    """Every file transcribed on a thread of its own, all sent at once."""
    start = threading.Barrier(len(audios))

    def one(audio: bytes):
        start.wait()
        try:
            return speech.transcribe(audio)
        except ChatError as e:
            return e

    with ThreadPoolExecutor(len(audios)) as pool:
        return list(pool.map(one, audios))


def test_a_burst_is_batched_and_its_bad_files_fail_alone(speech, short_wavs):
    not_audio = b"Dear customer service, where is my order? " * 40
    truncated = short_wavs[0][: len(short_wavs[0]) // 2]  # the header promises twice the data
    sizes = []
    for _ in range(3):  # the first arrival may run alone; the rest wait for it and run together
        *good, bad_file, cut_file = _burst(speech, [*short_wavs, not_audio, truncated])
        for error, code in ((bad_file, "not_audio"), (cut_file, "truncated")):
            assert isinstance(error, ChatError), error
            assert error.code == "INVALID_ARGUMENT" and str(error).startswith(f"[{code}]"), error
        assert all(isinstance(r, AsrResult) for r in good), good
        assert all(heard(q, r.text) for q, r in zip(SHORT, good)), [r.text for r in good]
        sizes += [r.batch_size for r in good]
        if max(sizes) > 1:
            break
    assert max(sizes) > 1, f"no batch held more than one request: {sizes}"
    assert speech.ready("asr")


# -- priorities ------------------------------------------------------------------------------------------
def test_priority_1_and_2_are_both_served(stack, speech, short_wavs):
    # by the request parameter alone (raw) and as the SDK sends it (parameter and Triton's
    # priority), at once; an unknown priority is served as the default
    calls = [
        lambda: raw_asr(stack.grpc_url, short_wavs[0], {PRIORITY_PARAMETER: 1}),
        lambda: raw_asr(stack.grpc_url, short_wavs[1], {PRIORITY_PARAMETER: 2}),
        lambda: raw_asr(stack.grpc_url, short_wavs[2], {PRIORITY_PARAMETER: 7}),
        lambda: speech.transcribe(short_wavs[3], priority=1),
        lambda: speech.transcribe(short_wavs[4], priority=2),
    ]
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        outcomes = [f.result(timeout=300) for f in futures]
    for i, (deltas, result, error) in enumerate(outcomes[:3]):
        assert error is None and result is not None, error
        assert "".join(deltas).strip() == result.text and heard(SHORT[i], result.text), result.text
    for i, result in enumerate(outcomes[3:], start=3):
        assert heard(SHORT[i], result.text), result.text


# -- voice chat --------------------------------------------------------------------------------------------
def test_a_voice_turn_is_the_sessions_history(speech, short_wavs):
    session = f"asr-voice-{time.monotonic_ns()}"
    events = list(speech.voice_chat(short_wavs[0], session_id=session, max_new_tokens=24))
    assert isinstance(events[0], Heard) and heard(SHORT[0], events[0].transcript)
    assert "".join(e for e in events if isinstance(e, str)).strip()
    final = events[-1]
    assert isinstance(final, ChatStats) and set(final.asr) >= {"transcript", "audio_s", "asr_ms"}
    assert final.asr["transcript"] == events[0].transcript and final.asr["asr_ms"] > 0
    assert final.asr["audio_s"] == pytest.approx(len(decode(short_wavs[0], 60.0).samples) / RATE, abs=0.05)

    typed = speech.chat("And can I change the delivery address?", session_id=session, stream=False, max_new_tokens=16)
    assert typed.stats.session == "hit", typed.stats  # the spoken turn was stored as its history


# -- refusals and cancellation ------------------------------------------------------------------------------
def test_a_language_the_recognizer_does_not_know_is_refused(speech, short_wavs):
    for call in (
        lambda: speech.transcribe(short_wavs[0], language="fr"),
        lambda: speech.voice_chat(short_wavs[0], language="fr", stream=False),
    ):
        with pytest.raises(ChatError) as e:
            call()
        assert e.value.code == "INVALID_ARGUMENT" and str(e.value).startswith("[bad_language]"), e.value
    assert speech.ready("asr") and speech.ready("voice_chat")


def test_a_stream_cancelled_after_its_first_delta_ends_and_the_next_request_is_answered(
    speech, long_recording, short_wavs
):
    outcome: dict = {}

    def listen_then_leave():
        events = speech.transcribe(long_recording, stream=True)
        outcome["first"] = next(events)
        events.close()  # closes the stream, cancelling the request
        outcome["closed"] = True

    listener = threading.Thread(target=listen_then_leave, daemon=True)
    listener.start()
    listener.join(180)
    assert outcome.get("closed"), f"the cancelled stream did not end: {outcome}"
    assert isinstance(outcome["first"], str) and outcome["first"].strip()

    after = speech.transcribe(short_wavs[1])
    assert heard(SHORT[1], after.text), after.text
    assert speech.ready("asr")


def test_asr_metrics_count_transcriptions_audio_and_refusals(stack, speech, short_wavs):
    """``switchboard_asr_*`` on the metrics port (docs/metrics.md): a transcription adds a
    request, its audio seconds and one observation to each histogram; a file that is not audio
    counts as invalid; the pending audio gauge exists, and no publisher has failed (the server's
    log)."""
    from perf.servertools import scrape

    def value(name, **labels):
        return scrape(stack.ports.metrics).get((name, tuple(sorted(labels.items()))), 0.0)

    time.sleep(1.2)  # earlier tests' requests published first
    before = {
        "transcribed": value("switchboard_asr_requests_total", outcome="transcribed"),
        "invalid": value("switchboard_asr_requests_total", outcome="invalid"),
        "audio": value("switchboard_asr_audio_seconds_total", priority="2"),
        "duration": value("switchboard_asr_duration_seconds_count", priority="2"),
        "queue": value("switchboard_asr_queue_seconds_count", priority="2"),
    }
    result = speech.transcribe(short_wavs[0], language="en")
    with pytest.raises(ChatError):
        speech.transcribe(b"this is not audio", language="en")
    deadline = time.monotonic() + 10
    while value("switchboard_asr_requests_total", outcome="invalid") < before["invalid"] + 1:
        assert time.monotonic() < deadline, "the metrics were not published"
        time.sleep(0.3)
    # at least: a supervisor's probe (a second of silence) may land in between
    assert value("switchboard_asr_requests_total", outcome="transcribed") >= before["transcribed"] + 1
    assert value("switchboard_asr_audio_seconds_total", priority="2") >= before["audio"] + result.duration - 1e-6
    assert value("switchboard_asr_duration_seconds_count", priority="2") >= before["duration"] + 1
    assert value("switchboard_asr_queue_seconds_count", priority="2") >= before["queue"] + 1
    assert ("switchboard_asr_pending_audio_seconds", ()) in scrape(stack.ports.metrics)
    failed = [line for line in stack.triton_log.read_text(errors="replace").splitlines() if "metrics failed" in line]
    assert not failed, failed[:3]

"""The web chat's microphone in headless Chromium (Debian's, driven by Playwright, as
test_webchat.py): Chromium's fake capture device plays an espeak-ng question (16 kHz WAV) into
getUserMedia; the caller presses the microphone, speaks, presses again; the page sends 16 kHz
WAV as input_audio, shows what was heard as the caller's bubble and streams the answer. Then
what the page says when the microphone is denied and while the speech model is being built."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import time
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

from switchboard import paths
from switchboard.asr.wer import error_rate
from switchboard.ops.launch import free_port
from tests.integration.gatewaytools import LIVE_KEY, Gateway

CHROMIUM = "/usr/bin/chromium"
QUESTION = "Where is my order?"
ASR_INSTALLED = (paths.MODEL_REPOSITORY / "asr" / "1" / "asr.json").is_file()
pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
    pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="Debian's espeak-ng is not installed"),
]
needs_recognizer = pytest.mark.skipif(
    not ASR_INSTALLED,
    reason="no recognizer installed in model_repository/asr/1 (no asr.json): `make serve` builds and installs "
    "the default one, or `python -m switchboard.ops.voice join`",
)


@pytest.fixture(scope="module")
def spoken(tmp_path_factory) -> tuple[Path, float]:
    """(the question as a 16 kHz mono 16-bit WAV with silence around it, its seconds)."""
    raw = subprocess.run(["espeak-ng", "-v", "en-us", "--stdout", QUESTION], capture_output=True, check=True).stdout
    samples, rate = sf.read(io.BytesIO(raw), dtype="float32")
    speech = soxr.resample(samples, rate, 16000).astype(np.float32)
    audio = np.concatenate([np.zeros(4800, np.float32), speech, np.zeros(16000, np.float32)])
    path = tmp_path_factory.mktemp("voice") / "question.wav"
    sf.write(path, audio, 16000, subtype="PCM_16")
    return path, len(audio) / 16000


def launch(playwright, *args: str):
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", *args])


@pytest.fixture(scope="module")
def playwright():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


def _page(browser, url: str, key: str | None = LIVE_KEY):
    context = browser.new_context(viewport={"width": 900, "height": 760}, locale="en-US")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="networkidle")
    if key:
        page.fill('[data-testid="key"]', key)
        page.press('[data-testid="key"]', "Tab")
    return context, page, errors


@needs_recognizer
def test_a_caller_asks_by_voice_and_hears_an_answer(stack, playwright, spoken, tmp_path):
    path, seconds = spoken
    gateway = Gateway(stack.grpc_url, tmp_path)
    browser = launch(
        playwright,
        "--use-fake-ui-for-media-stream",  # the permission prompt, answered yes
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={path}%noloop",  # played once from when capture starts
    )
    try:
        context, page, errors = _page(browser, gateway.url)
        sent = []
        page.on("request", lambda r: sent.append(r.post_data) if r.url.endswith("/v1/chat/completions") else None)
        mic = page.locator('[data-testid="mic"]')
        mic.click()
        page.locator('[data-testid="mic"][aria-pressed="true"]').wait_for()
        time.sleep(seconds + 0.3)
        mic.click()
        answer = page.locator('[data-testid="msg-assistant"]').last
        answer.locator('[data-testid="stats-toggle"]').wait_for(timeout=120_000)  # the answer is complete

        heard = page.locator('[data-testid="msg-user"] .text').all_inner_texts()
        assert len(heard) == 1 and error_rate([QUESTION], heard, "en") <= 0.5, heard
        assert answer.locator(".text").inner_text().strip()
        answer.locator('[data-testid="stats-toggle"]').click()
        assert re.search(r"heard \d+\.\d s / \d+ ms", answer.locator('[data-testid="stats"]').inner_text())

        # What went out: OpenAI's input_audio, a 16 kHz mono 16-bit WAV about as long as the recording.
        body = json.loads(sent[-1])
        part = body["messages"][-1]["content"][0]
        assert part["type"] == "input_audio" and part["input_audio"]["format"] == "wav"
        with wave.open(io.BytesIO(base64.b64decode(part["input_audio"]["data"]))) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
            assert seconds - 0.5 < w.getnframes() / 16000 < seconds + 2

        page.reload()  # the transcript is kept as the conversation's text
        assert page.locator('[data-testid="msg-user"] .text').all_inner_texts() == heard
        assert not errors, errors
        context.close()
    finally:
        browser.close()
        gateway.stop()


def test_a_denied_microphone_is_explained(playwright, tmp_path):
    gateway = Gateway(f"127.0.0.1:{free_port()}", tmp_path, keys=False)  # nothing is sent
    browser = launch(playwright, "--use-fake-device-for-media-stream")  # no fake UI: the prompt is refused
    try:
        context, page, errors = _page(browser, gateway.url, key=None)
        page.click('[data-testid="mic"]')
        error = page.locator('[data-testid="error"]')
        error.wait_for(state="visible", timeout=20_000)
        assert "Microphone access was denied" in error.inner_text()
        assert page.locator('[data-testid="msg-user"]').count() == 0 and not errors
        context.close()
    finally:
        browser.close()
        gateway.stop()


def test_while_the_speech_model_is_built_the_page_says_so(playwright, spoken, tmp_path):
    """The gateway's 503 (tests/integration/test_voice_gateway.py makes the real one), as the page shows it."""
    path, seconds = spoken
    gateway = Gateway(f"127.0.0.1:{free_port()}", tmp_path, keys=False)
    browser = launch(
        playwright,
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={path}%noloop",
    )
    try:
        context, page, errors = _page(browser, gateway.url, key=None)
        unready = {
            "error": {
                "message": "the speech model is still being built or loaded; text chat works, retry voice in 30 s",
                "type": "server_error",
                "param": None,
                "code": "speech_model_not_ready",
            }
        }
        page.route(
            "**/v1/chat/completions",
            lambda route: route.fulfill(
                status=503,
                headers={"Retry-After": "30"},
                content_type="application/json",
                body=json.dumps(unready),
            ),
        )
        page.click('[data-testid="mic"]')
        page.locator('[data-testid="mic"][aria-pressed="true"]').wait_for()
        time.sleep(1.0)
        page.click('[data-testid="mic"]')
        error = page.locator('[data-testid="error"]')
        error.wait_for(state="visible", timeout=20_000)
        assert "speech model is still being built" in error.inner_text() and "30 s" in error.inner_text()
        assert page.locator('[data-testid="msg-user"]').count() == 0  # nothing heard: nothing kept
        assert page.locator('[data-testid="mic"]').is_enabled() and not errors
        context.close()
    finally:
        browser.close()
        gateway.stop()

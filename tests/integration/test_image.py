"""The serving image as a pod runs it: `make image-smoke`'s checks where podman and the image are.

Building the image takes longer than CI's budget allows on every run (docs/kubernetes.md, "The
image"), so this test uses an image built before (`make image`) and is skipped, saying so, where
there is none or no podman.
"""

from __future__ import annotations

import shutil

import pytest

from switchboard.ops import image

pytestmark = [
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (apt-get install podman runc)"),
    pytest.mark.skipif(
        shutil.which("podman") is not None and not image.image_exists(image.IMAGE),
        reason=f"no image {image.IMAGE!r} here: build it with `make image` (not part of make test)",
    ),
]


def test_image_serves_a_chat_and_speech_through_the_gateway_and_stops_cleanly():
    result = image.smoke(image.IMAGE)
    assert result.answer.strip(), "the gateway's chat answered nothing"
    assert result.exit_codes == {"gateway": 0, "server": 0}, "a container did not exit 0 on SIGTERM"
    assert result.left_over == [], "a container was left behind"
    assert result.uid not in ("", "0"), f"the server runs as uid {result.uid!r}, not the image's non-root user"
    assert result.bind_mounts == [], "the containers see host paths"
    if result.speech:
        # Whisper base (the default build) hears espeak-ng's plain voice: the question's key word
        # at least, whatever it makes of the rest
        assert result.heard, "the image has a recognizer, but the transcription heard nothing"
        assert "library" in result.heard.lower(), f"asked {image.SPOKEN!r}, heard {result.heard!r}"
    assert result.ok

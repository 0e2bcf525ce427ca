"""What the tests that start a recognizer of their own share: tiny.en as ``make test`` exports
it (the smoke bench's model), and the marks that skip them without it or without espeak-ng."""

from __future__ import annotations

import shutil

import pytest

from perf import asr_bench

TINY = asr_bench.MODELS["test-tiny-en"]
NEEDS_TINY_EN = [
    pytest.mark.skipif(
        not (TINY.artifacts / "asr.json").is_file() or not (TINY.checkpoint / "config.json").is_file(),
        reason=f"tiny.en is not exported to {TINY.artifacts} (make test-recognizer)",
    ),
    pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="Debian's espeak-ng is not installed"),
]

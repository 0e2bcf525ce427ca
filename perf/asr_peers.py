"""The ASR benchmark's peers: ``python -m perf.asr_peers faster-whisper|litserve``.

The same checkpoints, run the ways a team would pick without Switchboard:

``faster-whisper``  CTranslate2 through faster-whisper, in process, as the library is embedded:
                    one ``WhisperModel`` shared by a thread per caller. Its knobs for concurrent
                    callers are ``num_workers`` (translations CTranslate2 runs at once) and
                    ``cpu_threads`` (threads each); ``BatchedInferencePipeline`` batches the
                    30 s windows of one file, not separate requests, so it is here
                    (``--mode batched``) to be measured, not assumed. Greedy (``beam_size=1``,
                    one temperature, so no fallback re-decoding), ``without_timestamps``, no
                    VAD, nothing conditioned on earlier text: the decoding Switchboard does. No
                    server: this process runs the load itself (``asr_load.closed_loop``) and
                    writes the samples, so faster-whisper pays no network or client costs.
``litserve``        LitServe 0.2.19 serving the Hugging Face checkpoint with transformers'
                    ``WhisperForConditionalGeneration.generate``, LitServe's request batching
                    (``max_batch_size``, ``batch_timeout``): seed 002's setup, with the audio
                    decoded in memory rather than through a temporary file. ``POST /predict``,
                    multipart field ``content`` (the file) and optional ``language``, answers
                    ``{"text": ...}``.

Stock transformers' encoder takes exactly ``2 * max_source_positions`` frames, so the LitServe
peer pads every input to the model's window (30 s for pretrained Whisper, 5 s for the embedded
default), as Switchboard does. faster-whisper reads the window
from ``preprocessor_config.json`` next to the CTranslate2 model (``ct2_model`` writes it) but
pads to 3,000 frames whatever that says (``pad_to_window`` points it at the model's window),
and decides from the vocabulary's size whether a model is multilingual (>= 51,865 tokens):
the embedded default's small vocabulary has language tokens all the same, so the peer says so
(``_Multilingual``), or faster-whisper would leave the language and task out of the prompt.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.client
import io
import json
import logging
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

from perf import asr_load
from perf.asr_load import Clip, Reply
from perf.peers import HttpChatClient
from switchboard.asr.checkpoint import hop_length

log = logging.getLogger("perf.asr_peers")
CT2_FILES = ("tokenizer.json", "preprocessor_config.json")


# -- checkpoints ------------------------------------------------------------------------------
def ct2_model(checkpoint: Path, cache: Path) -> Path:
    """``checkpoint`` converted for CTranslate2 (float32 weights: faster-whisper's
    ``compute_type`` quantizes when it loads them), cached under ``cache`` by the checkpoint's
    files and the converter's version."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    from switchboard.artifact.manifest import file_digest

    checkpoint = Path(checkpoint)
    files = [p for p in sorted(checkpoint.iterdir()) if p.is_file() and not p.name.startswith(".")]
    key = hashlib.sha256(f"{file_digest(files)}:{ctranslate2.__version__}".encode()).hexdigest()[:12]
    out = Path(cache) / f"{checkpoint.name}-{key}"
    if (out / "model.bin").is_file():
        return out
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    TransformersConverter(str(checkpoint), copy_files=[f for f in CT2_FILES if (checkpoint / f).is_file()]).convert(
        str(tmp), quantization=None
    )
    write_window(tmp, asr_load.window_seconds(checkpoint), hop_length(checkpoint))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def write_window(directory: Path, seconds: float, hop: int = 160) -> None:
    """faster-whisper's feature extractor pads to ``chunk_length`` seconds: the model's window
    (frames ``hop`` samples apart)."""
    path = Path(directory) / "preprocessor_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {"feature_size": 80}
    if config.get("chunk_length") == seconds:
        return
    n = int(seconds * asr_load.SAMPLE_RATE)
    config |= {"chunk_length": int(seconds), "n_samples": n, "nb_max_frames": n // hop, "hop_length": hop}
    path.unlink(missing_ok=True)  # it may be a link to the checkpoint's own
    path.write_text(json.dumps(config, indent=2) + "\n")


# -- faster-whisper, in process ---------------------------------------------------------------
class _Multilingual:
    """A CTranslate2 Whisper that answers ``is_multilingual`` True (see the module docstring)."""

    is_multilingual = True

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)


def pad_to_window(frames: int) -> None:
    """faster-whisper pads every window to 3,000 frames (``audio.pad_or_trim``'s default)
    whatever the feature extractor says; a model with a shorter window (the embedded default's
    250 frames) is refused by CTranslate2 then. Its module's ``pad_or_trim`` is pointed at the
    model's window: one model per process, so the change is this process's alone."""
    import faster_whisper.transcribe as fw_transcribe
    from faster_whisper.audio import pad_or_trim

    fw_transcribe.pad_or_trim = functools.partial(pad_or_trim, length=frames)


class FasterWhisper:
    """``call(clip)`` for ``asr_load``: one shared model, any number of calling threads."""

    def __init__(
        self,
        model_dir: Path | str,
        compute_type: str,
        num_workers: int,
        cpu_threads: int,
        mode: str = "threads",
        multilingual: bool = False,
        max_new_tokens: int | None = None,
        suppress_tokens: list[int] | None = None,
    ):
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        model, files = str(model_dir), None
        if model.startswith("source:"):  # a pinned package's model.bin, from memory (whisper_ct2)
            from switchboard.checkpoints import whisper_ct2

            model = model.removeprefix("source:")
            files = whisper_ct2.ct2_files(whisper_ct2.SOURCES[model])
        self.model = WhisperModel(
            model,
            device="cpu",
            compute_type=compute_type,
            cpu_threads=cpu_threads,
            num_workers=num_workers,
            files=files,
        )
        if multilingual and not self.model.model.is_multilingual:
            self.model.model = _Multilingual(self.model.model)
        pad_to_window(self.model.feature_extractor.nb_max_frames)
        self.mode = mode
        self.pipeline = BatchedInferencePipeline(self.model) if mode == "batched" else None
        self.options = {
            "beam_size": 1,
            "temperature": 0.0,
            "without_timestamps": True,
            "vad_filter": False,
            "condition_on_previous_text": False,
            "no_speech_threshold": None,  # every window decoded and kept, as Switchboard does
            "max_new_tokens": max_new_tokens,
        }
        if suppress_tokens is not None:
            self.options["suppress_tokens"] = suppress_tokens

    def __call__(self, clip: Clip) -> Reply:
        audio = io.BytesIO(clip.wav)
        if self.pipeline is not None:
            segments, _ = self.pipeline.transcribe(audio, language=clip.lang, batch_size=8, **self.options)
        else:
            segments, _ = self.model.transcribe(audio, language=clip.lang, **self.options)
        return Reply("".join(s.text for s in segments).strip())


def run_faster_whisper(job: dict) -> dict:
    """The job the bench wrote (model, settings, clips, levels) run here; the samples back."""
    t0 = time.monotonic()
    fw = FasterWhisper(
        job["model"],
        job["compute_type"],
        job["num_workers"],
        job["cpu_threads"],
        job.get("mode", "threads"),
        job.get("multilingual", False),
        job.get("max_new_tokens"),
        job.get("suppress_tokens"),
    )
    load_s = time.monotonic() - t0
    clips = asr_load.load_clips(Path(job["clips"]))
    levels = []
    for level in job["levels"]:
        samples = asr_load.closed_loop(fw, clips, level["concurrency"], level["requests"], level.get("warmup", 0))
        levels.append({"concurrency": level["concurrency"], "samples": [s.__dict__ for s in samples]})
    return {"load_s": load_s, "levels": levels}


# -- LitServe ---------------------------------------------------------------------------------
class HttpAsrClient(HttpChatClient):
    """The bench's ``call(clip)`` for the LitServe peer: one connection per request (address
    and ``ready()`` as the chat peers' client)."""

    def __init__(self, url: str, timeout_s: float = 300.0):
        super().__init__(url, timeout_s)

    def __call__(self, clip: Clip) -> Reply:
        boundary = uuid.uuid4().hex
        body = b"".join(
            [
                f'--{boundary}\r\nContent-Disposition: form-data; name="language"\r\n\r\n{clip.lang}\r\n'.encode(),
                f'--{boundary}\r\nContent-Disposition: form-data; name="content"; filename="{clip.id}.wav"\r\n'
                "Content-Type: audio/wav\r\n\r\n".encode(),
                clip.wav,
                f"\r\n--{boundary}--\r\n".encode(),
            ]
        )
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            c.request("POST", "/predict", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
            r = c.getresponse()
            payload = r.read()
        finally:
            c.close()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {payload[:200].decode(errors='replace')}")
        return Reply(json.loads(payload)["text"].strip())


def serve_litserve(args) -> None:
    import litserve as ls

    from perf.asr_litserve import WhisperAPI

    api = WhisperAPI(
        args.checkpoint,
        args.threads,
        args.max_new_tokens,
        max_batch_size=args.max_batch,
        batch_timeout=args.batch_timeout,
    )
    server = ls.LitServer(api, accelerator="cpu", devices=1, timeout=args.queue_timeout)
    server.run(host="127.0.0.1", port=args.port, num_api_servers=1, generate_client_file=False, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.asr_peers", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="peer", required=True)
    fw = sub.add_parser("faster-whisper", help="run a job file in process, write the samples")
    fw.add_argument("--job", type=Path, required=True, help="JSON: model, compute_type, num_workers, ...")
    fw.add_argument("--out", type=Path, required=True, help="where the samples go (JSON)")
    lit = sub.add_parser("litserve", help="serve a checkpoint with LitServe's batching")
    lit.add_argument("--checkpoint", type=Path, required=True, help="Hugging Face Whisper directory")
    lit.add_argument("--port", type=int, default=8200)
    lit.add_argument("--threads", type=int, default=0, help="PyTorch intra-op threads (0: every core)")
    lit.add_argument("--max-batch", type=int, default=8, help="LitServe max_batch_size")
    lit.add_argument("--batch-timeout", type=float, default=0.01, help="LitServe batch_timeout (s)")
    lit.add_argument("--max-new-tokens", type=int, default=None, help="generation cap (default: the model's)")
    lit.add_argument("--queue-timeout", type=float, default=600, help="LitServe request timeout (s)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.peer == "faster-whisper":
        if not args.job.is_file():
            p.error(f"--job {args.job}: no such file")
        result = run_faster_whisper(json.loads(args.job.read_text()))
        args.out.write_text(json.dumps(result))
    else:
        if not (args.checkpoint / "config.json").is_file():
            p.error(f"--checkpoint {args.checkpoint}: no config.json (not a Hugging Face checkpoint)")
        serve_litserve(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ASR pool on a GPU, 1 caller against 8: ``python -m perf.asr_gpu run``.

Issue 38 asks the pool to serve 8 concurrent callers at least 3 times faster (audio seconds per
wall second) than one. On 2 CPU cores that cannot hold (a batch of 8 costs 8 single runs); on a
GPU, where a batch of 8 costs about what one does, it is what batching is for.

``run`` measures, for each model (the embedded default, tiny.en, the whisper-small shape with
random weights and 12-token transcripts), each ``--dtypes`` and each ``--steps`` (CUDA graphs
replayed per decoding step, or the kernels launched one by one: ``torch_runtime.py``; ``-host``:
each step's logits to the host and the tokens chosen there, as before the device chose; one copy
of the weights, and ``same_tokens`` says whether a batch of 8 decodes the same in each), the
pool's own code in process:
``service.AsrService`` with the length batcher as ``asr/config.pbtxt`` sets it (at most 8 chunks,
10 ms to fill, 60 s of audio), the recognizer on ``torch_runtime.TorchWhisper`` (what
``runtime: torch`` serves), driven by ``asr_load.closed_loop`` with 1 caller, 8 callers, 8
callers with batches of 1 (the pool without its batching) and 8 callers with 2 batch workers;
then transformers' ``generate`` on batches of 1 and of 8 formed in advance (no queue: a PyTorch
server's best case, what LitServe runs in ``asr_bench``). Triton's gRPC front is left out: it
costs the same in every row (``asr_gpu_served`` measures the pool behind it on such a machine).

By default it reads this repository's build outputs (``make model-asr model-asr-tiny-en``; the
whisper-small shape is built if missing) on a machine with a CUDA build of PyTorch. Where the
GPU machine is a bare one reached by copying a folder (this project's leases),
``python -m tools.gpu_pack asr`` writes what it needs into one folder, here: the clips, the
default's checkpoint, tiny.en's weights as per-row INT8 (``run --pack`` turns them back into a
float checkpoint, and the error rates say what the rounding cost) and the tokenizer files the
whisper-small shape is built from.

``seed001`` runs seed 001 in process (2 s questions among 30 s recordings, Poisson arrivals at
1.2x what the pool does one request at a time), length against count batching, in each
``--steps`` mode: ``graphs`` (queued chunks join running batches) against ``graphs-whole``.

``first`` loads each model four times in turn, with its graphs captured at load
(``TorchWhisper.warm``, what the server does) and without, and times the first batches.

``profile`` samples the batch worker's stack with 8 callers in one ``--steps`` mode: which
lines its time goes to.

Writes ``results.json`` and ``summary.md`` (``first``: ``first-batches.txt``; ``seed001``:
``seed001.json``; ``profile``: ``profile-<model>-<dtype>-<mode>.txt``) to ``--out``;
``docs/benchmarks.md`` keeps the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
import threading
import time
from pathlib import Path

import numpy as np

from perf import asr_load
from perf.gpu_machine import MODELS, checkpoint_of, clips_of
from perf.stats import percentile, ratio
from switchboard import paths

# (label, the pool's max_batch, callers, batch workers)
SETTINGS = (
    ("1 caller", 8, 1, 1),
    ("8 callers", 8, 8, 1),
    ("8 callers, batches of 1", 1, 8, 1),
    ("8 callers, 2 workers", 8, 8, 2),
)
# --steps suffixes, each turning off one thing the pool does by default (to measure it):
HOST = "-host"  # the tokens chosen from logits on the host, not on the device
EAGER = "-eager"  # a fixed window's encoder launched kernel by kernel, not replayed as a CUDA graph
WHOLE = "-whole"  # whole batches: no queued chunk joins a running batch (no in-flight batching)
# and one turning on what the pool does not yet do on a GPU by default:
FITTED = "-fitted"  # a fixed-window model's chunks padded to windows fitted to them (asr windows)
STEPS = (
    "graphs",
    "growing",
    "static",
    "graphs" + HOST,
    "static" + HOST,
    "graphs" + EAGER,
    "graphs" + WHOLE,
    "static" + WHOLE,
    "graphs" + FITTED,
    "static" + FITTED,
)
log = logging.getLogger("perf.asr_gpu")


def base_mode(mode: str) -> str:
    """A --steps mode's decoding steps: graphs, static or growing."""
    return mode.split("-")[0]


def set_mode(model, mode: str) -> bool:
    """Put an ``AsrModel`` on ``TorchWhisper`` in a --steps mode (one copy of the weights for
    every mode); returns whether queued chunks join running batches in it (``AsrService(join=)``)."""
    runtime = model.runtime
    runtime.steps_mode = base_mode(mode)
    runtime.choose_on_device = not mode.endswith(HOST)
    runtime.encoder_graphs = not mode.endswith(EAGER)
    fitted = mode.endswith(FITTED)
    if model.manifest.fitted_windows != fitted:  # the buffers (a cross mask or none) are made anew
        model.manifest = dataclasses.replace(model.manifest, fitted_windows=fitted)
        runtime.manifest = dataclasses.replace(runtime.manifest, fitted_windows=fitted)
        runtime._free.clear()
    return not mode.endswith(WHOLE)


# -- running ----------------------------------------------------------------------------------
class _Waiter:
    """A sink that the caller's thread waits on."""

    def __init__(self):
        self.event, self.result, self.failure = threading.Event(), None, None

    def emit(self, text: str) -> None:
        pass

    def finish(self, result) -> None:
        self.result = result
        self.event.set()

    def fail(self, error: Exception) -> None:
        self.failure = error
        self.event.set()

    def cancelled(self) -> bool:
        return False


def capped(model, cap: int | None):
    if cap is not None:
        m = model.manifest
        model.manifest = dataclasses.replace(m, max_target_positions=m.prompt_length + cap)
    return model


def loaded(name: str, checkpoint: Path, device: str, dtype: str, mode: str):
    """``name``'s recognizer (from ``checkpoint_of``) on ``TorchWhisper`` with ``mode``'s
    decoding steps, its transcripts capped as ``MODELS`` says (``set_mode`` sets the rest)."""
    from switchboard.asr.model import AsrModel

    model = AsrModel.from_checkpoint(checkpoint, device=device, dtype=dtype, steps=base_mode(mode))
    return capped(model, MODELS[name][1])


def measure(
    model, clips: list, max_batch: int, callers: int, workers: int, requests: int, warmup: int, join: bool = True
) -> dict:
    """One closed-loop run of a fresh pool over ``model``; ``busy``: the share of the measured
    time a batch's step was running (near 1 with one worker: the batches are the limit, not the
    audio's preparation or the callers)."""
    service = pool(model, max_batch, workers, join)
    spans: list[tuple[float, float]] = []
    step = service.step  # one step of a batch (switchboard/common/loop.py's Step)

    def timed(batch) -> None:
        started = time.monotonic()
        try:
            step(batch)
        finally:
            spans.append((started, time.monotonic()))

    service.step = timed
    sizes: list[int] = []
    call = caller(service, sizes)
    try:
        samples = asr_load.closed_loop(call, clips, callers, requests, warmup)
    finally:
        service.close()
    row = asr_load.throughput(samples)
    row["mean_batch"] = float(np.mean(sizes[-requests:])) if sizes else float("nan")
    first, last = min(x.sent for x in samples), max(x.done for x in samples)
    inside = sum(max(0.0, min(b, last) - max(a, first)) for a, b in spans)
    row["busy"] = inside / (last - first) / workers
    row["errors"] = asr_load.error_rates(samples, clips)
    return row


def pool(model, max_batch: int, workers: int, join: bool, batching: str = "length"):
    """A fresh ``AsrService`` over ``model`` as asr/config.pbtxt's defaults set it (the automatic
    budget: on a GPU, max_batch windows), with ``batching`` length or count."""
    from switchboard.asr.batcher import audio_budget, length_batcher, make_batcher
    from switchboard.asr.service import AsrService
    from switchboard.repository.config import AsrConfig

    cfg = AsrConfig()
    window_s = model.max_seconds if model.window_frames is not None else None
    padding = model.padded_s if window_s is not None else None
    if batching == "count":
        batcher = make_batcher("count", max_batch=max_batch, max_wait_s=cfg.max_wait_ms / 1000)
    else:
        batcher = length_batcher(
            padding,
            budget_s=audio_budget(cfg.batch_audio_s, window_s, max_batch, gpu=True),
            max_batch=max_batch,
            max_length_ratio=cfg.max_length_ratio,
            max_wait_s=cfg.max_wait_ms / 1000,
            long_s=cfg.long_audio_s,
            long_every=cfg.long_every,
            wait_alone=cfg.wait_alone,
        )
    chunk_s = min(cfg.chunk_s, model.max_seconds)
    return AsrService(
        model,
        batcher,
        chunk_s=chunk_s,
        workers=workers,
        join=join and cfg.join_running,
        max_audio_s=cfg.max_audio_s,
        max_pending_s=cfg.max_pending_s,
    )


def caller(service, sizes: list[int]):
    """A blocking call of ``service`` for ``asr_load``'s loops; each answer's batch size goes to ``sizes``."""
    from switchboard.asr.service import AsrJob

    def call(clip: asr_load.Clip) -> asr_load.Reply:
        sink = _Waiter()
        service.submit(AsrJob(clip.wav, sink, language=clip.lang))
        if not sink.event.wait(300):
            raise TimeoutError("no answer in 300 s")
        if sink.failure is not None:
            raise sink.failure
        sizes.append(sink.result.batch_size or 0)
        return asr_load.Reply(sink.result.text, {"batch_size": sink.result.batch_size})

    return call


def seed001(
    pack_dir: Path | None,
    out: Path,
    work: Path,
    name: str,
    dtype: str,
    device: str,
    steps: list[str],
    seconds: float,
    load: float,
    seed: int = 0,
) -> list[dict]:
    """Seed 001 in process on the GPU: 2 s questions among 30 s recordings (80/20), Poisson
    arrivals for ``seconds`` at ``load`` times what the pool does one request at a time, with
    length and with count batching, in each --steps mode (``-whole``: no joining). The pool's
    own code, as ``run`` measures it; Triton's front is left out (these machines cannot run it)."""
    from perf.asr_served import SEED001_MIX

    lang = MODELS[name][0][0]
    mix = clips_of(("seed001",), pack_dir) if pack_dir else asr_load.mix_clips(lang, shorts=12, longs=4, seed=seed)
    by_kind = {k: [c for c in mix if c.kind == k] for k in SEED001_MIX}
    model = loaded(name, checkpoint_of(name, pack_dir, work), device, dtype, steps[0])
    out.mkdir(parents=True, exist_ok=True)
    rows, rate = [], None
    for mode in steps:
        join = set_mode(model, mode)
        model.runtime.warm(1)
        for batching in ("length", "count"):
            service = pool(model, 8, 1, join, batching)
            call = caller(service, [])
            try:
                asr_load.closed_loop(call, mix, 1, 2, 0)  # warm
                if rate is None:  # one request at a time, each kind: the capacity the load is a multiple of
                    unit = {
                        k: percentile([x.latency for x in asr_load.closed_loop(call, c, 1, 4)], 50)
                        for k, c in by_kind.items()
                    }
                    rate = load / sum(SEED001_MIX[k] * unit[k] for k in SEED001_MIX)
                    print(
                        f"one at a time: short {unit['short']:.3f} s, long {unit['long']:.3f} s; "
                        f"arrivals {rate:.2f}/s ({load:g}x)",
                        flush=True,
                    )
                arrivals = asr_load.poisson_arrivals(rate, seconds, SEED001_MIX, seed)
                started = time.monotonic()
                samples = asr_load.open_loop(call, arrivals, by_kind)
                drained = time.monotonic() - started - seconds
            finally:
                service.close()
            kinds = asr_load.latency_by_kind(samples)
            errors = sorted({x.error for x in samples if not x.ok})
            row = {
                "model": name,
                "dtype": dtype,
                "steps": mode,
                "batching": batching,
                "rate_per_s": rate,
                "drain_s": drained,
                "by_kind": kinds,
                "errors": errors,
            }
            rows.append(row)
            short, long_ = kinds.get("short", {}), kinds.get("long", {})
            print(
                f"{name} {mode:12s} {batching:6s} short P50/P99 {short.get('p50_s', math.nan):.3f}/"
                f"{short.get('p99_s', math.nan):.3f} s, long {long_.get('p50_s', math.nan):.3f}/"
                f"{long_.get('p99_s', math.nan):.3f} s, failed {short.get('failed', 0) + long_.get('failed', 0)}, "
                f"drained {drained:.1f} s {'; '.join(errors)}",
                flush=True,
            )
            (out / "seed001.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def profile(
    pack_dir: Path | None,
    out: Path,
    work: Path,
    name: str,
    dtype: str,
    device: str,
    mode: str,
    requests: int,
    every_s: float = 0.0005,
) -> str:
    """Where the batch worker's time goes with 8 callers: its Python stack sampled every
    ``every_s`` while ``measure`` runs, as the share of samples each line was the innermost
    (leaf) and each function was anywhere on the stack (cumulative). Time inside a CUDA call
    that waits (a copy to the host) shows on the line that called it."""
    import collections
    import threading

    clips = clips_of(MODELS[name][0], pack_dir)
    model = loaded(name, checkpoint_of(name, pack_dir, work), device, dtype, mode)
    join = set_mode(model, mode)
    model.runtime.warm(1)
    leaf: collections.Counter = collections.Counter()
    cumulative: collections.Counter = collections.Counter()
    stop, me = threading.Event(), threading.get_ident()

    def sample() -> None:
        while not stop.is_set():
            for thread, frame in sys._current_frames().items():
                if thread == me:
                    continue
                stack, f = [], frame
                while f is not None:
                    stack.append((Path(f.f_code.co_filename).name, f.f_code.co_name, f.f_lineno))
                    f = f.f_back
                if not any(fn == "service.py" and func == "_work" for fn, func, _ in stack):
                    continue  # not a batch worker
                leaf["{}:{}:{}".format(*stack[0])] += 1
                for where in {f"{fn}:{func}" for fn, func, _ in stack}:
                    cumulative[where] += 1
            time.sleep(every_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        row = measure(model, clips, 8, 8, 1, requests, max(8, requests // 12), join)
    finally:
        stop.set()
        sampler.join()
    total = sum(leaf.values()) or 1
    lines = [
        f"{name} {dtype} {mode} on {device}, 8 callers: {row['audio_s_per_s']:.1f} audio s/s, "
        f"batch {row['mean_batch']:.1f}, busy {row['busy']:.2f}; {total} samples of the batch worker",
        "-- innermost line",
        *(f"{n / total:6.1%} {where}" for where, n in leaf.most_common(25)),
        "-- anywhere on the stack",
        *(f"{n / total:6.1%} {where}" for where, n in cumulative.most_common(40)),
    ]
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"profile-{name}-{dtype}-{mode}.txt").write_text(text)
    return text


def transformers_peer(checkpoint: Path, clips: list, cap: int | None, device: str, dtype: str, count: int) -> dict:
    """transformers' ``generate`` (what LitServe runs in ``asr_bench``) on ``count`` clips in
    batches of 1 and of 8 formed in advance: no queue, no server, a PyTorch server's best case.
    Audio decoding and features are inside the time, as they are in the pool's."""
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    from switchboard.asr.checkpoint import hop_length

    model = WhisperForConditionalGeneration.from_pretrained(checkpoint, dtype=getattr(torch, dtype)).to(device).eval()
    features = WhisperFeatureExtractor(
        feature_size=model.config.num_mel_bins,
        hop_length=hop_length(checkpoint),
        chunk_length=int(asr_load.window_seconds(checkpoint)),
    )
    kwargs = {"do_sample": False, "num_beams": 1} | ({"max_new_tokens": cap} if cap else {})
    multilingual = asr_load.multilingual(checkpoint)

    def transcribe(batch: list) -> None:
        audio = [asr_load.decode_audio(c.wav) for c in batch]
        x = features(audio, sampling_rate=16_000, return_tensors="pt").input_features.to(device, model.dtype)
        extra = {"language": [c.lang for c in batch], "task": "transcribe"} if multilingual else {}
        with torch.inference_mode():
            model.generate(x, **kwargs, **extra)

    out = {}
    todo = [clips[i % len(clips)] for i in range(count)]
    for size in (1, 8):
        transcribe(todo[:size])  # first-call costs stay out
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.monotonic()
        for i in range(0, len(todo), size):
            transcribe(todo[i : i + size])
        wall = time.monotonic() - started
        out[size] = sum(c.seconds for c in todo) / wall
    return out


def run(
    pack_dir: Path | None,
    out: Path,
    work: Path,
    models: list[str],
    dtypes: list[str],
    requests: dict,
    device: str,
    steps: list[str] = ("graphs", "growing"),
    transformers: bool = True,
) -> dict:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    results = {"device": device, "gpu": gpu, "torch": torch.__version__, "requests": requests, "rows": []}
    print(f"device {device} ({gpu}), torch {torch.__version__}", flush=True)
    for name in models:
        langs, cap = MODELS[name]
        clips = clips_of(langs, pack_dir)
        checkpoint = checkpoint_of(name, pack_dir, work)
        for dtype in dtypes:
            model = loaded(name, checkpoint, device, dtype, steps[0])
            warm = [model.features(asr_load.decode_audio(c.wav)) for c in clips[:8]]
            tokens = {}
            for mode in steps:
                join = set_mode(model, mode)
                model.runtime.warm(2)  # as the server does at load: a buffer set per worker, graphs captured
                for size in range(1, len(warm) + 1):  # every batch size once: first-call costs stay out
                    model.transcribe(warm[:size], [c.lang for c in clips[:size]])
                tokens[mode] = [t.tokens for t in model.transcribe(warm, [c.lang for c in clips[:8]])]
                same = float(np.mean([a == b for a, b in zip(tokens[mode], tokens[steps[0]])]))
                for label, max_batch, callers, workers in SETTINGS:
                    started = time.monotonic()
                    row = measure(
                        model, clips, max_batch, callers, workers, requests[callers], warmup=2 * callers, join=join
                    )
                    row |= {
                        "model": name,
                        "dtype": dtype,
                        "steps": mode,
                        "setting": label,
                        "max_batch": max_batch,
                        "callers": callers,
                        "same_tokens": same,  # rows of a batch of 8 decoded as the first mode did
                    }
                    results["rows"].append(row)
                    print(
                        f"{name:12s} {dtype:8s} {mode:8s} {label:24s} {row['audio_s_per_s']:8.1f} audio s/s  "
                        f"p50 {row['latency_p50_s'] * 1000:6.0f} ms  batch {row['mean_batch']:.1f}  "
                        f"busy {row['busy']:.2f}  failed {row['failed']}  {row['errors']}  same {same:.2f}  "
                        f"({time.monotonic() - started:.0f} s)",
                        flush=True,
                    )
                (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")  # so far
            del model
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            if not transformers:
                continue
            started = time.monotonic()
            peer = transformers_peer(checkpoint, clips, cap, device, dtype, requests[8])
            for size, rate in peer.items():
                label = f"transformers generate, batches of {size}"
                results["rows"].append({"model": name, "dtype": dtype, "setting": label, "audio_s_per_s": rate})
                print(f"{name:12s} {dtype:8s} {label:40s} {rate:8.1f} audio s/s", flush=True)
            print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
            (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")  # so far
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "summary.md").write_text(summary(results))
    print(summary(results), flush=True)
    return results


def first_batches(pack_dir: Path | None, out: Path, work: Path, models: list[str], dtype: str, device: str) -> None:
    """What a freshly loaded pool's first batches cost with the graphs captured at load
    (``TorchWhisper.warm``, two buffer sets) and without (captured by the batches themselves):
    each model loaded four times in turn, batches of 8 and 3 rows transcribed alternately."""
    import torch

    from switchboard.asr.model import AsrModel

    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for name in models:
        langs, cap = MODELS[name]
        checkpoint, clips = checkpoint_of(name, pack_dir, work), clips_of(langs, pack_dir)
        for warm in (True, False, True, False):
            model = AsrModel.from_checkpoint(checkpoint, device=device, dtype=dtype, fitted_windows=True)  # as served
            model = capped(model, cap)
            torch.cuda.synchronize()
            base, held, started = torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), time.perf_counter()
            captured = model.runtime.warm(2) if warm else 0
            torch.cuda.synchronize()
            took, memory = time.perf_counter() - started, (torch.cuda.memory_allocated() - base) / 2**20
            reserved = (torch.cuda.memory_reserved() - held) / 2**20  # the graphs' pools included
            feats = [model.features(asr_load.decode_audio(c.wav)) for c in clips[:8]]
            times = []
            for size in (8, 3) * 4:
                started = time.perf_counter()
                model.transcribe(feats[:size], [c.lang for c in clips[:size]])
                torch.cuda.synchronize()
                times.append(time.perf_counter() - started)
            lines.append(
                f"{name:12s} {'captured at load' if warm else 'not':16s} {captured} graphs in {took * 1000:.0f} ms, "
                f"{memory:.0f} MiB allocated, {reserved:.0f} MiB reserved; batches of 8, 3, ...: "
                + ", ".join(f"{x * 1000:.0f}" for x in times)
                + " ms"
            )
            print(lines[-1], flush=True)
            del model
            torch.cuda.empty_cache()
    (out / "first-batches.txt").write_text("\n".join(lines) + "\n")


def summary(results: dict) -> str:
    lines = [
        f"ASR pool on {results['gpu']} ({results['device']}), torch {results['torch']}",
        "",
        "Audio seconds per wall second. steps: graphs (a CUDA graph per step, queued chunks joining running "
        "batches) or growing (kernels one by one); -whole: whole batches, no joining; -eager: the encoder kernel by "
        "kernel; -host: tokens chosen on the host; -fitted: windows fitted to the audio. transformers: generate on "
        "batches formed in advance.",
        "",
        "| model | dtype | steps | 1 caller | 8 callers | 8 callers, batches of 1 | 8 callers, 2 workers | best 8 / 1 "
        "| best 8 / (8, batches of 1) | transformers, batches of 1 | of 8 | pool (8 callers) / transformers (of 8) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by, peers = {}, {}
    for r in results["rows"]:
        if r["setting"].startswith("transformers"):
            peers.setdefault((r["model"], r["dtype"]), {})[r["setting"]] = r["audio_s_per_s"]
        else:
            by.setdefault((r["model"], r["dtype"], r.get("steps", "growing")), {})[r["setting"]] = r["audio_s_per_s"]
    for (model, dtype, steps), s in by.items():
        one, eight, unbatched, two = (s.get(label, float("nan")) for label, *_ in SETTINGS)
        peer = peers.get((model, dtype), {})
        hf1, hf8 = (peer.get(f"transformers generate, batches of {n}", float("nan")) for n in (1, 8))
        best = max(eight, two)
        lines.append(
            f"| {model} | {dtype} | {steps} | {one:.1f} | {eight:.1f} | {unbatched:.1f} | {two:.1f} | "
            f"{ratio(best, one):.2f}x | {ratio(best, unbatched):.2f}x | "
            f"{hf1:.1f} | {hf8:.1f} | {ratio(best, hf8):.2f}x |"
        )
    return "\n".join(lines) + "\n"


def _measuring(parser: argparse.ArgumentParser, models: bool = False) -> argparse.ArgumentParser:
    """``parser`` with what seed001, profile and first share: where the pack, the results and
    the checkpoints are, which model (or ``models``), dtype and device."""
    parser.add_argument(
        "--pack",
        type=Path,
        help="a folder `python -m tools.gpu_pack asr` wrote (default: this repository's build outputs)",
    )
    parser.add_argument("--out", type=Path, default=paths.BUILD / "bench" / "asr-gpu")
    parser.add_argument("--work", type=Path, default=Path("/tmp/switchboard-asr-gpu"), help="checkpoints made there")
    if models:
        parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    else:
        parser.add_argument("--model", default="tiny-en", choices=sorted(MODELS))
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--device", default="cuda")
    return parser


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.asr_gpu", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    b = sub.add_parser("run", help="measure (on the GPU machine)")
    b.add_argument(
        "--pack",
        type=Path,
        help="a folder `tools.gpu_pack asr` wrote (default: this repository's build outputs, clips made here)",
    )
    b.add_argument("--out", type=Path, default=paths.BUILD / "bench" / "asr-gpu")
    b.add_argument("--work", type=Path, default=Path("/tmp/switchboard-asr-gpu"), help="checkpoints made there")
    b.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    b.add_argument("--dtypes", default="float16,float32", help="comma-separated: float32, float16, bfloat16")
    b.add_argument("--device", default="cuda")
    b.add_argument("--requests", default="16,64", help="requests measured with 1 caller, with 8")
    b.add_argument(
        "--steps",
        default="graphs,growing",
        help=f"comma-separated decoding modes ({', '.join(STEPS)}; torch_runtime.py; {HOST}: each step's logits "
        f"to the host, the tokens chosen there; {EAGER}: a fixed window's encoder launched kernel by kernel, not "
        f"replayed as a CUDA graph; {WHOLE}: whole batches, no queued chunk joining a running one; {FITTED}: a "
        "fixed window's chunks padded to windows fitted to them, asr's windows fitted), each measured on one copy "
        "of the weights; same_tokens compares each mode's transcripts to the first's",
    )
    b.add_argument(
        "--transformers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure transformers' generate on each model and dtype",
    )
    d = _measuring(
        sub.add_parser("seed001", help="seed 001 in process: questions among recordings, length and count batching")
    )
    d.add_argument("--steps", default="graphs,graphs-whole", help="comma-separated modes, as run's --steps")
    d.add_argument("--seconds", type=float, default=60.0, help="the arrival window")
    d.add_argument("--load", type=float, default=1.2, help="arrivals as a multiple of one-at-a-time capacity")
    f = _measuring(
        sub.add_parser("profile", help="where the batch worker's time goes with 8 callers (a stack sampler)")
    )
    f.add_argument("--steps", default="graphs-fitted", help="one mode, as run's --steps")
    f.add_argument("--requests", type=int, default=192)
    _measuring(
        sub.add_parser("first", help="a fresh pool's first batches, graphs captured at load or not (on the GPU)"),
        models=True,
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    steps = [m for m in getattr(args, "steps", "").split(",") if m]
    wrong = [m for m in steps if m not in STEPS]
    if args.step in ("run", "seed001", "profile") and (wrong or not steps):
        p.error(f"--steps: {', '.join(wrong) or 'none given'} (known: {', '.join(STEPS)})")
    if args.step == "profile":
        if len(steps) != 1:
            p.error(f"--steps: one mode to profile, not {len(steps)}")
        print(profile(args.pack, args.out, args.work, args.model, args.dtype, args.device, steps[0], args.requests))
        return 0
    if args.step == "seed001":
        seed001(args.pack, args.out, args.work, args.model, args.dtype, args.device, steps, args.seconds, args.load)
        return 0
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        p.error(f"--models: unknown {', '.join(unknown)} (known: {', '.join(MODELS)})")
    if args.step == "first":
        first_batches(args.pack, args.out, args.work, models, args.dtype, args.device)
        return 0
    one, eight = (int(x) for x in args.requests.split(","))
    dtypes = [d for d in args.dtypes.split(",") if d]
    run(args.pack, args.out, args.work, models, dtypes, {1: one, 8: eight}, args.device, steps, args.transformers)
    return 0


if __name__ == "__main__":
    sys.exit(main())

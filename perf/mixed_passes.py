"""A prompt arriving beside decoding rows, with and without mixed passes: ``python -m perf mixed-passes``.

The engine runs ``--checkpoint`` on ``runtime: torch`` (which packs passes). ``--rows`` rows
decode long answers; once they have, a prompt of ``--prompt-tokens`` tokens arrives at priority
1, prefilled in chunks of ``--budget``. With mixed passes (``packed_passes`` on) each chunk rides
in the rows' decode pass; without, chunks and decode steps alternate, each a pass of its own.
Measured per arm, interleaved ``--repeats`` times: the prompt's time to its first token, the
decoding rows' tokens meanwhile, and their longest gap between two tokens. The engine is stepped
in this process (no server), so the figures are the engine's and the model's alone.

Writes ``mixed_passes.json`` and ``mixed_passes.md`` to ``--out``.

    python -m perf mixed-passes --checkpoint build/large-model --out build/mixed-passes/large
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from perf.machine import machine
from perf.markdown import table

ARMS = {"mixed passes": True, "passes apart": False}


class _Sink:
    def __init__(self):
        self.times: list[float] = []
        self.result = None

    def emit(self, ids, logprobs=None):
        self.times += [time.perf_counter()] * len(ids)

    def finish(self, result):
        self.result = result

    def fail(self, error):
        raise error

    def cancelled(self):
        return False


def arrival(decoder, rows: int, prompt_tokens: int, budget: int, pack: bool, seed: int) -> dict:
    """One run: ``rows`` rows decode, a ``prompt_tokens`` prompt arrives, stepped until its first token."""
    from switchboard.engine.scheduler import Engine, GenerationRequest

    rng = np.random.default_rng(seed)
    vocab = decoder.manifest.vocab_size
    engine = Engine(decoder, max_batch=rows + 1, max_waiting=4, stop_ids=set(), prefill_budget=budget, pack=pack)
    decoding = [_Sink() for _ in range(rows)]
    for sink in decoding:
        engine.submit(GenerationRequest(rng.integers(5, vocab, 24).tolist(), 400), sink)
    while any(len(s.times) < 4 for s in decoding):  # all prefilled and decoding
        engine.step()
    arrived = _Sink()
    t0 = time.perf_counter()
    engine.submit(GenerationRequest(rng.integers(5, vocab, prompt_tokens).tolist(), 1, priority=1), arrived)
    while not arrived.times:
        engine.step()
    t1 = arrived.times[0]
    meanwhile = [[t for t in s.times if t0 <= t <= t1] for s in decoding]
    gaps = [b - a for s in decoding for a, b in zip(s.times, s.times[1:]) if b >= t0 and a <= t1]
    return {
        "ttft_ms": (t1 - t0) * 1000,
        "tokens_meanwhile": sum(len(m) for m in meanwhile) / rows,
        "longest_gap_ms": max(gaps, default=0.0) * 1000,
    }


def manifest(checkpoint: Path, artifacts: Path | None):
    """The export's manifest; without one, the checkpoint's geometry (all the engine reads here)."""
    from transformers import AutoConfig

    from switchboard.artifact.geometry import geometry
    from switchboard.artifact.manifest import Manifest

    if artifacts is not None:
        return Manifest.load(artifacts)
    geo = geometry(AutoConfig.from_pretrained(checkpoint))
    return Manifest(
        name=checkpoint.name, fingerprint="-", num_layers=geo.num_layers, num_kv_heads=geo.num_kv_heads,
        head_dim=geo.head_dim, vocab_size=geo.vocab_size, context_window=geo.context_window,
        eos_token_ids=[], end_of_turn_id=0, system_prompt=None,
    )  # fmt: skip


def measure(args) -> dict:
    from switchboard.engine.torch_runtime import TorchDecoder

    decoder = TorchDecoder(args.checkpoint, manifest(args.checkpoint, args.artifacts), "cpu", threads=args.threads)
    runs: dict[str, list[dict]] = {name: [] for name in ARMS}
    for pack in ARMS.values():  # warm both paths
        arrival(decoder, args.rows, args.prompt_tokens, args.budget, pack, seed=0)
    for i in range(args.repeats):
        for name, pack in ARMS.items():
            runs[name].append(arrival(decoder, args.rows, args.prompt_tokens, args.budget, pack, seed=i + 1))
    arms = {
        name: {key: round(statistics.median(r[key] for r in results), 2) for key in results[0]}
        for name, results in runs.items()
    }
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"}
    return {"settings": settings, "machine": machine(), "arms": arms}


def report_md(results: dict) -> str:
    s = results["settings"]
    rows = [
        [name, f"{a['ttft_ms']:.1f}", f"{a['tokens_meanwhile']:.1f}", f"{a['longest_gap_ms']:.1f}"]
        for name, a in results["arms"].items()
    ]
    head = ["arm", "prompt's first token, ms", "tokens a decoding row got meanwhile", "longest gap, ms"]
    return (
        f"# A {s['prompt_tokens']}-token prompt beside {s['rows']} decoding rows\n\n"
        f"`{s['checkpoint']}` on runtime torch (CPU, {s['threads']} threads), chunks of {s['budget']}, "
        f"medians of {s['repeats']} runs interleaved.\n\n" + table(head, rows) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf mixed-passes", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=Path("build/default-model"), help="a Hugging Face checkpoint")
    p.add_argument("--artifacts", type=Path, help="its export, for the manifest (default: the checkpoint's geometry)")
    p.add_argument("--out", type=Path, default=Path("build/mixed-passes"), help="where the report goes")
    p.add_argument("--rows", type=int, default=7, help="rows decoding when the prompt arrives (default 7)")
    p.add_argument("--prompt-tokens", type=int, default=256, help="the arriving prompt's tokens (default 256)")
    p.add_argument("--budget", type=int, default=64, help="prompt tokens a pass prefills (default 64)")
    p.add_argument("--repeats", type=int, default=7, help="runs of each arm (default 7)")
    p.add_argument("--threads", type=int, default=2, help="PyTorch threads (default 2)")
    args = p.parse_args(argv)
    if args.rows < 1 or args.prompt_tokens < 1 or args.budget < 1 or args.repeats < 1:
        p.error("--rows, --prompt-tokens, --budget and --repeats must be at least 1")
    if not (args.checkpoint / "config.json").is_file():
        p.error(f"{args.checkpoint}: not a Hugging Face checkpoint (no config.json): make model")
    results = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mixed_passes.json").write_text(json.dumps(results, indent=2) + "\n")
    report = report_md(results)
    (args.out / "mixed_passes.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

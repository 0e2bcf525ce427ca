"""The benchmark suite's one entry: ``python -m perf <suite> [options]`` from the repository's
root (``python -m perf <suite> --help`` for a suite's options; ``make bench SUITE=<suite>``).

Each suite is a module of perf/ with a ``main(argv)``; this table names them and hands the rest
of the command line over. Modules the suites start as processes of their own (the peers'
servers, the Locust file) are not suites and are not listed.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# suite -> (module of perf/, what it measures)
SUITES = {
    # text chat
    "chat": ("bench", "side by side: Switchboard vs baseline, LitServe, HF generate, llama.cpp, vLLM (make bench)"),
    "aiperf": ("aiperf_bench", "NVIDIA AIPerf against the gateway and llama-server: goodput, TTFT, ITL"),
    "analyzer": ("analyzer", "perf_analyzer against chat with corpus questions (make perf)"),
    "driver": ("driver", "session-aware multi-turn load driver against a running server"),
    "report": ("report", "the report of a chat benchmark directory"),
    "workload": ("workload", "customer-service traffic as files"),
    "long-prompt": ("long_prompt", "does a long prompt freeze the chats already decoding?"),
    "kv": ("kv", "KV reuse, measured"),
    "scaling": ("scaling", "served tokens/s against concurrency, next to the bare runtime"),
    "json-finish": ("json_finish", "JSON that always parses, and repetition control, on an exported model"),
    "gateway-cost": ("gateway_cost", "what the HTTP gateway costs against gRPC under the same load"),
    "trace-cost": ("trace_cost", "what traces cost: the same load at 0% and 100% sampling"),
    "gguf-check": ("gguf_check", "a GGUF import against llama.cpp on the same file"),
    "prefill-cost": (
        "prefill_cost",
        "a prompt token's prefill cost against a decoded token's, with ONNX Runtime's profile",
    ),
    "packed-cost": ("packed_cost", "a packed pass against the padded pass and a pass per new length"),
    "mixed-passes": ("mixed_passes", "a prompt arriving beside decoding rows, chunks mixed into their pass or not"),
    "drafts": ("drafts", "speculative decoding's drafts on held-out answers, beside arctic-inference's suffix tree"),
    "llamacpp": ("llamacpp", "llama.cpp's server as a peer: build, convert, serve"),
    # speech
    "asr": ("asr_bench", "speech side by side: served pool vs faster-whisper vs LitServe (make bench-asr)"),
    "asr-report": ("asr_report", "the speech suite's report from its results.json"),
    "asr-voices": ("asr_voices", "which voices a recognizer hears (make bench-asr-voices)"),
    "asr-gpu": ("asr_gpu", "the recognizer in process on an NVIDIA GPU (make bench-asr-gpu)"),
    "asr-gpu-served": ("asr_gpu_served", "the asr pool served by tritonserver on a GPU machine"),
    "voice-gpu-served": ("voice_gpu_served", "voice to first answer token served on a GPU machine"),
    "voice-ready": ("voice_ready", "how long after chat the voice channel is ready"),
    # the stack
    "chaos": ("chaos", "faults, an overload burst and an audio burst against a private stack (make chaos)"),
    "soak": ("soak", "10 minutes of multi-turn load: memory flat, sessions expire (make soak)"),
    "cold-start": ("cold_start", "cold start to first answer, started as a Kubernetes pod starts"),
    "dashboard": ("dashboard_run", "the Grafana dashboard's panels drawn from a real run (docs/dashboard.png)"),
}


def parser() -> argparse.ArgumentParser:
    width = max(map(len, SUITES))
    listing = "\n".join(f"  {name:<{width}}  {about}" for name, (_, about) in SUITES.items())
    p = argparse.ArgumentParser(
        prog="python -m perf",
        description=__doc__.split("\n\n")[0],
        epilog=f"suites:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("suite", choices=SUITES, metavar="suite", help="one of the suites below")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the suite's own options")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    module, _ = SUITES[args.suite]
    return importlib.import_module(f"perf.{module}").main(args.args)


if __name__ == "__main__":
    sys.exit(main())

"""Render the Triton model repository for a target: ``python -m switchboard.repository.render``.

Targets:
- ``local``: this machine's tritonserver (pytriton build, Python backend only): the pools run
  the ONNX graph in-process with ONNX Runtime. This is the committed ``model_repository/``.
- ``ngc-onnxruntime``: NVIDIA's Triton container: the graph is served by the native
  ``onnxruntime`` backend on the GPU as ``decoder``; the pools keep scheduling and batching
  and call it over BLS for every prefill and decode step.
- ``ngc-tensorrt``: the same with a TensorRT engine (``tensorrt_plan``) as ``decoder``: one
  engine, so one copy of the weights on the GPU, with an optimization profile per pool whose
  shape ranges match that pool (see ``export.tensorrt``); its one instance holds both profiles
  and Triton runs each step on the profile that fits it.

Every config is generated here, so a test can compare each rendering with what it should be.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from switchboard import paths
from switchboard.artifact.manifest import Manifest
from switchboard.repository.config import AsrConfig, ChatConfig, EngineConfig, VoiceChatConfig
from switchboard.repository.install import place_artifacts
from switchboard.repository.models import GLUE, LONG_PROMPT_TOKENS, POOLS, SPEECH, Pool

TARGETS = ("local", "ngc-onnxruntime", "ngc-tensorrt")


def _params(items: list[tuple[str, str, str]]) -> str:
    """The ``parameters`` block, each parameter under its doc (switchboard/repository/config.py)."""
    entries = []
    for key, value, doc in items:
        comment = "\n".join("  # " + line for line in textwrap.wrap(doc, 94))
        entries.append(f'{comment}\n  {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    body = ",\n".join(entries)
    return (
        "# Every parameter can be overridden with SWITCHBOARD_<KEY> in the server's environment\n"
        f"# (docs/configuration-reference.md).\nparameters [\n{body}\n]\n"
    )


# The speech models' queue: two priority levels (1 = live/VIP never waits behind 2), requests
# taken at once (no delay to fill a batch), refused when it is full or after 30 s; one instance.
PRIORITY_QUEUE = """dynamic_batching {
  max_queue_delay_microseconds: 0
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 30000000
    allow_timeout_override: true
    max_queue_size: 256
  }
}

instance_group [ { kind: KIND_CPU count: 1 } ]

"""


def chat_config() -> str:
    return """# Public entry model: streaming (decoupled) customer-service chat.
# Orchestrates prompt building, the Redis session lookup, length-aware routing to a pool,
# detokenization and the session write-back (switchboard/triton/chat_model.py).
name: "chat"
backend: "python"
# One request per execute; execute only validates and hands the chat to the model's own
# admission (switchboard/serving/admission.py), which can still answer from the FAQ when overloaded.
max_batch_size: 1
model_transaction_policy { decoupled: true }

input [
  { name: "text" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "session_id" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "max_new_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "history" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "response_format" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "logprobs" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "tools" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "tool_choice" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "tool_results" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "presence_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "frequency_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "stats" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "logprobs" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "tool_calls" data_type: TYPE_STRING dims: [ 1 ] }
]

# No dynamic_batching, on purpose: Triton 2.51's batcher wakes for a new request only while an
# instance is free, and a request that arrived while this one instance ran execute waited out the
# batcher's 500 ms idle timeout (docs/benchmarks.md, "Time to first token under AIPerf"). Without
# it requests go straight to the instance, in arrival order. Priority 1 = live/VIP, 2 = default:
# chats wait in chat's admission queue (by priority, at most max_queue_wait_s, then the FAQ
# answers) and in the pools' engines (by the carried priority); a priority-2 chat held back while
# max_pending chats wait is refused after queue_timeout_s.
instance_group [ { kind: KIND_CPU count: 1 } ]

""" + _params(ChatConfig(long_prompt_tokens=LONG_PROMPT_TOKENS).parameters())


def asr_config() -> str:
    return (
        """# The speech recognizer: an exported Whisper (encoder + decoder with a KV cache, ONNX Runtime
# in-process), batched by audio length (switchboard/asr/service.py, switchboard/triton/asr_model.py).
# Loaded once its artifacts are installed (`make serve` builds the default recognizer in the
# background, then loads this model and voice_chat; until then both answer UNAVAILABLE).
name: "asr"
backend: "python"
# Triton's batcher hands execute what arrived; execute decodes nothing itself and returns. The
# model's own batcher groups the audio by length (parameters below).
max_batch_size: 8
model_transaction_policy { decoupled: true }

input [
  { name: "audio" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "language" data_type: TYPE_STRING dims: [ 1 ] optional: true }
]
output [
  { name: "text" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "result" data_type: TYPE_STRING dims: [ 1 ] }
]

# Priority 1 = live/VIP, 2 = default, as for chat (the request parameter chat_priority carries it
# to the model's batcher, which never makes priority 1 wait behind priority 2).
"""
        + PRIORITY_QUEUE
        + _params(AsrConfig().parameters())
    )


def voice_chat_config() -> str:
    return (
        """# Voice in, the chat's answer out: the audio through asr, the transcript through chat (with the
# session's history and priority), both over this server's gRPC (switchboard/triton/voice_chat_model.py).
name: "voice_chat"
backend: "python"
max_batch_size: 1
model_transaction_policy { decoupled: true }

input [
  { name: "audio" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "language" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "session_id" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "max_new_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "history" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "presence_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "frequency_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "stats" data_type: TYPE_STRING dims: [ 1 ] }
]

"""
        + PRIORITY_QUEUE
        + _params(VoiceChatConfig().parameters())
    )


def engine_config(pool: Pool, runtime: str) -> str:
    where = (
        "runs the ONNX graph in-process with ONNX Runtime"
        if runtime == "onnxruntime"
        else f"calls the native model `{runtime.split(':', 1)[1]}` over BLS for every step"
    )
    return f"""# Generation pool for {pool.name} prompts. {pool.blurb}
# The engine batches at iteration level (switchboard/engine/scheduler.py, max_batch below)
# and {where}.
# Requests from chat arrive over gRPC on this server (switchboard/serving/engine_client.py) with
# the parameter chat_priority, which the engine's scheduler orders its batch by. No
# dynamic_batching: on Triton 2.51 it held a request that arrived while execute ran for its
# 500 ms idle timeout (chat/config.pbtxt); execute only hands requests to the engine. The pool owns the
# KV cache: content-addressed blocks in its own memory, then in Redis (switchboard/kv).
name: "engine_{pool.name}"
backend: "python"
max_batch_size: {pool.max_batch_size}
model_transaction_policy {{ decoupled: true }}
# The versions served: the stable one and, during a rollout, the canary (`make rollout` rewrites
# this line, switchboard/ops/rollout.py; chat/config.pbtxt says which version is which).
version_policy: {{ specific {{ versions: [ 1 ] }} }}

input [
  {{ name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] allow_ragged_batch: true }},
  {{ name: "max_new_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "presence_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "frequency_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true }}
]
output [
  {{ name: "token_ids" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "stats" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "logprobs" data_type: TYPE_STRING dims: [ 1 ] }}
]

instance_group [ {{ kind: KIND_CPU count: 1 }} ]

""" + _params(EngineConfig(max_batch=pool.engine_batch, runtime=runtime).parameters())


def decoder_config(name: str, manifest, platform: str, filename: str, profiles: int = 0) -> str:
    m = manifest
    io_in = [
        ("input_ids", "TYPE_INT64", "[ -1, -1 ]"),
        ("attention_mask", "TYPE_INT64", "[ -1, -1 ]"),
        ("position_ids", "TYPE_INT64", "[ -1, -1 ]"),
    ]
    io_out = [("logits", "TYPE_FP32", f"[ -1, -1, {m.vocab_size} ]")]
    kv = f"[ -1, {m.num_kv_heads}, -1, {m.head_dim} ]"
    for i in range(m.num_layers):
        io_in += [(f"past_key_values.{i}.key", "TYPE_FP32", kv), (f"past_key_values.{i}.value", "TYPE_FP32", kv)]
        io_out += [(f"present.{i}.key", "TYPE_FP32", kv), (f"present.{i}.value", "TYPE_FP32", kv)]

    def block(items):
        return ",\n".join(f'  {{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in items)

    backend = 'backend: "onnxruntime"' if platform == "onnxruntime" else 'platform: "tensorrt_plan"'
    if profiles:  # one engine, one instance holding every pool's profile: one copy of the weights
        listed = ", ".join(f'"{i}"' for i in range(profiles))
        instances = (
            "# One instance, every pool's optimization profile: the backend runs each step on the\n"
            "# profile that fits its shapes best.\n"
            f"instance_group [ {{ kind: KIND_GPU count: 1 profile: [ {listed} ] }} ]"
        )
    else:
        instances = "instance_group [ { kind: KIND_GPU count: 1 } ]"
    return f'''# The decoder graph ({m.name}, fingerprint {m.fingerprint}) on the GPU, served by Triton's
# native {platform} backend. Called over BLS by the engine pools, which own batching and the
# KV cache; no batcher here (max_batch_size 0: the batch dimension is explicit).
name: "{name}"
{backend}
default_model_filename: "{filename}"
max_batch_size: 0

input [
{block(io_in)}
]
output [
{block(io_out)}
]

{instances}
'''


def render(target: str, out: Path, manifest=None, artifacts: Path | None = None) -> list[Path]:
    """Write config.pbtxt and model.py files for ``target`` under ``out``; with ``artifacts``,
    also place the model files (hard links where possible)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; choose from {', '.join(TARGETS)}")
    files: dict[str, str] = {
        "chat/config.pbtxt": chat_config(),
        "asr/config.pbtxt": asr_config(),
        "voice_chat/config.pbtxt": voice_chat_config(),
    }
    for pool in POOLS:
        runtime = {
            "local": "onnxruntime",
            "ngc-onnxruntime": "triton:decoder",
            "ngc-tensorrt": "triton:decoder",
        }[target]
        files[f"{pool.model}/config.pbtxt"] = engine_config(pool, runtime)
    if target != "local":
        if manifest is None:
            raise ValueError(f"target {target} needs the manifest (--artifacts)")
        if target == "ngc-onnxruntime":
            files["decoder/config.pbtxt"] = decoder_config("decoder", manifest, "onnxruntime", "model.onnx")
        else:
            files["decoder/config.pbtxt"] = decoder_config(
                "decoder", manifest, "tensorrt_plan", "model.plan", profiles=len(POOLS)
            )
    written = []
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
        model = path.parent.name
        version = path.parent / "1"
        version.mkdir(exist_ok=True)
        if not model.startswith("decoder"):
            glue = GLUE.get(model, "engine_model")
            (version / "model.py").write_text(
                f'"""Triton entry point: the logic lives in switchboard.triton.{glue}."""\n\n'
                f"from switchboard.triton.{glue} import TritonPythonModel  # noqa: F401\n"
            )
        if artifacts is not None and model not in SPEECH:  # the recognizer has its own (install.install_asr)
            place_artifacts(artifacts, version, model, target)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.repository.render", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=TARGETS, default="local")
    p.add_argument(
        "--out",
        type=Path,
        help="repository to write (default: model_repository for local, build/repos/<target> otherwise)",
    )
    p.add_argument("--artifacts", type=Path, help="exported artifacts to place into the repository")
    args = p.parse_args(argv)
    out = args.out or (paths.MODEL_REPOSITORY if args.target == "local" else paths.BUILD / "repos" / args.target)
    manifest = None
    if args.artifacts:
        manifest = Manifest.load(args.artifacts)
    for path in render(args.target, out, manifest, args.artifacts):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

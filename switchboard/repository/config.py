"""The models' configuration, typed, with one set of defaults: the ``parameters`` of
``chat/config.pbtxt``, ``engine_*/config.pbtxt``, ``asr/config.pbtxt`` and
``voice_chat/config.pbtxt``, read once when a model loads.

Each field is a parameter: its default here is what ``render`` writes into the
repository and what applies when the parameter is missing; its doc is the comment above it in
the rendered ``config.pbtxt`` and its line in docs/configuration-reference.md
(``python -m switchboard.repository.config`` writes that file; a test checks it is current).
``SWITCHBOARD_<KEY>`` in the server's environment overrides any of them (``Params``).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from switchboard import paths
from switchboard.repository.params import ConfigError, Params


def setting(default, doc: str, lo=None, hi=None):
    return field(default=default, metadata={"doc": doc, "lo": lo, "hi": hi})


def _read(params: Params, f: dataclasses.Field):
    lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
    kind = type(f.default)
    if kind is bool:
        return params.bool(f.name, f.default)
    if kind is int:
        return params.int(f.name, f.default, lo, hi)
    if kind is float:
        return params.float(f.name, f.default, lo, hi)
    return params.str(f.name, f.default)


class _Config:
    @classmethod
    def load(cls, model_config: dict, source: str):
        """Every field from the model's parameters (or the environment), checked: a bad value
        fails the model's load with a message naming the file and the parameter."""
        params = Params(model_config, source)
        return cls(**{f.name: _read(params, f) for f in dataclasses.fields(cls)})

    def parameters(self) -> list[tuple[str, str, str]]:
        """(key, value as config.pbtxt writes it, doc) for every field."""
        out = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            text = (
                ("true" if value else "false")
                if isinstance(value, bool)
                else ""
                if value is None
                else f"{value:g}"
                if isinstance(value, float)
                else str(value)
            )
            out.append((f.name, text, f.metadata["doc"]))
        return out


@dataclass(frozen=True)
class _RedisConfig(_Config):
    """Redis, shared by ``chat`` (conversations) and the pools (KV blocks)."""

    redis_url: str = setting(
        "redis://127.0.0.1:6379/0", "sessions and KV blocks (rediss:// for TLS; with redis_cluster, any node)"
    )
    redis_cluster: bool = setting(False, "redis_url is a Redis Cluster node (every key's slot from its hash tag)")
    session_ttl_s: int = setting(3600, "a session (and a KV block) expires this long after its last use", 1)
    redis_timeout_s: float = setting(
        0.25, "bound on each Redis call; a slow Redis means an answer without reuse", 0.001, 30.0
    )
    session_secret: str = setting(
        "", "key of the sessions' and KV blocks' integrity digests (empty: a digest without a key)"
    )
    redis_tls_ca_file: str = setting(
        "", "with a rediss:// redis_url: the CA that signs Redis's certificate (empty: system CAs)"
    )
    redis_tls_cert_file: str = setting("", "client certificate, where Redis requires one")
    redis_tls_key_file: str = setting("", "the client certificate's key")

    def redis_tls(self) -> dict:
        """redis-py's TLS arguments (none for redis://; TLS files without rediss:// fail)."""
        from switchboard.redis_conn import tls_arguments

        return tls_arguments(self.redis_url, self.redis_tls_ca_file, self.redis_tls_cert_file, self.redis_tls_key_file)


@dataclass(frozen=True)
class ChatConfig(_RedisConfig):
    """``chat``: sessions, routing, admission, fallback."""

    engine_url: str = setting(
        "127.0.0.1:8001",
        "this server's gRPC endpoint, where chat streams from the pools (not BLS: "
        "switchboard/serving/engine_client.py says why); `make serve` and the tests set it to their port",
    )
    kv_reuse: bool = setting(
        True, "the pools reuse stored KV blocks for the prompt's stored prefix and store the new ones"
    )
    max_turns: int = setting(6, "user turns kept in the prompt (older ones are dropped first)", 1, 64)
    system_prompt: str = setting("", "the system prompt (empty: the one in the model's manifest)")
    long_prompt_tokens: int = setting(
        160, "prompts with more tokens than this to compute (past what the session stored) go to the long pool", 1
    )
    short_pool: str = setting("engine_short", "the pool for short prompts")
    long_pool: str = setting("engine_long", "the pool for long prompts")
    stable_version: int = setting(
        1, "the pools' model version that serves every chat but the canary's share (`make rollout` sets it)", 1
    )
    canary_version: int = setting(
        0, "a new version of the pools' model on trial with canary_share of the sessions (0: none)", 0
    )
    canary_share: float = setting(
        0.1, "the share of sessions (by a hash of the session id: sticky) served by canary_version", 0.0, 1.0
    )
    max_inflight: int = setting(
        0,
        "chats generating at once; the others wait in chat's admission queue. 0: automatic, 64 for a model "
        "under 256 MB; for a compute-bound one (256 MB or more on the CPU) the pools' rows (max_batch) and a "
        "third more, since a chat beyond that waits in a pool, where it is not forecast and answered from the "
        "FAQ at once but held until engine_first_token_s",
        0,
        1024,
    )
    max_inflight_reserved: int = setting(
        -1, "of max_inflight, the slots only priority 1 may take (-1: a quarter of max_inflight)", -1, 1024
    )
    max_pending: int = setting(
        1024,
        "chats waiting for a slot or for their FAQ answer; beyond it priority 2 waits in Triton's queue",
        0,
        1 << 20,
    )
    max_queue_wait_s: float = setting(5.0, "a chat waiting longer for a slot is answered from the FAQ", 0.0, 600.0)
    queue_timeout_s: float = setting(
        10.0,
        "a priority-2 chat held back this long while max_pending chats wait is refused UNAVAILABLE (well inside "
        "a client's 30 s)",
        0.1,
        600.0,
    )
    shed_on_forecast: bool = setting(
        True,
        "a priority-2 chat that would wait out max_queue_wait_s (the chats ahead of it, at the rate slots "
        "free up) gets the FAQ answer on arrival, or as soon as the forecast, made again every 0.1 s, says so",
    )
    breaker_ttft_p99_s: float = setting(
        0.0,
        "latency circuit breaker: while the P99 time to first token of the last breaker_window_s is over this, "
        "new priority-2 chats get the FAQ answer at once (0: off; seed 001 used 1.5)",
        0.0,
        600.0,
    )
    breaker_window_s: float = setting(30.0, "the breaker's window of recent chats", 1.0, 3600.0)
    breaker_min_samples: int = setting(20, "the breaker judges only a window of at least this many chats", 1, 100000)
    shed_workers: int = setting(
        8, "threads answering from the FAQ; each answer is a round trip to the server (docs/reliability.md)", 1, 256
    )
    shed_nice: int = setting(
        19,
        "the FAQ answer threads run this many nice levels below the server (Linux), leaving cores to priority 1",
        0,
        19,
    )
    cancel_poll_ms: float = setting(
        50.0, "how often a generating chat asks whether its client left (each ask is a round trip)", 0.0, 10000.0
    )
    engine_first_token_s: float = setting(
        10.0, "a pool's first response must come within this (queue and prefill)", 0.1, 600.0
    )
    engine_stall_s: float = setting(10.0, "and each next one within this", 0.1, 600.0)
    pool_retry_after_s: float = setting(
        30.0,
        "a pool whose stub process died is routed around this long (Triton 2.51 never restarts the stub: "
        "the supervisor reloads that model)",
        0.1,
        3600.0,
    )
    pool_probe_after_s: float = setting(
        1.0,
        "a stream quiet this long makes chat ping its pool (one ping at a time); a dead stub ends every chat "
        "on that pool at once instead of after engine_stall_s (0: no pings)",
        0.0,
        600.0,
    )
    fallback: bool = setting(True, "answer from the FAQ when no pool can (overload, timeouts, failures)")
    fallback_faq: str = setting("faq.jsonl", "the FAQ, in the model's version folder (make export installs it)")
    default_max_new_tokens: int = setting(96, "max_new_tokens when the request does not say", 1, 4096)
    max_new_tokens_limit: int = setting(512, "the most max_new_tokens a request may ask for", 1, 8192)
    precision: str = setting("fp32", "the exported variant whose fingerprint keys the sessions (as the pools')")


@dataclass(frozen=True)
class AsrConfig(_Config):
    """``asr``: the speech recognizer pool (switchboard/asr/service.py)."""

    precision: str = setting("fp32", "the exported variant the pool runs (fp32, int8-dynamic)")
    batching: str = setting(
        "length",
        "length: batches of similar audio lengths under batch_audio_s (seed 001: a short question never waits "
        "for a long recording); count: first come, first served, max_batch or max_wait_ms (Triton's own "
        "dynamic batcher's rule, for comparison)",
    )
    max_batch: int = setting(8, "chunks of audio decoded together", 1, 64)
    batch_audio_s: float = setting(
        0.0,
        "the most seconds of audio in one batch (a longer chunk runs alone); a model that pads every chunk to a "
        "window counts each row as its batch's window (see windows), what its encoder does; 0: automatic, 60 on a "
        "CPU (Whisper's 30 s: 2 chunks a batch, 6 in 10 s windows) and max_batch windows on a GPU (runtime "
        "torch), where they cost little more than one",
        0.0,
    )
    max_length_ratio: float = setting(
        0.0,
        "with batching length: the longest chunk of a batch at most this many times its shortest; 0: 2 for a "
        "model that takes audio of any length, none for one that pads every chunk to a fixed window (the padding "
        "costs the same whatever the mix, and each row leaves the batch when its text ends)",
        0.0,
    )
    max_wait_ms: float = setting(
        10.0,
        "how long a batch waits to fill before it runs, with batching length while requests come in company (the "
        "last batch held more than one, or left some queued): a request alone runs at once",
        0.0,
        10_000.0,
    )
    wait_alone: bool = setting(
        False, "with batching length: hold a request alone for max_wait_ms too (Triton's dynamic batcher's rule)"
    )
    long_audio_s: float = setting(
        15.0,
        "with batching length: a request with more audio than this is long; its chunks wait while questions do, "
        "but one that has waited 2 s gets every long_every-th batch (seed 001: long audio as if in its own pool)",
        1.0,
    )
    long_every: int = setting(
        3, "with batching length: long audio's share of batches under load, one in this many at least", 1, 100
    )
    chunk_s: float = setting(
        15.0, "audio longer than this is cut at silences into chunks of at most this (streamed in order)", 1.0, 30.0
    )
    windows: str = setting(
        "fitted",
        "for a model whose encoder reads a fixed window (a pretrained Whisper's 30 s): fitted (each chunk padded "
        "to the shortest of 10, 15 or 20 s that leaves 7 s after its audio, else the whole window: a 3 s question "
        "costs the encoder a third) or whole (always the whole window, as Whisper and faster-whisper do)",
    )
    max_audio_s: float = setting(600.0, "longer audio is refused (the gateway answers 413)", 1.0)
    max_pending_s: float = setting(
        1800.0, "seconds of audio waiting or being transcribed; beyond it requests are refused UNAVAILABLE", 1.0
    )
    breaker_p99_s: float = setting(
        0.0,
        "latency circuit breaker (seed 001): while the P99 of short requests' times (at most long_audio_s of "
        "audio, arrival to transcript) over the last breaker_window_s is over this, new priority-2 requests are "
        "refused UNAVAILABLE (0: off; seed 001 used 1.5)",
        0.0,
        600.0,
    )
    breaker_window_s: float = setting(30.0, "the breaker's window of recent short requests", 1.0, 3600.0)
    breaker_min_samples: int = setting(
        20, "the breaker judges only a window of at least this many short requests", 1, 100000
    )
    join_running: bool = setting(
        True,
        "with runtime torch (torch_steps graphs or static): a queued chunk joins a running batch in a row one that "
        "ended left free (in-flight batching), rather than waiting for the batch's last row; false: whole batches",
    )
    workers: int = setting(
        1, "batches run at once (each on the runtime's threads): 2 lets a short batch overtake a long one", 1, 8
    )
    threads: int = setting(
        0,
        "ONNX Runtime threads per batch; 0: automatic, one per core this process may use for a model whose "
        "encoder does 1 GFLOP or more a window (tiny.en: 28), 1 for a smaller one (the embedded default: 0.15), "
        "where the threads' handoffs cost more than they split (docs/benchmarks.md)",
        0,
        256,
    )
    runtime: str = setting(
        "onnx",
        "onnx: the exported graphs on ONNX Runtime (precision, threads); torch: the checkpoint they were exported "
        "from (asr.json's source) in PyTorch on `device`, the same modules as the graphs: the GPU path where ONNX "
        "Runtime has no CUDA provider (docs/voice.md)",
    )
    device: str = setting("cuda", "with runtime torch: cpu, cuda or cuda:N")
    torch_dtype: str = setting(
        "auto", "with runtime torch: float16, bfloat16 or float32; auto: float16 on a GPU, float32 on the CPU"
    )
    torch_steps: str = setting(
        "auto",
        "with runtime torch: graphs (each decoding step one replayed CUDA graph over a fixed-size cache: the "
        "GPU default), growing (each step's kernels launched one by one, the cache growing: the CPU default) or "
        "static (the graphs' cache without the graphs); auto picks",
    )
    cancel_poll_ms: int = setting(50, "how often a transcription asks whether its client left", 1, 10_000)

    def fitted_windows(self) -> bool:
        """Whether a fixed-window model's chunks are padded to windows fitted to them
        (``windows``); ConfigError names a choice that is not one."""
        if self.windows not in ("fitted", "whole"):
            raise ConfigError(f"asr/config.pbtxt: parameter 'windows' = {self.windows!r}: expected fitted or whole")
        return self.windows == "fitted"


@dataclass(frozen=True)
class VoiceChatConfig(_Config):
    """``voice_chat``: audio in, the transcript through ``asr``, then ``chat``'s streamed answer."""

    engine_url: str = setting(
        "127.0.0.1:8001",
        "this server's gRPC endpoint, where voice_chat streams from asr and chat; `make serve` and the tests set "
        "it to their port",
    )
    asr_model: str = setting("asr", "the recognizer")
    chat_model: str = setting("chat", "the chat that answers the transcript")
    asr_timeout_s: float = setting(60.0, "the transcript must come within this", 0.1)
    max_inflight: int = setting(64, "voice chats handled at once; the rest wait in Triton's queue", 1, 4096)


def pool_config(repository: Path, pool: str) -> "EngineConfig":
    """A pool's settings as its own load reads them: ``<repository>/<pool>/config.pbtxt`` and the
    environment's overrides. A missing or bad file is an error naming it."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    path = Path(repository) / pool / "config.pbtxt"
    try:
        message = text_format.Parse(path.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())
    except (OSError, text_format.ParseError) as e:
        raise ValueError(f"{path}: {e}") from None
    config = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return EngineConfig.load(config, f"{pool}/config.pbtxt")


def admission_slots(cfg: "ChatConfig", compute_bound: bool, pool_rows: int) -> tuple[int, int]:
    """chat's ``max_inflight`` and ``max_inflight_reserved`` with their automatic values resolved."""
    inflight = cfg.max_inflight or (pool_rows + -(-pool_rows // 3) if compute_bound else 64)
    reserved = cfg.max_inflight_reserved if cfg.max_inflight_reserved >= 0 else inflight // 4
    return inflight, min(reserved, inflight - 1)


@dataclass(frozen=True)
class EngineConfig(_RedisConfig):
    """``engine_short`` / ``engine_long``: one generation pool each."""

    max_batch: int = setting(8, "rows of the running batch (iteration-level batching)", 1, 256)
    max_waiting: int = setting(64, "sequences waiting for a row; beyond it the pool refuses new ones", 1, 4096)
    priority_slots: int = setting(
        0,
        "rows of max_batch only priority 1 may take, so a VIP starts at the next step (0: off); with "
        "preempt_steps priority 1 has a batch of its own of up to max_batch rows and needs none, so priority 2 "
        "may fill all max_batch rows",
        0,
        256,
    )
    preempt_steps: int = setting(
        4,
        "priority 1 decodes in its own batch (0: one shared batch); with one lane thread, priority 2 gets one "
        "step after every preempt_steps of priority 1's",
        0,
        1 << 20,
    )
    priority_lane: str = setting(
        "auto",
        "on: priority 1 decodes in a batch of its own (preempt_steps, lane_threads); off: one batch for all "
        "priorities, priority 1 taking priority_overflow_rows past max_batch; auto: off for a compute-bound "
        "model (256 MB or more on the CPU, where every batch streams all the weights), on otherwise",
    )
    priority_overflow_rows: int = setting(
        2,
        "with one shared batch, rows past max_batch only priority 1 may take, so a VIP starts at the next step",
        0,
        256,
    )
    lane_threads: int = setting(
        2,
        "2: the two batches run on threads of their own, priority 2's normal_nice levels lower (Linux), so the "
        "OS runs priority 1 first and an idle core runs priority 2 meanwhile",
        1,
        2,
    )
    normal_nice: int = setting(19, "nice levels of priority 2's lane thread below the server", 0, 19)
    hold_back_ms: float = setting(
        100.0,
        "with lane_threads 2, a backlogged priority 2 waits while priority 1 has work, taking one step per "
        "hold_back_ms meanwhile (0: the lanes always decode side by side)",
        0.0,
        60000.0,
    )
    stream_interval_ms: float = setting(
        50.0,
        "priority-2 tokens are sent together at most this often (priority 1: one response per token)",
        0.0,
        10000.0,
    )
    cancel_poll_ms: float = setting(50.0, "how often a running sequence asks whether its client left", 0.0, 10000.0)
    prefill_budget: int = setting(
        64,
        "prompt tokens one engine step may prefill (chunked prefill): a long prompt is prefilled in chunks "
        "between the running rows' decode steps, so they keep streaming (0: whole prompts at once)",
        0,
        1 << 20,
    )
    speculation: str = setting(
        "auto",
        "speculative decoding: each row drafts tokens from its conversation and from past answers, and a decode "
        "step verifies them in one pass (answers unchanged, token for token); auto: on where the export measured "
        "it faster for this model (the manifest's 'speculation'), on, or off",
    )
    packed_passes: bool = setting(
        True,
        "where the runtime packs (runtime torch; onnxruntime where the export measured its packed graph cheaper, "
        "the manifest's 'packing'): a pass over rows of different lengths (prompts, drafts) computes their tokens "
        "only, no padding, every draft is verified whole, and prompts' chunks ride in the running rows' decode pass "
        "(false: the padded graph, padded passes, chunks between them)",
    )
    draft_tokens: int = setting(
        8, "the most tokens a row drafts for one step (its recent acceptance may pick fewer)", 1, 64
    )
    draft_answers: int = setting(
        4096, "answers this pool served that later rows may draft from (the oldest leave first; 0: none)", 0, 1 << 20
    )
    threads: int = setting(
        0,
        "ONNX Runtime (or PyTorch) threads of the pool; 0: automatic, one per core this process may use for a "
        "model of 256 MB or more (the pool uses every core while the other is idle, the OS shares them when both "
        "are busy), 1 for a smaller one, where Python and the server, not the runtime, take the cores "
        "(docs/benchmarks.md)",
        0,
        256,
    )
    weights_cache: str = setting(
        "",
        "where the pools keep the runtime's prepared weights (ONNX Runtime's pre-packed copy for this CPU), "
        "memory-mapped by both pools so the machine holds one copy; empty: build/cache/weights in the "
        "checkout, 'off': each pool prepares its own private copy",
    )
    kv_block_tokens: int = setting(16, "tokens per KV block (the unit of reuse, lookup and storage)", 1, 4096)
    kv_local_mb: int = setting(
        256,
        "the pool's own KV block cache (MiB; least recently used first, priority 1's kept longest; 0: Redis only)",
        0,
        1 << 20,
    )
    kv_storage: str = setting(
        "native", "KV blocks in Redis: native (the runtime's dtype, lossless), float16 or int8 (smaller, lossy)"
    )
    kv_zstd: bool = setting(False, "zstd-compress KV blocks in Redis")
    kv_block_ttl_s: int = setting(
        1800,
        "a KV block in Redis expires this long after its last use; shorter than session_ttl_s, so under "
        "maxmemory-policy volatile-ttl blocks are evicted before the conversations they belong to",
        1,
    )
    kv_redis: bool = setting(True, "share KV blocks through Redis (false: the pool's own cache only)")
    precision: str = setting("fp32", "the exported variant the pool runs")
    runtime: str = setting(
        "onnxruntime", "onnxruntime, torch[:cpu|cuda] (needs checkpoint), or triton:<model> (a native backend over BLS)"
    )
    checkpoint: str = setting(
        "",
        "with runtime torch: the Hugging Face checkpoint the repository was exported from (its shape is "
        "checked against the manifest; the exported graph is then neither read nor checked)",
    )

    def own_priority_lane(self, compute_bound: bool) -> bool:
        """Whether priority 1 decodes in a batch of its own (``priority_lane``); a value other
        than auto, on or off is a ValueError naming the parameter."""
        mode = self.priority_lane.strip().lower()
        if mode not in ("auto", "on", "off"):
            raise ValueError(f"parameter 'priority_lane' = {self.priority_lane!r}: expected auto, on or off")
        return mode == "on" or (mode == "auto" and not compute_bound)

    def speculates(self, verifies: bool, measured: dict) -> bool:
        """Whether the pool drafts (``speculation``): ``verifies``, the runtime returns a pass's
        every position; ``measured``, the export's measurement (the manifest's ``speculation``).
        ``on`` where the runtime cannot verify, or a value other than auto, on or off, is a
        ValueError naming the parameter."""
        mode = self.speculation.strip().lower()
        if mode not in ("auto", "on", "off"):
            raise ValueError(f"parameter 'speculation' = {self.speculation!r}: expected auto, on or off")
        if mode == "on" and not verifies:
            raise ValueError(
                f"parameter 'speculation' = on, but runtime {self.runtime!r} returns the last position's logits only "
                "(an export before logits_index, or a native backend): export again, or set it to auto"
            )
        return verifies and (mode == "on" or (mode == "auto" and bool(measured.get("enabled"))))


def reference() -> str:
    """docs/configuration-reference.md."""
    lines = [
        "# Configuration reference",
        "",
        "Generated by `python -m switchboard.repository.config` from `switchboard/repository/config.py`; a test",
        "checks it is current. Every parameter is set in the model's `config.pbtxt` (`parameters`) and",
        "can be overridden with `SWITCHBOARD_<KEY>` (upper case) in the server's environment; a bad",
        "value fails the model's load naming the file and the parameter.",
    ]
    models = (
        ("`chat`", ChatConfig),
        ("`engine_short`, `engine_long`", EngineConfig),
        ("`asr`", AsrConfig),
        ("`voice_chat`", VoiceChatConfig),
    )
    for title, cls in models:
        lines += [
            "",
            f"## {title}",
            "",
            cls.__doc__.strip().replace("``", "`"),
            "",
            "| parameter | type | default | range | meaning |",
            "|---|---|---|---|---|",
        ]
        for f, (_, value, doc) in zip(dataclasses.fields(cls), cls().parameters()):
            lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
            bounds = f"{lo} to {hi}" if lo is not None and hi is not None else f">= {lo}" if lo is not None else ""
            shown = f"`{value}`" if value else "(empty)"
            lines.append(f"| `{f.name}` | {type(f.default).__name__} | {shown} | {bounds} | {doc} |")
    return "\n".join(lines) + "\n"


REFERENCE = paths.ROOT / "docs" / "configuration-reference.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m switchboard.repository.config", description="Write docs/configuration-reference.md."
    )
    p.add_argument("--out", type=Path, default=REFERENCE, help="where to write it")
    args = p.parse_args(argv)
    args.out.write_text(reference())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

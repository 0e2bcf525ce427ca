"""An exported Whisper on ONNX Runtime: the artifact manifest (``asr.json``) and the two sessions.

``python -m switchboard.export.asr`` writes two graphs per precision:

- ``encoder.onnx``: ``input_features`` [B, n_mels, T] -> per decoder layer ``cross_key.{i}``
  [B, H, hd, T/2] and ``cross_value.{i}`` [B, H, T/2, hd]: each layer's cross-attention keys
  and values, computed once per utterance instead of at every decoding step. The keys are
  stored transposed so each step multiplies by them as they are, with no transpose (a copy of
  the whole encoder output per layer and step) in the decoder.
- ``decoder.onnx``: ``input_ids`` [B, S], ``past_key.{i}`` / ``past_value.{i}`` [B, H, P, hd]
  (P = 0 on the first step), the cross keys and values -> ``logits`` [B, V] of the last
  position only, ``present_key.{i}`` / ``present_value.{i}`` [B, H, P+S, hd].

One tensor per layer rather than stacked [L, ...] tensors: ONNX Runtime's Gather/Split copy
what they select, and picking layer i out of a stacked cross cache copied all of it on every
step. Rows of a batch decode in lockstep from prompts of one length, so the decoder needs no
attention mask.

The manifest is the contract with the serving side: what to feed (n_mels, the window), which
tokens start and end a transcript, which are suppressed, and which precision files exist and
passed the accuracy gate. This module imports neither torch nor transformers; sessions and
threads are the runtime layer's (switchboard/runtime/onnx.py).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path

import numpy as np

from switchboard.asr.features import fitted_frames, window_lengths
from switchboard.runtime import onnx

MANIFEST = "asr.json"
TOKENIZER = "tokenizer.json"

# [(key, value)] per decoder layer.
KV = list[tuple[np.ndarray, np.ndarray]]
# One window through the encoder, in floating-point operations, from which ONNX Runtime's
# threads pay: below it their handoffs cost more than they split (the embedded default, 0.15
# GFLOP, serves faster on one thread; tiny.en, 28, on every core: docs/benchmarks.md).
MANY_THREADS_FROM_FLOPS = 1e9


@dataclass(frozen=True)
class AsrManifest:
    name: str
    source: str  # the checkpoint directory it was exported from
    n_mels: int
    window_frames: int | None  # None: variable-length input; else every input is padded to it
    max_source_positions: int  # encoder positions: input frames / 2
    max_target_positions: int  # decoder positions: prompt + generated tokens
    multilingual: bool
    languages: dict[str, int | None]  # "en" -> the <|en|> token (None: English-only without one)
    special: dict[str, int]  # start, eos, notimestamps, transcribe (multilingual models)
    suppress_tokens: list[int]
    begin_suppress_tokens: list[int]
    num_layers: int  # decoder layers (one cross and one self cache each)
    num_heads: int
    head_dim: int
    vocab_size: int
    hop_length: int = 160  # samples between feature frames (preprocessor_config.json; Whisper's 10 ms)
    precisions: dict[str, dict] = field(default_factory=dict)  # name -> {encoder, decoder, accuracy...}
    left_out: dict[str, list[str]] = field(default_factory=dict)  # precision -> the gate's reasons
    gate: dict = field(default_factory=dict)  # the accuracy gate's rule and figures
    parity: dict = field(default_factory=dict)  # export-time checks against PyTorch
    bench: dict = field(default_factory=dict)  # encoder/decoder latency per precision and batch
    # Serving's choice (asr/config.pbtxt's windows: fitted), False as the export writes it: a
    # fixed-window model's input padded to a window fitted to its audio (features.fitted_frames)
    # rather than to the whole window.
    fitted_windows: bool = False

    @property
    def max_frames(self) -> int:
        """The longest input the encoder takes (its positions are half the frames)."""
        return self.window_frames or 2 * self.max_source_positions

    def input_frames(self, frames: int) -> int | None:
        """What an input of ``frames`` frames of audio is padded to: None for a model that
        takes any length (a batch is padded to its longest), else the window or, with
        ``fitted_windows``, the window fitted to the audio."""
        if self.window_frames is None:
            return None
        return fitted_frames(frames, self.window_frames, self.hop_length) if self.fitted_windows else self.window_frames

    @property
    def windows(self) -> list[int]:
        """Every length an input may be padded to, shortest first ([] for any length)."""
        if self.window_frames is None:
            return []
        return window_lengths(self.window_frames, self.hop_length) if self.fitted_windows else [self.window_frames]

    @property
    def prompt_length(self) -> int:
        return 4 if self.multilingual else 2

    def prompt(self, language_token: int | None) -> list[int]:
        """The decoder prompt: [start, lang, transcribe, notimestamps] (multilingual) or
        [start, notimestamps] (English-only)."""
        s = self.special
        if not self.multilingual:
            return [s["start"], s["notimestamps"]]
        if language_token is None:
            raise ValueError("a multilingual model's prompt needs a language token")
        return [s["start"], language_token, s["transcribe"], s["notimestamps"]]

    def files(self, precision: str) -> tuple[str, str]:
        if precision in self.left_out:
            raise ValueError(
                f"precision {precision!r} was left out by the accuracy gate "
                f"({'; '.join(self.left_out[precision])}); have {sorted(self.precisions)}"
            )
        if precision not in self.precisions:
            raise ValueError(f"precision {precision!r} not exported; have {sorted(self.precisions)}")
        p = self.precisions[precision]
        return p["encoder"], p["decoder"]

    def save(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST
        path.write_text(json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n")
        return path

    @classmethod
    def load(cls, directory: Path) -> AsrManifest:
        path = Path(directory) / MANIFEST
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(
                f"{path} missing: not an ASR artifact directory (python -m switchboard.export.asr)"
            ) from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
        known = set(cls.__dataclass_fields__)
        required = {
            n for n, f in cls.__dataclass_fields__.items() if f.default is MISSING and f.default_factory is MISSING
        }
        missing = sorted(required - set(data))
        if missing:
            raise ValueError(f"{path}: missing field(s) {', '.join(missing)}")
        hop = data.get("hop_length", 160)
        if not isinstance(hop, int) or isinstance(hop, bool) or hop < 1:
            raise ValueError(f"{path}: hop_length {hop!r}: expected a positive number of samples")
        keys = ("start", "eos", "notimestamps") + (("transcribe",) if data["multilingual"] else ())
        for key in keys:
            if not isinstance(data["special"].get(key), int):
                raise ValueError(f"{path}: special.{key} must be a token id")
        return cls(**{k: v for k, v in data.items() if k in known})


def encoder_outputs(num_layers: int) -> list[str]:
    return [f"cross_key.{i}" for i in range(num_layers)] + [f"cross_value.{i}" for i in range(num_layers)]


def decoder_io(num_layers: int) -> tuple[list[str], list[str]]:
    inputs = ["input_ids"]
    inputs += [n for i in range(num_layers) for n in (f"past_key.{i}", f"past_value.{i}")]
    inputs += [n for i in range(num_layers) for n in (f"cross_key.{i}", f"cross_value.{i}")]
    outputs = ["logits"] + [n for i in range(num_layers) for n in (f"present_key.{i}", f"present_value.{i}")]
    return inputs, outputs


def encoder_flops(directory: Path, manifest: AsrManifest) -> float:
    """About the arithmetic of one window through the encoder: 2 x its parameters (the FP32
    graph's bytes / 4) x the positions it attends over."""
    encoder = manifest.precisions.get("fp32", {}).get("encoder")
    path = Path(directory) / encoder if encoder else None
    if path is None or not path.is_file():
        return float("inf")  # not measurable: as if large
    return 2.0 * path.stat().st_size / 4 * manifest.max_source_positions


class OnnxWhisper:
    """The encoder and decoder sessions of one precision."""

    def __init__(self, directory: Path, manifest: AsrManifest, precision: str = "fp32", threads: int = 0):
        """``threads``: ONNX Runtime's intra-op threads (0: every core this process may use)."""
        self.manifest = manifest
        self.precision = precision
        encoder, decoder = manifest.files(precision)
        paths = [Path(directory) / encoder, Path(directory) / decoder]
        for p in paths:
            if not p.is_file():
                raise ValueError(f"{p} missing (named by {Path(directory) / MANIFEST} for {precision})")
        self.encoder = onnx.session(paths[0], threads)
        self.decoder = onnx.session(paths[1], threads)
        n = manifest.num_layers
        self._cross_names = encoder_outputs(n)
        self._inputs, self._outputs = decoder_io(n)
        # Graphs that do not fit the manifest (copied from another export) fail here, at load.
        for path, session, inputs, outputs in (
            (paths[0], self.encoder, ["input_features"], self._cross_names),
            (paths[1], self.decoder, self._inputs, self._outputs),
        ):
            have = [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]
            if sorted(have[0]) != sorted(inputs) or sorted(have[1]) != sorted(outputs):
                raise ValueError(f"{path}: inputs/outputs {have} do not match {MANIFEST} ({n} decoder layers)")

    def encode(self, features: np.ndarray) -> KV:
        """Cross-attention keys and values per decoder layer for [B, n_mels, T] features."""
        out = self.encoder.run(self._cross_names, {"input_features": features.astype(np.float32, copy=False)})
        n = self.manifest.num_layers
        return list(zip(out[:n], out[n:]))

    def empty_past(self, batch: int) -> KV:
        m = self.manifest
        shape = (batch, m.num_heads, 0, m.head_dim)
        return [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(m.num_layers)]

    def decode(self, input_ids: np.ndarray, past: KV, cross: KV) -> tuple[np.ndarray, KV]:
        """One step for every row: logits [B, V] of the last position and the grown cache."""
        feed = {"input_ids": input_ids.astype(np.int64, copy=False)}
        for i, ((pk, pv), (ck, cv)) in enumerate(zip(past, cross)):
            feed[f"past_key.{i}"], feed[f"past_value.{i}"] = pk, pv
            feed[f"cross_key.{i}"], feed[f"cross_value.{i}"] = ck, cv
        out = self.decoder.run(self._outputs, feed)
        return out[0], list(zip(out[1::2], out[2::2]))

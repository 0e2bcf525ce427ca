"""switchboard.asr.audio: every format callers send decodes to 16 kHz mono, every bad file is an
AudioError with its code, and a long file is refused from its header alone."""

import io
import struct

import numpy as np
import pytest
import soundfile as sf

from switchboard.asr import audio
from switchboard.asr.audio import MAX_UPLOAD_BYTES, Audio, AudioError, decode, encode_wav
from tests.audiotools import encode_av, flac_of_unknown_length

RATE = 16_000


def tone(seconds, rate, freq=440.0, amp=0.5, channels=1):
    t = np.arange(int(seconds * rate)) / rate
    x = (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


def write(samples, rate, fmt="WAV", subtype=None):
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def wav_header(data_bytes, rate=RATE, channels=1, bits=16, tag=1):
    """A canonical 44-byte WAV header promising ``data_bytes`` of samples."""
    align = channels * bits // 8
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * align, align, bits)
    riff = (36 + data_bytes) & 0xFFFFFFFF
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", data_bytes)
    )


def error(data, **kw):
    with pytest.raises(AudioError) as info:
        decode(data, **kw)
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith("audio: ")
    return info.value


def dominant_hz(samples):
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return np.argmax(spectrum) * RATE / len(samples)


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 44100, 48000])
def test_common_rates_resample_to_16k_and_keep_the_tone(rate):
    a = decode(write(tone(1.0, rate), rate))
    assert isinstance(a, Audio)
    assert a.source_rate == rate and a.channels == 1 and a.format == "wav/pcm_16"
    assert a.samples.dtype == np.float32 and a.samples.ndim == 1
    assert abs(len(a.samples) - RATE) <= 1 and a.seconds == pytest.approx(1.0, abs=1e-3)
    assert dominant_hz(a.samples) == pytest.approx(440, abs=2)
    assert np.abs(a.samples).max() == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE"])
def test_wav_sample_widths(subtype):
    a = decode(write(tone(0.5, 22050), 22050, "WAV", subtype))
    assert a.format == f"wav/{subtype.lower()}"
    assert len(a.samples) == 8000
    tolerance = 0.02 if subtype == "PCM_U8" else 1e-3
    assert np.abs(a.samples).max() == pytest.approx(0.5, abs=tolerance)


def test_stereo_and_multichannel_are_averaged_to_mono():
    left, right = tone(1.0, 44100, amp=0.6), tone(1.0, 44100, amp=0.2)
    a = decode(write(np.stack([left, right], axis=1), 44100))
    assert a.channels == 2 and a.samples.ndim == 1
    assert np.abs(a.samples).max() == pytest.approx(0.4, abs=0.01)
    six = decode(write(tone(0.25, RATE, channels=6), RATE, "WAV", "FLOAT"))
    assert six.channels == 6 and np.allclose(six.samples, tone(0.25, RATE), atol=1e-6)


def test_16k_mono_pcm_passes_through_without_resampling():
    x = tone(0.5, RATE)
    a = decode(write(x, RATE, "WAV", "FLOAT"))
    assert np.array_equal(a.samples, x)


@pytest.mark.parametrize(
    "fmt, subtype, rate, name",
    [
        ("FLAC", "PCM_16", 44100, "flac/pcm_16"),
        ("FLAC", "PCM_24", 48000, "flac/pcm_24"),
        ("OGG", "VORBIS", 44100, "ogg/vorbis"),
        ("OGG", "OPUS", 48000, "ogg/opus"),
        ("OGG", "OPUS", 16000, "ogg/opus"),
        ("AIFF", "PCM_16", 22050, "aiff/pcm_16"),
    ],
)
def test_compressed_and_other_containers(fmt, subtype, rate, name):
    a = decode(write(tone(1.0, rate), rate, fmt, subtype))
    assert a.format == name and a.source_rate == rate
    assert len(a.samples) == pytest.approx(RATE, abs=400)
    assert dominant_hz(a.samples) == pytest.approx(440, abs=3)


@pytest.mark.skipif("MP3" not in sf.available_formats(), reason="this libsndfile has no MP3")
def test_mp3_decodes_where_libsndfile_has_it():
    a = decode(write(tone(1.0, 44100), 44100, "MP3", "MPEG_LAYER_III"))
    assert a.format == "mp3/mpeg_layer_iii"
    assert dominant_hz(a.samples) == pytest.approx(440, abs=3)


def test_empty():
    assert error(b"").code == "empty"


def test_random_bytes_and_text_are_not_audio():
    assert error(np.random.default_rng(1).bytes(10_000)).code == "not_audio"
    e = error(b"hello, this is a text file and not audio\n" * 20)
    assert e.code == "not_audio" and "not a recognised audio file" in str(e)


@pytest.mark.parametrize(
    "data, name",
    [
        (b"\xff\xf1\x50\x80" + bytes(200), "AAC"),
        (b"#!AMR\n" + bytes(200), "AMR"),
    ],
)
def test_containers_libsndfile_cannot_read_are_unsupported_by_name(data, name):
    e = error(data)
    assert e.code == "unsupported" and name in str(e)


# --- WebM and MP4/M4A: what browsers and phones record, read by FFmpeg (PyAV) ---


RECORDINGS = {
    "webm/opus": ("webm", "libopus", 48_000),  # Chromium's and Firefox's MediaRecorder
    "mp4/aac": ("ipod", "aac", 44_100),  # an iPhone voice memo (.m4a)
    "mp4/opus": ("mp4", "libopus", 48_000),
}


@pytest.mark.parametrize("kind", sorted(RECORDINGS))
def test_browser_and_phone_recordings_decode_to_16k_and_keep_the_tone(kind):
    container, codec, rate = RECORDINGS[kind]
    data = encode_av(tone(2.0, rate), rate, container, codec)
    a = decode(data)
    assert a.format == kind and a.source_rate == rate and a.channels == 1
    assert 1.95 <= a.seconds <= 2.15, a.seconds  # AAC adds its encoder's priming and padding
    assert a.samples.dtype == np.float32 and len(a.samples) == pytest.approx(a.seconds * RATE, abs=2)
    assert abs(dominant_hz(a.samples) - 440.0) < 2.0
    assert 0.3 < np.abs(a.samples).max() <= 1.0


def test_a_stereo_recording_is_averaged_to_mono():
    left, right = tone(1.0, 48_000, 440.0), tone(1.0, 48_000, 1000.0, amp=0.0)
    a = decode(encode_av(np.stack([left, right], axis=1), 48_000, "webm", "libopus", layout="stereo"))
    assert a.channels == 2 and abs(dominant_hz(a.samples) - 440.0) < 2.0
    assert 0.15 < np.abs(a.samples).max() < 0.35, "half the left channel's 0.5"


def test_a_recording_over_the_limit_is_too_long():
    data = encode_av(tone(3.0, 48_000), 48_000, "webm", "libopus")
    assert error(data, max_seconds=2.0).code == "too_long"
    assert decode(data, max_seconds=4.0).seconds == pytest.approx(3.0, abs=0.05)


def test_a_webm_cut_short_gives_what_it_holds():
    data = encode_av(tone(4.0, 48_000), 48_000, "webm", "libopus")
    a = decode(data[: len(data) // 2])  # a stream has no length to promise: its readable part is the recording
    assert 1.0 < a.seconds < 3.0
    assert error(data[:60]).code in ("not_audio", "no_samples")


def test_an_m4a_cut_short_is_truncated_or_damaged(tmp_path):
    faststart = encode_av(
        tone(4.0, 44_100), 44_100, "ipod", "aac", options={"movflags": "faststart"}, path=tmp_path / "memo.m4a"
    )
    e = error(faststart[: len(faststart) // 2])  # the header (first) promises 4 s
    assert e.code == "truncated" and "promises 4.0" in str(e)
    plain = encode_av(tone(4.0, 44_100), 44_100, "ipod", "aac")
    assert error(plain[: len(plain) // 2]).code == "not_audio"  # its header was at the end


def test_a_codec_a_recording_does_not_hold_is_unsupported_by_name():
    e = error(encode_av(tone(1.0, 48_000), 48_000, "matroska", "ac3"))
    assert e.code == "unsupported" and "ac3" in str(e)


def test_magic_bytes_without_a_container_behind_them_are_not_audio():
    for magic in (b"\x1a\x45\xdf\xa3", b"\x00\x00\x00\x20ftypM4A "):
        assert error(magic + bytes(200)).code == "not_audio"
        assert error(magic + np.random.default_rng(2).bytes(5000)).code in ("not_audio", "no_samples")


@pytest.mark.parametrize("kind", ["webm/opus", "mp4/aac"])
def test_damaged_recordings_decode_or_fail_as_audio_errors_never_otherwise(kind):
    container, codec, rate = RECORDINGS[kind]
    good = bytearray(encode_av(tone(1.0, rate), rate, container, codec))
    rng = np.random.default_rng(3)
    outcomes = set()
    for _ in range(150):
        bad = bytearray(good)
        for at in rng.integers(0, len(bad), size=int(rng.integers(1, 12))):
            bad[at] = int(rng.integers(0, 256))
        try:
            a = decode(bytes(bad), max_seconds=30.0)
        except AudioError as e:
            outcomes.add(e.code)
        else:
            assert a.samples.dtype == np.float32 and np.isfinite(a.samples).all() and a.seconds <= 30.0
            outcomes.add("decoded")
    assert "decoded" in outcomes and outcomes <= {
        "decoded",
        "not_audio",
        "no_samples",
        "truncated",
        "unsupported",
        "too_long",
    }


def test_wav_with_a_codec_libsndfile_does_not_know_is_unsupported():
    e = error(wav_header(400, tag=0x00FF) + bytes(400))  # AAC in WAV
    assert e.code == "unsupported" and "0x00ff" in str(e)


def test_ogg_with_an_unreadable_codec_is_unsupported():
    page = b"OggS" + bytes(24) + b"Speex   " + bytes(100)
    e = error(page)
    assert e.code == "unsupported" and "Speex" in str(e)


def test_a_wav_header_with_impossible_fields_is_not_audio():
    assert error(wav_header(20, channels=0) + bytes(20)).code == "not_audio"


def test_too_low_a_sample_rate_is_unsupported():
    assert error(wav_header(200, rate=100) + bytes(200)).code == "unsupported"


def test_two_hour_wav_header_is_too_long_without_decoding(monkeypatch):
    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded samples of a file over the limit")

    monkeypatch.setattr(sf.SoundFile, "read", no_decoding)
    data = wav_header(7200 * RATE * 2) + bytes(1000)  # promises 2 h, holds 31 ms
    e = error(data)
    assert e.code == "too_long"
    assert str(e) == "audio: 7200.0 s is longer than the 600 s limit"


def test_two_hours_of_real_flac_is_too_long_without_decoding(monkeypatch):
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", 8000, 1, format="FLAC", subtype="PCM_16") as f:
        silence = np.zeros(8000 * 600, np.int16)
        for _ in range(12):
            f.write(silence)
    data = buf.getvalue()
    assert len(data) < 1_000_000  # 2 h of silence compresses to almost nothing

    monkeypatch.setattr(sf.SoundFile, "read", lambda *a, **k: pytest.fail("decoded a 2 h file"))
    e = error(data)
    assert e.code == "too_long" and "7200.0 s" in str(e)


@pytest.mark.skipif("MP3" not in sf.available_formats(), reason="this libsndfile has no MP3")
def test_an_mp3_length_its_bytes_cannot_hold_is_not_believed(monkeypatch):
    """A damaged Xing header's frame count (found by fuzzing: 4 KB claiming 112 days) is not a
    reason to answer too_long; the file decodes, its real 3 s. A real long MP3, whose header
    its bytes can hold, is still refused from the header alone."""
    data = bytearray(write(tone(3.0, RATE), RATE, "MP3", "MPEG_LAYER_III"))
    at = data.find(b"Xing")
    assert at > 0 and struct.unpack(">I", data[at + 4 : at + 8])[0] & 1  # the frame count is there
    data[at + 8 : at + 12] = struct.pack(">I", 0x0FFFFFFF)
    assert decode(bytes(data), max_seconds=30.0).seconds == pytest.approx(3.0, abs=0.1)

    long = write(tone(40.0, RATE), RATE, "MP3", "MPEG_LAYER_III")
    monkeypatch.setattr(sf.SoundFile, "read", lambda *a, **k: pytest.fail("decoded a file over the limit"))
    e = error(long, max_seconds=30.0)
    assert e.code == "too_long" and "30 s limit" in str(e)


def test_max_seconds_is_the_callers_limit():
    data = write(tone(3.0, RATE), RATE)
    assert decode(data, max_seconds=3.0).seconds == pytest.approx(3.0)
    e = error(data, max_seconds=2.5)
    assert e.code == "too_long" and "2.5 s limit" in str(e)


def test_the_read_itself_stops_at_the_limit(monkeypatch):
    # the header check comes first; this is the guard behind it, whatever a header says
    monkeypatch.setattr(audio, "_BLOCK_SAMPLES", 4000)
    with sf.SoundFile(io.BytesIO(write(tone(3.0, RATE), RATE, "FLAC"))) as f:
        with pytest.raises(AudioError) as info:
            audio._read_mono(f, max_seconds=1.0)
        assert info.value.code == "too_long"
        assert f.tell() <= 2 * 4000 + RATE  # it stopped reading there


def test_wav_with_no_samples():
    assert error(wav_header(0)).code == "no_samples"
    assert error(write(np.zeros(0, np.float32), RATE)).code == "no_samples"


@pytest.mark.parametrize("keep", [4, 12, 20, 30, 40])
def test_truncated_wav_header(keep):
    e = error(wav_header(32_000)[:keep])
    assert e.code == "truncated" and "header is cut short" in str(e)


def test_wav_data_cut_short_is_truncated():
    e = error(wav_header(32_000) + bytes(16_000))
    assert e.code == "truncated" and "promises 1.00 s, it holds 0.50 s" in str(e)


@pytest.mark.parametrize("placeholder", [0xFFFFFFFF, 0x7FFFF000, 0x7FFFFFFF])
def test_wav_of_unknown_length_decodes_what_is_there(placeholder):
    # streaming writers leave a placeholder for the data size: -1, espeak-ng --stdout 0x7FFFF000
    a = decode(wav_header(placeholder) + np.full(800, 1000, "<i2").tobytes())
    assert len(a.samples) == 800 and a.seconds == pytest.approx(0.05)


@pytest.mark.parametrize("channels", [1, 2])
def test_flac_of_unknown_length_decodes_to_its_end(channels):
    # `espeak-ng --stdout ... | sox -t wav - -t flac -` writes such a file; libsndfile says it is
    # 2^63 - 1 frames long (it was refused as "418293516410647.4 s is longer than the limit")
    data = write(tone(2.0, 22050, channels=channels), 22050, "FLAC")
    a = decode(flac_of_unknown_length(data))
    assert a.seconds == pytest.approx(2.0) and a.channels == channels and a.source_rate == 22050
    assert np.array_equal(a.samples, decode(data).samples)


def test_flac_of_unknown_length_stops_at_the_limit_and_cannot_be_truncated():
    data = flac_of_unknown_length(write(tone(3.0, 44100), 44100, "FLAC"))
    e = error(data, max_seconds=2.0)
    assert e.code == "too_long" and "2 s limit" in str(e)
    # no length promised, so none broken: a stream cut short is what it holds (as OGG's)
    assert 0.5 < decode(data[: len(data) // 2]).seconds < 2.5
    assert error(data[:60]).code == "not_audio"


def test_flac_cut_short_is_truncated():
    data = write(tone(2.0, 44100), 44100, "FLAC")
    e = error(data[: len(data) // 2])
    assert e.code == "truncated" and "FLAC" in str(e)
    assert error(data[:30]).code == "not_audio"  # the stream header itself is gone


def test_ogg_cut_short_decodes_what_is_there():
    noisy = tone(5.0, 22050) + 0.05 * np.random.default_rng(0).standard_normal(5 * 22050).astype(np.float32)
    data = write(noisy, 22050, "OGG", "VORBIS")
    a = decode(data[: len(data) * 2 // 3])
    assert 1.0 < a.seconds < 5.0


def test_nan_and_inf_samples_become_silence():
    x = tone(0.1, RATE)
    x[::7], x[1::7], x[2::7] = np.nan, np.inf, -np.inf
    a = decode(write(x, RATE, "WAV", "FLOAT"))
    assert np.isfinite(a.samples).all()
    assert a.samples[0] == 0 and a.samples[3] == x[3]


def test_float_louder_than_full_scale_is_scaled_not_clipped():
    a = decode(write(tone(0.5, 44100, amp=4.0), 44100, "WAV", "FLOAT"))
    assert np.abs(a.samples).max() <= 1.0
    assert np.abs(a.samples).max() == pytest.approx(1.0, abs=0.01)
    # a sine, not a square: most samples are well under the peak
    assert np.mean(np.abs(a.samples) > 0.99) < 0.2


def test_encode_wav_round_trips_at_16_bit():
    x = tone(0.5, RATE, amp=0.3)
    data = encode_wav(x)
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    a = decode(data)
    assert a.format == "wav/pcm_16" and np.allclose(a.samples, x, atol=1 / 32768)
    assert decode(encode_wav(x, rate=8000)).source_rate == 8000
    clipped = decode(encode_wav(np.array([2.0, -2.0, np.nan], np.float32))).samples
    assert clipped.max() <= 1.0 and clipped.min() == -1.0 and clipped[2] == 0.0
    stereo = decode(encode_wav(tone(0.1, RATE, channels=2)))
    assert stereo.channels == 2


def test_upload_limit_is_openais():
    assert MAX_UPLOAD_BYTES == 25 * 1024 * 1024


def test_decoding_writes_no_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    decode(write(tone(0.5, 44100), 44100, "OGG", "VORBIS"))
    with pytest.raises(AudioError):
        decode(wav_header(32_000)[:20])
    assert list(tmp_path.iterdir()) == []

"""Uploaded audio bytes to the 16 kHz mono float32 samples Whisper listens to, in memory.

libsndfile (through soundfile over ``io.BytesIO``) reads the files callers send: WAV of any
PCM width or float, FLAC, OGG Vorbis and Opus, MP3 where the bundled libsndfile has it, and
the rest of what libsndfile knows (AIFF, CAF, ...). What browsers and phones record, WebM
(Chromium's and Firefox's MediaRecorder: Opus) and MP4/M4A (iOS and Android voice memos:
AAC), FFmpeg reads, through PyAV: only those two demuxers, chosen by the magic bytes (FFmpeg
never probes), and only audio codecs a recording holds (``_AV_CODECS``), so the surface FFmpeg
shows callers is two demuxers and a few decoders. Nothing touches the disk: an upload is at
most ``MAX_UPLOAD_BYTES`` and a temp file would be one more thing to clean up on every path.

Every way a file can be wrong becomes an ``AudioError`` with a ``code`` the server maps to a
4xx and a message a caller can act on; nothing here raises anything else for bad bytes:

- ``empty``: 0 bytes;
- ``not_audio``: not a recognised audio file, or a recognised one too damaged to open;
- ``unsupported``: a container we recognise whose codec we do not read (AMR, WMA, a WAV
  format tag libsndfile does not know, OGG Speex, video codecs in WebM or MP4, ...);
- ``too_long``: longer than ``max_seconds``, judged from the header before any sample is
  decoded (and again while decoding, for formats whose header only estimates the length), so
  a 2-hour upload costs a header parse, not 2 hours of decoding and resampling. An estimate
  longer than the file's bytes could hold at the lowest bitrate its format has (a damaged MP3
  Xing header can claim 100 days for 4 KB) is not believed: the file is decoded, up to the limit;
- ``no_samples``: a valid file with 0 frames;
- ``truncated``: the header promises more than the file holds (a WAV header cut short, a WAV
  data chunk or a FLAC stream that ends early, an MP4 whose samples stop before the length
  its header gives). Formats without an exact length in their header (OGG, MP3, WebM) cannot
  tell, and their readable part is decoded.

A file written to a pipe has no length in its header: its writer could not seek back to fill it
in (``espeak-ng --stdout ... | sox -t wav - -t flac -``). A WAV then carries a placeholder data
size, a FLAC a STREAMINFO total of 0 samples, "unknown" in the FLAC format. libsndfile reports
such a FLAC as 2^63 - 1 frames and cannot read it to its end (soundfile seeks after every read,
and that seek fails at the end of an unknown length), so FFmpeg's FLAC demuxer reads it, as it
reads WebM and MP4: to its end, up to the limit. Like a streamed WAV, it cannot be truncated.

libsndfile clamps a WAV's frame count to the bytes present, so the promise a WAV header makes
(its ``data`` chunk size) is read here with a small RIFF parser; that is what lets a crafted
"2 hours" header with a few bytes behind it be refused as too long instead of decoded as 30 ms.

Samples are averaged to mono, cleaned (NaN/inf to 0, float files louder than full scale scaled
down rather than clipped, so the waveform keeps its shape) and resampled with soxr at 'HQ':
20-bit precision is beyond the 16-bit sources callers send, and it costs 8 ms per minute of
48 kHz audio on one core (VHQ 11 ms, QQ 6 ms: the cheaper settings buy nothing worth their
aliasing, the dearer one nothing a 16-bit source can show).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import soxr

SAMPLE_RATE = 16_000
# OpenAI's limit for /v1/audio/transcriptions; the boundary enforces it while reading the body
MAX_UPLOAD_BYTES = 25 * 1024 * 1024
# below telephony's 8 kHz there is no speech to recognise, only a crafted header
MIN_SOURCE_RATE = 4_000
# samples (frames x channels) read at a time: 4 MB of float32 whatever the channel count
_BLOCK_SAMPLES = 1 << 20
_SF_ERR_UNSUPPORTED_ENCODING = 4
# Streaming WAV writers, which cannot seek back to write the sizes, leave a placeholder: -1
# (0xFFFFFFFF), espeak-ng --stdout 0x7FFFF000, others 0x7FFFFFFF. A real data chunk of
# 2 GB or more cannot be uploaded anyway, so such a size means "to the end of the file".
_UNKNOWN_SIZE_FROM = 0x7FFF0000
# header lengths are estimates in these (granule of the last page, Xing/bitrate), not promises
_ESTIMATED_LENGTH = {"OGG", "MP3"}
# the fewest bits a second of them takes (MPEG-2.5 layer III's 8 kb/s; Opus's 6): an estimate
# beyond what the file's bytes could hold at that comes from a damaged header
_LEAST_BITS_PER_S = 6000

# FFmpeg's demuxer for each container it reads here (by _foreign_container's names, and FLAC of
# unknown length: see the module docstring), and the audio codecs it decodes in them: what
# recordings hold, nothing else
_AV_DEMUXERS = {"WebM/Matroska": ("matroska", "webm"), "MP4/M4A": ("mp4", "mp4"), "FLAC": ("flac", "flac")}
_AV_CODECS = frozenset({"opus", "vorbis", "aac", "mp3", "flac", "alac", "pcm_s16le", "pcm_f32le"})
# an MP4's samples may stop this short of its header's length (encoder priming and padding)
_AV_LENGTH_SLACK_S = 0.1

_READABLE = (
    "WAV (PCM or float), FLAC, OGG (Vorbis or Opus)"
    + (", MP3" if "MP3" in sf.available_formats() else "")
    + ", WebM (Opus) or MP4/M4A (AAC)"
)


@dataclass(frozen=True, eq=False)
class Audio:
    """Decoded audio: ``samples`` float32 mono at 16 kHz in [-1, 1]; ``seconds`` the source's
    duration; ``format`` libsndfile's container/subtype in lower case ("wav/pcm_16", "ogg/opus")."""

    samples: np.ndarray
    seconds: float
    source_rate: int
    channels: int
    format: str


class AudioError(ValueError):
    """Bad audio from a caller: ``code`` says which kind (see the module docstring), the message
    says what is wrong in words a caller can act on."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def decode(data: bytes, max_seconds: float = 600.0) -> Audio:
    """Decode an uploaded file to 16 kHz mono float32; ``AudioError`` for anything unusable."""
    if not data:
        raise AudioError("empty", "audio: the file is empty (0 bytes)")
    data = bytes(data)
    foreign = _foreign_container(data)
    if foreign in _AV_DEMUXERS:
        return _decode_av(data, foreign, max_seconds)
    if _flac_total_samples(data) == 0:  # no length in the header: written to a pipe
        return _decode_av(data, "FLAC", max_seconds)
    wav = _parse_wav(data)
    if wav is not None:
        _check_wav_header(wav, max_seconds)
    try:
        f = sf.SoundFile(io.BytesIO(data))
    except sf.SoundFileError as e:
        raise _open_error(data, wav, e) from None
    with f:
        rate, channels, frames = f.samplerate, f.channels, f.frames
        container, fmt = f.format, f"{f.format}/{f.subtype}".lower()
        if rate < MIN_SOURCE_RATE:
            raise AudioError("unsupported", f"audio: a {rate} Hz sample rate is too low for speech")
        if container not in _ESTIMATED_LENGTH or frames / rate <= len(data) * 8 / _LEAST_BITS_PER_S:
            _check_seconds(frames / rate, max_seconds)  # else the read below stops at the limit
        if frames == 0:
            raise _no_samples(container)
        mono = _read_mono(f, max_seconds)
    if len(mono) == 0:
        raise _no_samples(container)
    if len(mono) < frames and container not in _ESTIMATED_LENGTH:
        promised, held = frames / rate, len(mono) / rate
        raise AudioError(
            "truncated", f"audio: the file is cut short: its header promises {promised:.2f} s, it holds {held:.2f} s"
        )
    return Audio(_to_16k(_clean(mono), rate), len(mono) / rate, rate, channels, fmt)


def encode_wav(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    """16-bit PCM WAV bytes of float samples in [-1, 1] (clipped): [frames] or [frames, channels]."""
    samples = np.clip(np.nan_to_num(np.asarray(samples, dtype=np.float32)), -1.0, 1.0)
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _no_samples(container: str) -> AudioError:
    if container in _ESTIMATED_LENGTH:
        # libsndfile finds no length in an OGG cut before its first complete audio page
        return AudioError("no_samples", f"audio: the {container} file holds no complete audio (empty, or cut short)")
    return AudioError("no_samples", "audio: the file holds no samples (0 s of audio)")


def _check_seconds(seconds: float, max_seconds: float) -> None:
    if seconds > max_seconds:
        raise AudioError("too_long", f"audio: {seconds:.1f} s is longer than the {max_seconds:g} s limit")


def _read_mono(f: sf.SoundFile, max_seconds: float) -> np.ndarray:
    """All frames averaged over channels, read a block at a time so the multichannel copy never
    exists whole. The length was checked against the header; the limit is checked again here
    so that no header, however wrong, makes this read past it."""
    limit = int(max_seconds * f.samplerate)
    block_frames = max(1, _BLOCK_SAMPLES // f.channels)
    blocks, total = [], 0
    while True:
        try:
            block = f.read(block_frames, dtype="float32", always_2d=True)
        except sf.SoundFileError as e:
            raise AudioError(
                "truncated", f"audio: the {f.format} data ends early or is damaged ({_detail(e)})"
            ) from None
        if len(block) == 0:
            break
        blocks.append(block[:, 0].copy() if block.shape[1] == 1 else block.mean(axis=1, dtype=np.float32))
        total += len(block)
        if total > limit:
            _check_seconds(total / f.samplerate, max_seconds)
    return np.concatenate(blocks) if blocks else np.zeros(0, np.float32)


def _decode_av(data: bytes, container: str, max_seconds: float) -> Audio:
    """A WebM or MP4 file's first audio track through FFmpeg (PyAV), in memory, as ``decode``
    reads the rest: mono, cleaned, at 16 kHz, the same errors."""
    import av  # FFmpeg's libraries: loaded by the first WebM or MP4 only

    demuxer, name = _AV_DEMUXERS[container]
    blocks: list[np.ndarray] = []
    rate = total = 0
    try:
        with av.open(io.BytesIO(data), mode="r", format=demuxer) as f:
            stream = next(iter(f.streams.audio), None)
            if stream is None:
                raise AudioError("no_samples", f"audio: the {container} file has no audio track")
            codec = stream.codec_context.name if stream.codec_context is not None else "an unknown codec's"
            if codec not in _AV_CODECS:
                raise AudioError(
                    "unsupported", f"audio: {container} with {codec} audio is not supported; send {_READABLE}"
                )
            channels = stream.codec_context.layout.nb_channels
            declared = float(stream.duration * stream.time_base) if stream.duration else None
            if declared is None and f.duration:
                declared = f.duration / av.time_base
            if declared is not None:
                _check_seconds(declared, max_seconds)
            # Packed float at the frames' own rate and channels: one plane, read here with its
            # size checked. (PyAV's to_ndarray walks a planar frame's planes by a count that a
            # damaged AAC header can make one too many: a read past the frame, a crash.)
            packed = av.AudioResampler(format="flt")
            for frame in f.decode(stream):
                for out in packed.resample(frame):
                    if rate and out.sample_rate != rate:
                        raise AudioError("unsupported", f"audio: the {container} file changes its sample rate")
                    rate, n, width = out.sample_rate, out.samples, out.layout.nb_channels
                    x = np.frombuffer(out.planes[0], np.float32)
                    if width < 1 or len(x) < n * width:
                        raise AudioError("not_audio", f"audio: the {container} file decodes to malformed frames")
                    x = x[: n * width].reshape(n, width)
                    blocks.append(x[:, 0].copy() if width == 1 else x.mean(axis=1, dtype=np.float32))
                    total += n
                    _check_seconds(total / rate, max_seconds)
    except AudioError:
        raise
    except (av.FFmpegError, ValueError, IndexError, TypeError, ArithmeticError) as e:  # fields a damaged file left out
        if not blocks:  # a header too damaged to open, or no packet that decodes
            raise AudioError("not_audio", f"audio: the {container} file is damaged or cut short ({e})") from None
        # what decoded before the damage is the recording, unless its header promised more
    if total == 0:
        raise AudioError("no_samples", f"audio: the {container} file holds no complete audio (empty, or cut short)")
    if rate < MIN_SOURCE_RATE:
        raise AudioError("unsupported", f"audio: a {rate} Hz sample rate is too low for speech")
    held = total / rate
    if container == "MP4/M4A" and declared is not None and held < declared - _AV_LENGTH_SLACK_S:
        raise AudioError(
            "truncated", f"audio: the file is cut short: its header promises {declared:.2f} s, it holds {held:.2f} s"
        )
    return Audio(_to_16k(_clean(np.concatenate(blocks)), rate), held, rate, channels, f"{name}/{codec}")


def _clean(mono: np.ndarray) -> np.ndarray:
    if not np.isfinite(mono).all():
        mono = np.nan_to_num(mono, nan=0.0, posinf=0.0, neginf=0.0)
    peak = float(np.abs(mono).max())
    if peak > 1.0:
        # only float files go past full scale; scaling keeps the waveform, clipping would not
        mono = mono / peak
    return mono


def _to_16k(mono: np.ndarray, rate: int) -> np.ndarray:
    if rate != SAMPLE_RATE:
        # the filter rings a little past full scale on hard edges
        mono = np.clip(soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ"), -1.0, 1.0)
    return np.ascontiguousarray(mono, dtype=np.float32)


# --- FLAC: whether the header gives a length at all ---


def _flac_total_samples(data: bytes) -> int | None:
    """STREAMINFO's total samples (36 bits; 0: unknown), or None when the file does not start
    with one. STREAMINFO is the first metadata block by the format's rule: 2 + 2 + 3 + 3 bytes
    of block and frame sizes, then 20 bits of sample rate, 3 of channels, 5 of sample size."""
    if len(data) < 8 + 18 or data[:4] != b"fLaC" or data[4] & 0x7F != 0:
        return None
    return int.from_bytes(data[8 + 10 : 8 + 18], "big") & ((1 << 36) - 1)


# --- WAV headers: what the file promises, which libsndfile does not report ---


@dataclass(frozen=True)
class _WavHeader:
    complete: bool  # the fmt chunk and the data chunk's header are both present
    tag: int = 0  # format tag, the sub-format's for WAVE_FORMAT_EXTENSIBLE
    rate: int = 0
    byte_rate: int = 0
    block_align: int = 0
    declared_bytes: int | None = None  # the data chunk's size; None: unknown (streamed)
    present_bytes: int = 0  # bytes after the data chunk's header


def _parse_wav(data: bytes) -> _WavHeader | None:
    """The RIFF/WAVE header's promise, or None for anything that is not a WAV file."""
    if len(data) < 12:
        return _WavHeader(complete=False) if data.startswith(b"RIFF") and b"WAVE".startswith(data[8:12]) else None
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    fmt: dict = {}
    pos = 12
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = pos + 8
        if chunk == b"fmt ":
            if size < 16 or body + 16 > len(data):
                return _WavHeader(complete=False)
            tag, _, rate, byte_rate, block_align, _ = struct.unpack_from("<HHIIHH", data, body)
            if tag == 0xFFFE and size >= 40 and body + 26 <= len(data):
                tag = struct.unpack_from("<H", data, body + 24)[0]  # first two bytes of the sub-format GUID
            fmt = dict(tag=tag, rate=rate, byte_rate=byte_rate, block_align=block_align)
        elif chunk == b"data":
            if not fmt:
                return _WavHeader(complete=False)
            declared = None if size >= _UNKNOWN_SIZE_FROM else size
            return _WavHeader(True, declared_bytes=declared, present_bytes=len(data) - body, **fmt)
        pos = body + size + (size & 1)  # chunks are word aligned
    return _WavHeader(complete=False, **fmt)


def _check_wav_header(wav: _WavHeader, max_seconds: float) -> None:
    if not wav.complete:
        raise AudioError("truncated", "audio: the WAV header is cut short (no complete 'fmt ' and 'data' chunks)")
    byte_rate = wav.byte_rate or wav.rate * wav.block_align
    if wav.declared_bytes is None or byte_rate <= 0:
        return
    _check_seconds(wav.declared_bytes / byte_rate, max_seconds)
    if wav.declared_bytes - wav.present_bytes >= max(wav.block_align, 1):
        raise AudioError(
            "truncated",
            f"audio: the WAV file is cut short: its header promises {wav.declared_bytes / byte_rate:.2f} s, "
            f"it holds {wav.present_bytes / byte_rate:.2f} s",
        )


# --- why a file did not open ---

_WAV_PCM_TAGS = (1, 3)  # integer PCM and IEEE float: a refusal means a broken header, not a codec
_OGG_CODECS = {
    b"\x01vorbis": "Vorbis",
    b"OpusHead": "Opus",
    b"Speex   ": "Speex",
    b"\x7fFLAC": "FLAC",
    b"\x80theora": "Theora",
}


def _detail(e: sf.SoundFileError) -> str:
    """libsndfile's own words, without its "Error : " prefix."""
    text = getattr(e, "error_string", None) or str(e)
    return text.removeprefix("Error : ").strip().rstrip(".")


def _foreign_container(data: bytes) -> str | None:
    """The name of a container libsndfile does not read, from its magic bytes."""
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return "WebM/Matroska"
    if data[4:8] == b"ftyp":
        return "MP4/M4A"
    if data.startswith(b"#!AMR"):
        return "AMR"
    if data.startswith(b"\x30\x26\xb2\x75\x8e\x66\xcf\x11"):
        return "WMA/ASF"
    if len(data) > 1 and data[0] == 0xFF and (data[1] & 0xF6) == 0xF0:
        return "AAC (ADTS)"
    if data.startswith(b"MThd"):
        return "MIDI"
    return None


def _native_container(data: bytes) -> str | None:
    """The name of a container libsndfile reads, from its magic bytes."""
    if data.startswith(b"fLaC"):
        return "FLAC"
    if data.startswith(b"FORM") and data[8:12] in (b"AIFF", b"AIFC"):
        return "AIFF"
    if data.startswith(b"ID3"):
        return "MP3"
    return None


def _open_error(data: bytes, wav: _WavHeader | None, e: sf.SoundFileError) -> AudioError:
    unsupported = getattr(e, "code", None) == _SF_ERR_UNSUPPORTED_ENCODING
    if wav is not None and wav.tag in _WAV_PCM_TAGS:
        return AudioError("not_audio", f"audio: the WAV header is invalid ({_detail(e)})")
    if wav is not None:
        # the header is complete (checked before): libsndfile refused its sample format
        return AudioError("unsupported", f"audio: WAV format tag 0x{wav.tag:04x} cannot be decoded; send {_READABLE}")
    if data.startswith(b"OggS"):
        codec = next((name for magic, name in _OGG_CODECS.items() if magic in data[28:64]), None)
        if codec in ("Vorbis", "Opus") and not unsupported:
            return AudioError("not_audio", f"audio: the OGG {codec} file is damaged or cut short and cannot be read")
        return AudioError(
            "unsupported", f"audio: OGG with {codec or 'an unknown'} codec is not supported; send {_READABLE}"
        )
    foreign = _foreign_container(data)
    if foreign is not None:
        return AudioError("unsupported", f"audio: {foreign} is not supported; send {_READABLE}")
    native = _native_container(data)
    if unsupported:
        return AudioError(
            "unsupported", f"audio: this {native or 'audio'} file's encoding is not supported; send {_READABLE}"
        )
    if native is not None:
        return AudioError("not_audio", f"audio: the {native} file is damaged or cut short and cannot be read")
    return AudioError("not_audio", f"audio: not a recognised audio file; send {_READABLE}")

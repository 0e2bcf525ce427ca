"""Recordings as browsers and phones make them (WebM/Opus, M4A/AAC), encoded here with FFmpeg
through PyAV, and files as a writer to a pipe leaves them, for the unit tests of the audio reader
and the gateway's integration tests."""

from __future__ import annotations

import io

import numpy as np


def encode_av(samples, rate, container, codec, layout="mono", options=None, path=None):
    """``samples`` ([frames] or [frames, channels]) encoded with FFmpeg, in memory unless a
    ``path`` is given (an MP4's faststart moves its header in a second pass over the file)."""
    import av

    buf = io.BytesIO() if path is None else str(path)
    planar = np.ascontiguousarray(np.atleast_2d(np.asarray(samples, np.float32).T))
    with av.open(buf, mode="w", format=container, options=options or {}) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(planar, format="fltp", layout=layout)
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue() if path is None else path.read_bytes()


def flac_of_unknown_length(data: bytes) -> bytes:
    """``data`` (a FLAC file) as a writer to a pipe leaves it (``espeak-ng --stdout ... | sox -t
    wav - -t flac -``): STREAMINFO's 36-bit total of samples (bytes 10 to 17 of the block, after
    the 4-byte magic and the 4-byte block header) 0, "unknown", since it could not seek back."""
    out = bytearray(data)
    assert out[:4] == b"fLaC" and out[4] & 0x7F == 0  # STREAMINFO first
    out[8 + 13] &= 0xF0
    out[8 + 14 : 8 + 18] = bytes(4)
    return bytes(out)

"""Recordings as browsers and phones make them (WebM/Opus, M4A/AAC), encoded here with FFmpeg
through PyAV, for the unit tests of the audio reader and the gateway's integration tests."""

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

"""Long audio cut at its pauses into chunks a Whisper window holds, and silence told apart.

Audio over ``max_s`` (15 s by default, the threshold over which the issue wants chunking) is
cut into consecutive ranges that tile it exactly, each at most ``max_s`` long, so chunk
transcripts stream as partials and their offsets are plain sample indices. Where to cut:

- in a pause (a run of quiet 20 ms frames at least ``min_silence_s`` long), the longest one in
  the last half of the window, cut at its middle, so both chunks keep a little silence around
  their words (Whisper was trained on utterances with silence at the edges) and chunks stay
  long (more context per decode, fewer decodes);
- with no such pause in the last half, the longest anywhere in the window past its first
  second; with none at all, the quietest quiet frame (a gap between words shorter than
  ``min_silence_s``): a word is never cut while the window holds any gap;
- with no quiet frame at all (music, steady noise, someone who never stops), hard at ``max_s``.

"Quiet" is relative to the recording: a frame counts as quiet within 10 dB of the noise floor
(the 10th percentile of frame levels), or nearer the floor than the speech level (the 95th
percentile) when the two are less than 20 dB apart, and in any case 12 dB under the speech
level, so a call with a fan in the background cuts in the same places as a studio recording
and steady noise has no pauses at all. Silence is not
trimmed: dropping it would change the offsets segment timestamps are built from, and a chunk
that is all silence is found with ``is_silence`` and answered without the model.
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16_000
FRAME_S = 0.02
# peak frame level under which audio is silence: -50 dBFS is below a whisper at arm's length
# on a phone microphone and above the noise floor of 16-bit audio with dither (about -90)
SILENCE_DBFS = -50.0
_FLOOR_DB = -120.0  # the level of digital zero, so log10 never sees 0
_MIN_CONTRAST_DB = 12.0
_MIN_CHUNK_S = 1.0  # a cut earlier than this in a window would leave a chunk too short to read


def frame_levels(samples: np.ndarray, rate: int = SAMPLE_RATE, frame_s: float = FRAME_S) -> np.ndarray:
    """RMS level in dBFS of each ``frame_s`` frame (the last one partial); each frame's mean is
    removed first, so a DC offset does not read as sound."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    size = max(1, int(round(frame_s * rate)))
    n = -(-len(samples) // size)
    if n == 0:
        return np.zeros(0, np.float64)
    padded = np.zeros(n * size, np.float64)
    padded[: len(samples)] = samples
    frames = padded.reshape(n, size)
    counts = np.full(n, size, np.float64)
    counts[-1] = len(samples) - (n - 1) * size
    mean = frames.sum(axis=1) / counts
    # the partial last frame's zero padding is excluded: its squared deviations are removed
    power = (np.square(frames).sum(axis=1) / counts) - np.square(mean)
    return 10.0 * np.log10(np.maximum(power, 10.0 ** (_FLOOR_DB / 10.0)))


def is_silence(samples: np.ndarray, rate: int = SAMPLE_RATE, threshold_dbfs: float = SILENCE_DBFS) -> bool:
    """True when no 20 ms frame rises above ``threshold_dbfs`` (empty audio included): the
    server answers it with an empty transcript and never runs the model on it."""
    levels = frame_levels(samples, rate)
    return len(levels) == 0 or float(levels.max()) < threshold_dbfs


def split(
    samples: np.ndarray, max_s: float = 15.0, min_silence_s: float = 0.3, rate: int = SAMPLE_RATE
) -> list[tuple[int, int]]:
    """Consecutive ``(start, end)`` sample ranges tiling ``[0, len(samples))``, each at most
    ``max_s`` long, cut in pauses (see the module docstring); ``[]`` for no samples."""
    n = len(samples)
    limit = int(max_s * rate)
    size = max(1, int(round(FRAME_S * rate)))
    if limit < size:
        raise ValueError(f"split: max_s must be at least one {FRAME_S * 1000:g} ms frame, got {max_s}")
    if n == 0:
        return []
    if n <= limit:
        return [(0, n)]
    levels = frame_levels(samples, rate)
    quiet = levels < _quiet_threshold(levels)
    min_run = max(1, int(round(min_silence_s / FRAME_S)))
    window = limit // size  # whole frames per chunk, so a cut on a frame edge never exceeds max_s
    earliest = min(window - 1, max(1, int(_MIN_CHUNK_S / FRAME_S)))
    cuts, start = [], 0
    while n - start * size > limit:
        cut = _cut_in(quiet, levels, start, window, min_run, earliest)
        cuts.append(cut * size)
        start = cut
    bounds = [0, *cuts, n]
    return list(zip(bounds[:-1], bounds[1:]))


def _quiet_threshold(levels: np.ndarray) -> float:
    floor, speech = np.percentile(levels, 10), np.percentile(levels, 95)
    # within 10 dB of the floor: soft consonants sit well under the speech level, so halfway
    # would call them quiet; halfway only when floor and speech are under 20 dB apart (noise);
    # and always 12 dB under speech, so steady noise's frame-to-frame wobble is no pause
    return float(min(floor + min(10.0, (speech - floor) / 2.0), speech - _MIN_CONTRAST_DB))


def _cut_in(quiet: np.ndarray, levels: np.ndarray, start: int, window: int, min_run: int, earliest: int) -> int:
    """The frame index where the chunk starting at frame ``start`` ends."""
    end = start + window
    runs = _runs(quiet[start:end])  # (first, length) relative to start
    for lo in (window // 2, earliest):
        pauses = [(length, first) for first, length in runs if length >= min_run and first + length // 2 >= lo]
        if pauses:
            length, first = max(pauses)  # the longest; the latest among equals
            return start + max(lo, first + length // 2)
    gaps = [i for i in range(earliest, window) if quiet[start + i]]
    if gaps:
        return start + min(gaps, key=lambda i: (levels[start + i], -i))
    return end


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(first index, length) of each run of True."""
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2])]

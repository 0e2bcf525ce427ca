"""switchboard.asr.segment: long audio cut in its pauses, never past max_s, silence told apart."""

import numpy as np
import pytest

from switchboard.asr.segment import frame_levels, is_silence, split

RATE = 16_000


def speech(seconds, seed=0, amp=0.3):
    """A stand-in for a phrase: a tone with syllable-rate wobble plus a little noise, never quiet."""
    t = np.arange(int(seconds * RATE)) / RATE
    wobble = 1.0 + 0.5 * np.sin(2 * np.pi * 3.0 * t)
    noise = np.random.default_rng(seed).standard_normal(len(t))
    return (amp * (np.sin(2 * np.pi * 220 * t) * wobble + 0.05 * noise) / 1.6).astype(np.float32)


def pause(seconds, level=0.0, seed=1):
    return (level * np.random.default_rng(seed).standard_normal(int(seconds * RATE))).astype(np.float32)


def phrases(*parts):
    """Concatenate ("s", seconds) speech and ("p", seconds) pauses; also return the pause ranges."""
    pieces, pauses, pos = [], [], 0
    for i, (kind, seconds) in enumerate(parts):
        piece = speech(seconds, seed=i) if kind == "s" else pause(seconds, level=0.002, seed=i)
        if kind == "p":
            pauses.append((pos, pos + len(piece)))
        pieces.append(piece)
        pos += len(piece)
    return np.concatenate(pieces), pauses


def check_tiling(ranges, n, max_s=15.0):
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(0 < end - start <= max_s * RATE for start, end in ranges)


def in_a_pause(cut, pauses):
    return any(lo <= cut < hi for lo, hi in pauses)


def test_short_audio_is_one_whole_chunk():
    x = np.concatenate([pause(1.0), speech(3.0), pause(2.0)])
    assert split(x) == [(0, len(x))]
    assert split(speech(15.0)) == [(0, 15 * RATE)]
    assert split(np.zeros(0, np.float32)) == []


def test_long_audio_is_cut_in_the_pauses():
    x, pauses = phrases(*[("s", 3.7), ("p", 0.5)] * 10)  # 42 s
    ranges = split(x)
    check_tiling(ranges, len(x))
    assert len(ranges) == 4  # chunks as long as the pauses allow, not every pause
    for _, cut in ranges[:-1]:
        assert in_a_pause(cut, pauses)


def test_the_cut_is_in_the_middle_of_the_longest_pause_in_the_last_half():
    x, pauses = phrases(("s", 9.0), ("p", 1.2), ("s", 2.0), ("p", 0.4), ("s", 10.0))
    (_, cut), _ = split(x)
    lo, hi = pauses[0]
    assert abs(cut - (lo + hi) // 2) <= 0.02 * RATE


def test_a_pause_early_in_the_window_beats_a_cut_in_a_word():
    x, pauses = phrases(("s", 4.0), ("p", 0.5), ("s", 14.0))
    ranges = split(x)
    check_tiling(ranges, len(x))
    assert in_a_pause(ranges[0][1], pauses)


def test_a_gap_shorter_than_min_silence_is_still_better_than_a_word():
    x, pauses = phrases(("s", 11.0), ("p", 0.1), ("s", 9.0))
    ranges = split(x, min_silence_s=0.3)
    check_tiling(ranges, len(x))
    assert in_a_pause(ranges[0][1], pauses)


def test_no_pause_at_all_is_cut_hard_at_max_s():
    noise = (0.3 * np.random.default_rng(0).standard_normal(40 * RATE)).astype(np.float32)
    ranges = split(noise, max_s=15.0)
    check_tiling(ranges, len(noise))
    assert all(end - start >= 14.9 * RATE for start, end in ranges[:-1])


def test_noisy_background_still_finds_the_pauses():
    x, pauses = phrases(*[("s", 5.0), ("p", 0.6)] * 6)
    x = x + (0.02 * np.random.default_rng(5).standard_normal(len(x))).astype(np.float32)  # a fan
    ranges = split(x, max_s=12.0)
    check_tiling(ranges, len(x), max_s=12.0)
    for _, cut in ranges[:-1]:
        assert in_a_pause(cut, pauses)


@pytest.mark.parametrize("max_s, rate", [(5.0, 16_000), (15.0, 8_000), (30.0, 16_000), (0.5, 16_000)])
def test_no_chunk_exceeds_max_s_at_any_setting(max_s, rate):
    x = np.tile(np.concatenate([speech(1.3), pause(0.35)]), 50)
    ranges = split(x, max_s=max_s, rate=rate)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(x)
    assert all(0 < end - start <= max_s * rate for start, end in ranges)


def test_too_small_a_max_s_is_refused():
    with pytest.raises(ValueError, match="max_s"):
        split(speech(1.0), max_s=0.001)


def test_silence():
    assert is_silence(np.zeros(RATE, np.float32))
    assert is_silence(np.zeros(0, np.float32))
    assert is_silence(pause(2.0, level=0.001))  # -60 dBFS of hiss
    assert is_silence(np.full(RATE, 0.5, np.float32))  # a DC offset is not sound
    assert not is_silence(pause(2.0, level=0.01))  # -40 dBFS: someone is there
    assert not is_silence(np.concatenate([np.zeros(5 * RATE, np.float32), speech(0.1)]))


def test_frame_levels_in_dbfs():
    full = np.sin(2 * np.pi * 1000 * np.arange(RATE) / RATE).astype(np.float32)
    levels = frame_levels(full)
    assert len(levels) == 50
    assert np.allclose(levels, 20 * np.log10(1 / np.sqrt(2)), atol=0.1)  # a full-scale sine: -3 dBFS
    assert len(frame_levels(full[:330])) == 2  # a partial last frame counts
    assert frame_levels(np.zeros(320, np.float32))[0] == pytest.approx(-120.0)

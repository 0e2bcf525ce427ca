"""Whisper's log-mel features in NumPy, equal to transformers' ``WhisperFeatureExtractor``.

The serving path must not import transformers (the Triton stub loads it in seconds), so the
mel filter bank and the STFT are computed here; ``tests/unit/test_asr_features.py`` holds them
to transformers' own within float32 rounding.

Two ways to frame audio:
- ``frames=None``: the features of the samples as they are (variable-length models, trained
  on batches padded to their longest item with the value zero-padded samples get, so a padded
  item reads as Whisper's window padded with silence);
- ``frames=N``: the samples zero-padded (or cut) to ``N`` frames first, as pretrained Whisper
  expects (N = 3,000 for its 30 s window); the same numbers transformers gives.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

SAMPLE_RATE = 16_000
N_FFT = 400
HOP = 160
SILENCE = -1.5  # every feature of all-zero samples: (log10(1e-10) + 4) / 4

# A pretrained Whisper reads a 30 s window, nine tenths silence for a 3 s question. Padded to a
# shorter window it hears as well, as long as the window leaves it about 7 s after the speech
# (with less it starts to invent words): docs/benchmarks.md. ``fitted_frames`` picks it.
SHORT_WINDOWS_S = (10.0, 15.0, 20.0)
WINDOW_ROOM_S = 7.0


def _hz_to_mel(hz):
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    mel = 3.0 * hz / 200.0
    log_region = hz >= 1000.0
    return np.where(log_region, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) * (27.0 / np.log(6.4)), mel)


def _mel_to_hz(mel):
    mel = np.asarray(mel, dtype=np.float64)
    hz = 200.0 * mel / 3.0
    log_region = mel >= 15.0
    return np.where(log_region, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mel - 15.0)), hz)


@lru_cache(maxsize=4)
def mel_filters(n_mels: int, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """[n_fft // 2 + 1, n_mels] triangular filters, Slaney-normalized (librosa's and Whisper's)."""
    n_freqs = n_fft // 2 + 1
    fft_freqs = np.linspace(0, sample_rate // 2, n_freqs)
    mel_points = np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), n_mels + 2)
    filter_freqs = _mel_to_hz(mel_points)
    diff = np.diff(filter_freqs)
    slopes = filter_freqs[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    bank = np.maximum(0.0, np.minimum(down, up))
    bank *= (2.0 / (filter_freqs[2 : n_mels + 2] - filter_freqs[:n_mels]))[None, :]
    return bank.astype(np.float32)


@lru_cache(maxsize=1)
def _window() -> np.ndarray:
    # periodic Hann, as torch.hann_window and transformers' window_function
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float64)


def log_mel(samples: np.ndarray, n_mels: int = 80, frames: int | None = None, hop: int = HOP) -> np.ndarray:
    """[n_mels, frames] features of 16 kHz mono float samples in [-1, 1].

    Without ``frames`` the result has ``len(samples) // hop`` frames (at least 1). ``hop``: samples
    between frames (Whisper's 160, 10 ms; the embedded default's 320)."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    if frames is None:
        return _scaled(_log_power(samples, n_mels, hop))
    # Padded to the window, a 3 s question is 90% zeros. A frame whose 400 samples are all zeros
    # has no power, so only the frames that reach the spoken samples go through the FFT; the
    # rest are the floor, as the FFT would have made them (a tenth of the work on a 30 s window).
    spoken = min(len(samples), frames * hop)
    live = min(frames, (spoken + N_FFT // 2) // hop + 2)  # every frame reaching a spoken sample
    want = min(frames, live + N_FFT // hop + 1) * hop  # those frames' samples, trailing zeros included
    head = samples[:want] if spoken >= want else np.pad(samples[:spoken], (0, want - spoken))
    log_spec = np.full((n_mels, frames), _FLOOR)
    log_spec[:, :live] = _log_power(head, n_mels, hop)[:, :live]
    return _scaled(log_spec)


_FLOOR = -10.0  # log10 of the power floor: what a frame of zeros gets


def _log_power(samples: np.ndarray, n_mels: int, hop: int = HOP) -> np.ndarray:
    """[n_mels, len(samples) // hop] log10 mel power (at least one frame), before Whisper's clamp."""
    if len(samples) < hop:  # at least one frame: a click of a few samples is still audio
        samples = np.pad(samples, (0, hop - len(samples)))
    pad = N_FFT // 2
    padded = np.pad(samples.astype(np.float64), (pad, pad), mode="reflect" if len(samples) > pad else "constant")
    n_frames = 1 + (len(padded) - N_FFT) // hop
    strides = (padded.strides[0] * hop, padded.strides[0])
    framed = np.lib.stride_tricks.as_strided(padded, shape=(n_frames, N_FFT), strides=strides)
    spec = np.abs(np.fft.rfft(framed * _window(), n=N_FFT)) ** 2  # [frames, freqs]
    mel = spec @ mel_filters(n_mels).astype(np.float64)  # [frames, n_mels]
    return np.log10(np.maximum(mel, 10**_FLOOR)).T[:, :-1]


def _scaled(log_spec: np.ndarray) -> np.ndarray:
    """Whisper's clamp (8 below the loudest) and scale."""
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


def fitted_frames(frames: int, window: int, hop: int = HOP) -> int:
    """The window ``frames`` frames of audio are padded to for a model whose encoder reads
    ``window`` frames: the shortest of ``SHORT_WINDOWS_S`` under ``window`` that leaves
    ``WINDOW_ROOM_S`` after the audio, else ``window``."""
    room = WINDOW_ROOM_S * SAMPLE_RATE / hop
    return next((n for n in window_lengths(window, hop) if n >= frames + room), window)


def window_lengths(window: int, hop: int = HOP) -> list[int]:
    """Every length ``fitted_frames`` gives for a model of ``window`` frames, shortest first."""
    per_s = SAMPLE_RATE / hop
    short = [int(round(s * per_s)) for s in SHORT_WINDOWS_S]
    return [n for n in short if WINDOW_ROOM_S * per_s <= n < window] + [window]


def pad_batch(features: list[np.ndarray], frames: int | None = None) -> np.ndarray:
    """[batch, n_mels, T] from per-item [n_mels, t_i]: T = ``frames`` or the longest t_i; each
    shorter item padded with what zero samples get after Whisper's clamp: its maximum less 2
    (the clamp is 8 below the maximum in log10 units, /4 after scaling), but no lower than the
    features of pure silence, -1.5."""
    longest = frames or max(f.shape[1] for f in features)
    out = np.empty((len(features), features[0].shape[0], longest), dtype=np.float32)
    for i, f in enumerate(features):
        n = min(longest, f.shape[1])
        out[i, :, :n] = f[:, :n]
        out[i, :, n:] = max(float(f.max()) - 2.0, SILENCE)
    return out

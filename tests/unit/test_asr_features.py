"""switchboard.asr.features against transformers' WhisperFeatureExtractor, the reference the
serving path reimplements in NumPy (at 80 mels, Whisper v1-v2 and tiny.en, and 128, v3)."""

import numpy as np
import pytest

from switchboard.asr.features import HOP, SAMPLE_RATE, fitted_frames, log_mel, mel_filters, pad_batch, window_lengths

transformers = pytest.importorskip("transformers")

RATE = SAMPLE_RATE


@pytest.fixture(scope="module", params=[80, 128])
def extractor(request):
    return transformers.WhisperFeatureExtractor(feature_size=request.param)


def signals():
    rng = np.random.default_rng(0)
    t = np.arange(int(2.5 * RATE)) / RATE
    quiet = np.zeros(RATE // 4, np.float32)
    return {
        "tone": (0.4 * np.sin(2 * np.pi * 440 * t)).astype(np.float32),
        "noise": (0.1 * rng.standard_normal(RATE * 3)).astype(np.float32),
        "word in silence": np.concatenate(
            [quiet, (0.3 * np.sin(2 * np.pi * 300 * t[:8000])).astype(np.float32), quiet]
        ),
        "odd length": (0.2 * rng.standard_normal(12_345)).astype(np.float32),
        "over 30 s": (0.05 * rng.standard_normal(31 * RATE)).astype(np.float32),
    }


def reference(extractor, samples, **kw):
    return extractor(samples, sampling_rate=RATE, return_tensors="np", **kw).input_features


@pytest.mark.parametrize("name", list(signals()))
def test_30_s_window_equals_transformers(extractor, name):
    x = signals()[name]
    ours = log_mel(x, extractor.feature_size, frames=3000)
    ref = reference(extractor, x)[0]
    assert ours.shape == ref.shape == (extractor.feature_size, 3000)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, atol=1e-4)


@pytest.mark.parametrize("name", ["tone", "noise", "word in silence", "odd length"])
def test_variable_length_equals_transformers_unpadded(extractor, name):
    x = signals()[name]
    ours = log_mel(x, extractor.feature_size)
    ref = reference(extractor, x, padding="longest")[0]
    assert ours.shape == ref.shape == (extractor.feature_size, len(x) // HOP)
    np.testing.assert_allclose(ours, ref, atol=1e-4)


@pytest.mark.parametrize(
    "n",
    [
        0,
        1,
        100,
        160,
        161,
        399,
        401,
        4807,
    ],
)
def test_variable_length_shape_is_samples_over_hop(n):
    f = log_mel(np.full(n, 0.1, np.float32), 80)
    assert f.shape == (80, max(1, n // HOP))
    assert np.isfinite(f).all()


def test_frames_cuts_or_pads_to_exactly_that_many():
    x = signals()["noise"]
    assert log_mel(x, 80, frames=100).shape == (80, 100)
    assert log_mel(x, 80, frames=1000).shape == (80, 1000)


def test_mel_filters_match_transformers(extractor):
    np.testing.assert_allclose(mel_filters(extractor.feature_size), extractor.mel_filters, atol=1e-6)


def test_pad_batch_shape_and_content():
    x = signals()
    feats = [log_mel(x["tone"], 80), log_mel(x["word in silence"], 80), log_mel(x["odd length"], 80)]
    batch = pad_batch(feats)
    longest = max(f.shape[1] for f in feats)
    assert batch.shape == (3, 80, longest) and batch.dtype == np.float32
    for row, f in zip(batch, feats):
        n = f.shape[1]
        assert np.array_equal(row[:, :n], f)
        assert np.all(row[:, n:] == max(f.max() - 2.0, -1.5))
    fixed = pad_batch(feats, frames=3000)
    assert fixed.shape == (3, 80, 3000)
    assert pad_batch(feats, frames=50).shape == (3, 80, 50)  # cut to the window
    assert np.array_equal(pad_batch(feats, frames=50)[0], feats[0][:, :50])


def test_pad_batch_equals_whisper_zero_padding_for_audio_with_silence(extractor):
    """An item that reaches Whisper's floor (any quiet moment) pads exactly as zeros would."""
    x = signals()
    long, short = x["tone"], x["word in silence"]
    ref = reference(extractor, [long, short], padding="longest")
    ours = pad_batch([log_mel(long, extractor.feature_size), log_mel(short, extractor.feature_size)])
    np.testing.assert_allclose(ours, ref, atol=1e-4)


def test_pad_batch_equals_whisper_zero_padding_for_audio_without_silence():
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    x = signals()
    long, noisy = x["tone"], x["odd length"]
    ref = reference(extractor, [long, noisy], padding="longest")[1]
    ours = pad_batch([log_mel(long), log_mel(noisy)])[1]
    n = len(noisy) // HOP
    # past the frames whose STFT window still overlaps the audio's end
    np.testing.assert_allclose(ours[:, n + 2 :], ref[:, n + 2 :], atol=1e-4)


@pytest.mark.parametrize("n", [0, 1, 159, 199, 200, 201, 400, 48_000, 479_801, 480_000, 600_000])
@pytest.mark.parametrize("frames", [1, 3, 500, 3000])
@pytest.mark.parametrize("hop", [HOP, 320])
def test_windowed_features_skip_only_frames_of_zeros(n, frames, hop):
    """log_mel puts through the FFT only the frames that reach spoken samples (the window's
    zero padding is the floor): the result is the full window's, to the bit."""
    from switchboard.asr import features

    samples = (np.random.default_rng(n).standard_normal(n) * 0.1).astype(np.float32)
    want = frames * hop
    full = samples[:want] if n >= want else np.pad(samples, (0, want - n))
    expected = features._scaled(features._log_power(full, 80, hop))
    np.testing.assert_array_equal(log_mel(samples, 80, frames=frames, hop=hop), expected)


@pytest.mark.parametrize("frames", [None, 250])
def test_a_20_ms_hop_equals_transformers(frames):
    """The embedded default's features (``hop_length`` 320) are transformers' with that hop."""
    extractor = transformers.WhisperFeatureExtractor(feature_size=80, hop_length=320, chunk_length=5)
    samples = (np.random.default_rng(7).standard_normal(30_000) * 0.1).astype(np.float32)
    if frames is None:
        want = extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="np", padding=False)
        want = want.input_features[0][:, : len(samples) // 320]
    else:
        want = extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features[0]
    got = log_mel(samples, 80, frames=frames, hop=320)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-4)


@pytest.mark.parametrize(
    "seconds,window",
    [(0.01, 1000), (2.0, 1000), (3.0, 1000), (3.01, 1500), (8.0, 1500), (13.0, 2000), (13.01, 3000), (30.0, 3000)],
)
def test_a_fitted_window_leaves_7_s_after_the_audio(seconds, window):
    frames = int(round(seconds * SAMPLE_RATE / HOP))
    assert fitted_frames(frames, 3000) == window
    assert window in window_lengths(3000)


def test_fitted_windows_are_shorter_than_the_models_own():
    assert window_lengths(3000) == [1000, 1500, 2000, 3000]
    assert window_lengths(1500) == [1000, 1500]  # a 15 s window: 10 s at most
    # the embedded default's 5 s window at 20 ms frames has none shorter that leaves 7 s
    assert window_lengths(250, hop=320) == [250]
    assert fitted_frames(10, 250, hop=320) == 250
    assert fitted_frames(100, 3000, hop=320) == 500  # 2 s at 20 ms frames: 10 s, 500 of them

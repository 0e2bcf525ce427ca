"""The tiny Whisper shape the export tests build: two 64-wide layers on each side, 80 mel bins.
Each test names what differs (vocabulary, special ids, positions, init)."""

from transformers import WhisperConfig


def config(**overrides) -> WhisperConfig:
    shape = dict(
        num_mel_bins=80,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
    )
    return WhisperConfig(**{**shape, **overrides})

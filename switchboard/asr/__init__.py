"""Speech recognition for the voice channel: audio decoding, Whisper features, length-aware
batching, greedy decoding over an exported Whisper. Imports without Triton."""

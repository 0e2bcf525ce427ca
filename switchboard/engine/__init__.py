"""Generation engine: ONNX Runtime decoder, KV batch, priority scheduler (no Triton here)."""

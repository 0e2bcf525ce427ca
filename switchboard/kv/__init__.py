"""KV cache blocks: content-addressed, verified, in an engine-local tier and in Redis."""

"""The embedded default model: a small Llama trained from the repository's corpus."""

"""Training: the corpus, and the embedded default model (a small Llama trained from it)."""

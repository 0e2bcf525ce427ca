"""A causal LM's shape as the exported graph and the KV cache see it, read from its Hugging Face
config: what the exporter writes into the manifest and what a runtime that loads the checkpoint
itself (``runtime: torch``) checks it against."""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED = {"llama", "qwen2", "mistral", "gpt2", "gemma3_text"}


@dataclass(frozen=True)
class Geometry:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_window: int


def geometry(config) -> Geometry:
    if config.model_type not in SUPPORTED:
        raise ValueError(
            f"unsupported architecture {config.model_type!r} "
            f"({', '.join(config.architectures or [])}); supported: {', '.join(sorted(SUPPORTED))}"
        )
    heads = config.num_attention_heads
    context = config.max_position_embeddings
    window = getattr(config, "sliding_window", None)
    mixed = "sliding_attention" in (getattr(config, "layer_types", None) or ())
    if window and getattr(config, "use_sliding_window", True) and not mixed:
        # Every layer slides (Mistral): the exported graph keeps the whole cache, which within
        # the window is exactly sliding-window attention, so the context is capped at the window.
        # Layers that mix windows (Gemma 3) get masks counted in positions instead
        # (engine/masks.py), and the context is the model's own.
        context = min(context, int(window))
    return Geometry(
        num_layers=config.num_hidden_layers,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab_size=config.vocab_size,
        context_window=context,
    )


def mismatches(geo: Geometry, manifest) -> list[str]:
    """The fields in which ``geo`` and the manifest's model differ, as "name a != b"."""
    return [
        f"{name} {getattr(geo, name)} != {getattr(manifest, name)}"
        for name in ("num_layers", "num_kv_heads", "head_dim", "vocab_size")
        if getattr(geo, name) != getattr(manifest, name)
    ]

"""A tiny Whisper trained on inputs of their own length, and its greedy decoding.

The architecture is transformers' ``WhisperForConditionalGeneration`` unchanged, so the
checkpoint loads and exports like any Whisper. What differs is the input: pretrained Whisper
always sees 30 s windows (3,000 frames), most of them padding for a 3 s question; this model
sees the features of the audio as it is, batches padded to their longest item, and the
encoder adds only the first ``T'`` rows of its (sinusoidal) position table. transformers'
``WhisperEncoder.forward`` refuses any other length than ``2 * max_source_positions``, hence
``encode_variable_length``; its config says so with ``"switchboard_window_frames": null``.

Deterministic for a given data set, seed and thread count: seeded initialization, batch
order and masking, a fixed number of steps (never a time budget). FP32 throughout (see
``switchboard.training.train`` for why).
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from switchboard.asr import features as feat
from switchboard.training.asr import data as data_mod

log = logging.getLogger(__name__)
IGNORE = -100


@dataclass(frozen=True)
class ModelConfig:
    """Size of the model and how it is trained."""

    d_model: int = 192
    encoder_layers: int = 3
    decoder_layers: int = 2
    heads: int = 4
    ffn: int = 768
    vocab_size: int = 1200  # learned BPE tokens; the special tokens come on top
    max_source_positions: int = 750  # 15 s: the longest chunk the serving path sends
    max_target_positions: int = 160
    steps: int = 1500
    batch_frames: int = 9000  # audio frames per batch, padding included (90 s)
    max_batch: int = 48
    lr: float = 2e-3
    warmup: int = 150
    weight_decay: float = 0.01
    label_smoothing: float = 0.1
    dropout: float = 0.0
    warp: float = 0.1  # mel axis stretched by a factor in [1 - warp, 1 + warp] per item (VTLP)
    freq_masks: int = 2  # SpecAugment: bands of mel bins blanked per item...
    freq_width: int = 10
    time_masks: int = 2  # ...and stretches of frames, each up to time_width of the item
    time_width: float = 0.06
    seed: int = 0


def whisper_config(cfg: ModelConfig, vocab_size: int, ids: dict[str, int]):
    from transformers import WhisperConfig

    return WhisperConfig(
        vocab_size=vocab_size,
        num_mel_bins=80,
        d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.heads,
        decoder_attention_heads=cfg.heads,
        encoder_ffn_dim=cfg.ffn,
        decoder_ffn_dim=cfg.ffn,
        max_source_positions=cfg.max_source_positions,
        max_target_positions=cfg.max_target_positions,
        dropout=cfg.dropout,
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"],
        decoder_start_token_id=ids["<|startoftranscript|>"],
        begin_suppress_tokens=[ids["<|endoftext|>"]],
        suppress_tokens=[],
        tie_word_embeddings=True,
    )


def encode_variable_length(encoder, features: torch.Tensor) -> torch.Tensor:
    """Whisper's encoder on ``[batch, n_mels, frames]`` features of any length up to
    ``2 * max_source_positions`` frames: conv1, GELU, conv2 (stride 2), GELU, plus the first
    ``ceil(frames / 2)`` position rows, the layers, the final norm. ``[batch, T', d_model]``."""
    frames = features.shape[-1]
    limit = 2 * encoder.config.max_source_positions
    if frames > limit:
        raise ValueError(
            f"{frames} frames: this encoder takes at most {limit} ({limit * feat.HOP / feat.SAMPLE_RATE:.0f} s)"
        )
    x = nn.functional.gelu(encoder.conv1(features))
    x = nn.functional.gelu(encoder.conv2(x)).permute(0, 2, 1)
    x = x + encoder.embed_positions.weight[: x.shape[1]]
    x = nn.functional.dropout(x, p=encoder.dropout, training=encoder.training)
    for layer in encoder.layers:
        x = layer(x, None)
    return encoder.layer_norm(x)


def logits(model, encoded: torch.Tensor, decoder_ids: torch.Tensor) -> torch.Tensor:
    hidden = model.model.decoder(input_ids=decoder_ids, encoder_hidden_states=encoded, use_cache=False)
    return model.proj_out(hidden.last_hidden_state)


def prompt(ids: dict[str, int], lang: str) -> list[int]:
    """The decoder's forced start: start of transcript, language, task, no timestamps."""
    return [ids["<|startoftranscript|>"], ids[f"<|{lang}|>"], ids["<|transcribe|>"], ids["<|notimestamps|>"]]


def token_sequences(tok, items: list[data_mod.Utterance], ids: dict[str, int], limit: int) -> list[list[int]]:
    """Prompt + transcript + end of text for every item, cut to ``limit`` tokens (an item that
    long would not fit the decoder; the cut one still trains its start)."""
    out = []
    for u in items:
        text = tok.encode(u.text, add_special_tokens=False).ids
        out.append((prompt(ids, u.lang) + text + [ids["<|endoftext|>"]])[:limit])
    return out


def _batch(
    data: data_mod.Dataset, seqs: list[list[int]], index: list[int], pad_id: int, cfg: ModelConfig, rng
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = feat.pad_batch([data.features[i].astype(np.float32) for i in index])
    _augment_features(x, [data.features[i].shape[1] for i in index], cfg, rng)
    longest = max(len(seqs[i]) for i in index)
    dec = torch.full((len(index), longest - 1), pad_id, dtype=torch.long)
    labels = torch.full((len(index), longest - 1), IGNORE, dtype=torch.long)
    for row, i in enumerate(index):
        s = torch.tensor(seqs[i])
        dec[row, : len(s) - 1] = s[:-1]
        labels[row, : len(s) - 1] = s[1:]
    # The tokens after the language are forced at inference: nothing to learn there.
    labels[:, 1:3] = IGNORE
    return torch.from_numpy(x), dec, labels


def _augment_features(x: np.ndarray, lengths: list[int], cfg: ModelConfig, rng: np.random.Generator) -> None:
    """In place, per item: the mel axis stretched or squeezed a little (vocal tract length
    perturbation: another speaker's formants, where espeak-ng's voices share their engine's),
    then random mel bands and stretches of time blanked with the item's floor (SpecAugment).
    Cheap, and new on every pass over the data, unlike the waveform augmentation."""
    n_mels = x.shape[1]
    for row, length in enumerate(lengths):
        floor = x[row].min()
        if cfg.warp > 0:
            src = np.clip(np.arange(n_mels) / rng.uniform(1 - cfg.warp, 1 + cfg.warp), 0, n_mels - 1)
            lo = np.floor(src).astype(int)
            hi = np.minimum(lo + 1, n_mels - 1)
            w = (src - lo)[:, None].astype(np.float32)
            x[row] = x[row, lo] * (1 - w) + x[row, hi] * w
        for _ in range(cfg.freq_masks):
            w = int(rng.integers(0, cfg.freq_width + 1))
            f0 = int(rng.integers(0, n_mels - w + 1))
            x[row, f0 : f0 + w, :length] = floor
        for _ in range(cfg.time_masks):
            w = int(rng.integers(0, int(cfg.time_width * length) + 1))
            t0 = int(rng.integers(0, length - w + 1))
            x[row, :, t0 : t0 + w] = floor


def learning_rate(step: int, cfg: ModelConfig) -> float:
    """Linear warmup, then cosine decay to a tenth."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, data: data_mod.Dataset, seqs: list[list[int]], pad_id: int, cfg: ModelConfig, bar=None) -> list[float]:
    """``cfg.steps`` AdamW steps; the loss of every step."""
    model.train()
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )
    order = data_mod.batches(data.frames, cfg.batch_frames, cfg.max_batch, random.Random(cfg.seed))
    rng = np.random.default_rng(cfg.seed)
    loss_fn = nn.CrossEntropyLoss(ignore_index=IGNORE, label_smoothing=cfg.label_smoothing)
    losses: list[float] = []
    t0 = time.monotonic()
    for step in range(cfg.steps):
        x, dec, labels = _batch(data, seqs, next(order), pad_id, cfg, rng)
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, cfg)
        out = logits(model, encode_variable_length(model.model.encoder, x), dec)
        loss = loss_fn(out.reshape(-1, out.shape[-1]), labels.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}", refresh=False)
        if step % 100 == 0 or step == cfg.steps - 1:
            log.info(
                "step %d: loss %.4f, lr %.2e, batch %s, %.0f s",
                step,
                loss.item(),
                learning_rate(step, cfg),
                tuple(x.shape),
                time.monotonic() - t0,
            )
    model.eval()
    return losses


@torch.no_grad()
def greedy_decode(
    model, features: torch.Tensor, prompts: list[list[int]], eot: int, max_new_tokens: int | None = None
) -> list[list[int]]:
    """Greedy transcripts (token ids after the prompt, without end of text) of a batch of
    ``[batch, n_mels, frames]`` features; all prompts have the same length. The decoder's
    keys and values are kept between steps; end of text is suppressed at the first step, as
    Whisper's ``begin_suppress_tokens`` does."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    encoded = encode_variable_length(model.model.encoder, features)
    limit = model.config.max_target_positions - len(prompts[0])
    steps = min(limit, max_new_tokens or limit)
    ids = torch.tensor(prompts, dtype=torch.long)
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    done = torch.zeros(len(prompts), dtype=torch.bool)
    out: list[list[int]] = [[] for _ in prompts]
    step_input = ids
    for step in range(steps):
        hidden = model.model.decoder(
            input_ids=step_input, encoder_hidden_states=encoded, past_key_values=cache, use_cache=True
        )
        cache = hidden.past_key_values
        scores = model.proj_out(hidden.last_hidden_state[:, -1])
        if step == 0:
            scores[:, eot] = -math.inf
        nxt = scores.argmax(-1)
        for row in range(len(prompts)):
            if not done[row]:
                if nxt[row].item() == eot:
                    done[row] = True
                else:
                    out[row].append(nxt[row].item())
        if bool(done.all()):
            break
        step_input = nxt[:, None]
    return out

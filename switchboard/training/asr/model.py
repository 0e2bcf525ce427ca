"""A tiny Whisper with a short window, trained from scratch, and its greedy decoding.

The architecture is transformers' ``WhisperForConditionalGeneration`` unchanged, so the
checkpoint loads and exports like any Whisper, and so is the input contract: every input is
padded with silence to one fixed window, here 5 s instead of pretrained Whisper's 30 s, of
feature frames 20 ms apart instead of 10 (250 frames; ``hop_length`` 320 in its
preprocessor_config.json): half the encoder's work per utterance. The serving path cuts longer
audio at its pauses into chunks that fit (``switchboard.asr.segment``), and a caller's question
is rarely longer. Its config says so with ``"switchboard_window_frames": 250``.

Why a fixed window: the recipe the issue measured (d_model 128, 2 + 2 layers, characters,
inputs padded to 5 s, batches of 24) learns to align sound and text in under a thousand
steps on 2 cores; the variable-length variant tried first (batches padded to their longest
item, a 1,200-token BPE, CTC and guided-attention aids) did not within 2,000 steps
(docs/voice.md).

Deterministic for a given data set, seed and thread count: seeded initialization, batch
order and masking, a fixed number of steps (never a time budget). FP32 throughout (see
``switchboard.training.chat.train`` for why).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from switchboard.asr import features as feat
from switchboard.data import speech
from switchboard.training.asr import data as data_mod

log = logging.getLogger(__name__)
IGNORE = -100
PROMPT_LEN = 4  # <|startoftranscript|> <|lang|> <|transcribe|> <|notimestamps|>


@dataclass(frozen=True)
class ModelConfig:
    """Size of the model and how it is trained."""

    d_model: int = 128
    encoder_layers: int = 2
    decoder_layers: int = 2
    heads: int = 4
    ffn: int = 512
    vocab_size: int = 2000  # at most this many character tokens; the special tokens come on top
    window_frames: int = 250  # 5 s of 20 ms frames: every input is padded to it (max_source_positions = half)
    max_target_positions: int = 128  # characters: 5 s of fast English is about 90
    steps: int = 3400
    batch: int = 24
    lr: float = 2e-3
    warmup: int = 200
    weight_decay: float = 0.01
    dropout: float = 0.0
    label_smoothing: float = 0.0  # of the cross-entropy's targets
    freq_masks: int = 0  # SpecAugment: bands of mel bins blanked per item...
    freq_width: int = 10
    time_masks: int = 0  # ...and stretches of frames, each up to time_width of the window
    time_width: float = 0.05
    vtlp: float = 0.0  # vocal tract length perturbation: each item's frequencies stretched by up to this (0.1: +-10%)
    vtlp_home: float = 1.0  # the share of home-voice items it stretches too (0: only the other voices')
    ema: float = 0.99  # decay of an exponential moving average of the weights, which is what ships (0: the last step's)
    pack: float = 0.0  # share of items spoken on into a second one of their language when both fit the window
    pack_gap_frames: int = 15  # the pause between the two (0.3 s)
    probe_every: int = 1000  # steps between held-out checks in the log (0: none)
    seed: int = 0


def whisper_config(cfg: ModelConfig, vocab_size: int, ids: dict[str, int]):
    from transformers import WhisperConfig

    if cfg.window_frames % 2:
        raise ValueError(f"window_frames {cfg.window_frames}: expected an even number (the encoder halves it)")
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
        max_source_positions=cfg.window_frames // 2,
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


def new_model(cfg: ModelConfig, vocab_size: int, ids: dict[str, int]):
    """A freshly initialized model (transformers' initialization, seeded)."""
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(cfg.seed)
    return WhisperForConditionalGeneration(whisper_config(cfg, vocab_size, ids))


def window_features(samples_features: list[np.ndarray], window_frames: int) -> torch.Tensor:
    """``[batch, n_mels, window_frames]``: each item padded with silence to the window."""
    return torch.from_numpy(feat.pad_batch([f.astype(np.float32) for f in samples_features], window_frames))


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


class Packer:
    """Joins an item to a second utterance of its language, after a pause, when both fit the
    window, with both transcripts in order: more speech per step for the same padded window
    (the corpus's questions fill about half of it), and practice at what the serving path
    sends, a chunk holding more than one sentence. ``joiner[lang]``: the tokens between the
    two transcripts (a space in English, nothing in Mandarin)."""

    def __init__(self, data: data_mod.Dataset, seqs: list[list[int]], joiner: dict[str, list[int]], cfg: ModelConfig):
        self.data, self.seqs, self.joiner, self.cfg = data, seqs, joiner, cfg
        self.frames = data.frames
        self.by_lang: dict[str, np.ndarray] = {}
        for lang in {u.lang for u in data.items}:
            self.by_lang[lang] = np.array([i for i, u in enumerate(data.items) if u.lang == lang])

    def item(self, i: int, eot: int, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
        f, seq = self.data.features[i], self.seqs[i]
        cfg = self.cfg
        room = cfg.window_frames - self.frames[i] - cfg.pack_gap_frames
        if not cfg.pack or rng.random() >= cfg.pack or room <= 0 or seq[-1] != eot:
            return f, seq
        lang = self.data.items[i].lang
        for j in rng.choice(self.by_lang[lang], size=4):
            j = int(j)
            if j != i and self.frames[j] <= room and self.seqs[j][-1] == eot:
                gap = np.full((f.shape[0], cfg.pack_gap_frames), max(float(f.max()) - 2.0, feat.SILENCE), f.dtype)
                joined = seq[:-1] + self.joiner.get(lang, []) + self.seqs[j][PROMPT_LEN:]
                return np.concatenate([f, gap, self.data.features[j]], axis=1), joined[: cfg.max_target_positions]
        return f, seq


def _batch(
    data: data_mod.Dataset, seqs: list[list[int]], index: list[int], pad_id: int, cfg: ModelConfig, rng, packer=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    pairs = [packer.item(i, pad_id, rng) if packer else (data.features[i], seqs[i]) for i in index]
    x = window_features([f for f, _ in pairs], cfg.window_frames)
    if cfg.vtlp:
        home = [data.items[i].voice == speech.home_voice(data.items[i].lang) for i in index]
        _vtlp(x.numpy(), cfg, rng, home if cfg.vtlp_home < 1 else None)
    if cfg.freq_masks or cfg.time_masks:
        _spec_augment(x.numpy(), cfg, rng)
    longest = max(len(s) for _, s in pairs)
    dec = torch.full((len(index), longest - 1), pad_id, dtype=torch.long)
    labels = torch.full((len(index), longest - 1), IGNORE, dtype=torch.long)
    for row, (_, seq) in enumerate(pairs):
        s = torch.tensor(seq)
        dec[row, : len(s) - 1] = s[:-1]
        labels[row, : len(s) - 1] = s[1:]
    # The tokens after the language are forced at inference: nothing to learn there.
    labels[:, 1 : PROMPT_LEN - 1] = IGNORE
    return x, dec, labels


def _spec_augment(x: np.ndarray, cfg: ModelConfig, rng: np.random.Generator) -> None:
    """In place, per item: random mel bands and stretches of time blanked with the item's
    floor (SpecAugment). New on every pass over the data, unlike the waveform augmentation."""
    n_mels, frames = x.shape[1], x.shape[2]
    for row in range(x.shape[0]):
        floor = x[row].min()
        for _ in range(cfg.freq_masks):
            w = int(rng.integers(0, cfg.freq_width + 1))
            f0 = int(rng.integers(0, n_mels - w + 1))
            x[row, f0 : f0 + w] = floor
        for _ in range(cfg.time_masks):
            w = int(rng.integers(0, int(cfg.time_width * frames) + 1))
            t0 = int(rng.integers(0, frames - w + 1))
            x[row, :, t0 : t0 + w] = floor


def _mel_centers(n_mels: int, top_hz: float = 8000.0) -> np.ndarray:
    """Centre frequencies (Hz) of ``n_mels`` Slaney-scale mel bands up to ``top_hz`` (Whisper's)."""

    def to_mel(f):
        f = np.asarray(f, np.float64)
        return np.where(f < 1000, f * 3 / 200, 15 + np.log(np.maximum(f, 1e-9) / 1000) * 27 / np.log(6.4))

    def to_hz(m):
        return np.where(m < 15, m * 200 / 3, 1000 * np.exp((m - 15) * np.log(6.4) / 27))

    return to_hz(np.linspace(to_mel(0.0), to_mel(top_hz), n_mels + 2)[1:-1])


def _vtlp(x: np.ndarray, cfg: ModelConfig, rng: np.random.Generator, home: list[bool] | None = None) -> None:
    """In place, per item: the frequency axis stretched by a random factor within ``cfg.vtlp``
    (vocal tract length perturbation: the same words from a longer or shorter throat, formants
    moved up or down), the bands read off the item's own by interpolation. ``home``: which
    rows are in the home voice, of which only ``cfg.vtlp_home`` are stretched."""
    n_mels = x.shape[1]
    centers = _mel_centers(n_mels)
    for row in range(x.shape[0]):
        alpha = rng.uniform(1 - cfg.vtlp, 1 + cfg.vtlp)
        if home is not None and home[row] and rng.random() >= cfg.vtlp_home:
            continue
        source = np.interp(centers / alpha, centers, np.arange(n_mels, dtype=np.float64))
        lo = np.floor(source).astype(int)
        hi = np.minimum(lo + 1, n_mels - 1)
        frac = (source - lo).astype(np.float32)[:, None]
        x[row] = (1 - frac) * x[row, lo] + frac * x[row, hi]


class Average:
    """An exponential moving average of ``params`` (``ModelConfig.ema``), which is what ships:
    the weights of the last steps averaged, not the last step's alone. Early on it would hold
    the random start, so the decay grows with the steps, (1 + step) / (10 + step), up to
    ``decay`` (the warm-up of TensorFlow's ``ExponentialMovingAverage`` with ``num_updates``).
    That reaches 0.995 at step 1,790 and 0.998 only at 4,490: within 3,400 steps any decay
    above 0.997 averages the same."""

    def __init__(self, params: list[torch.Tensor], decay: float):
        self.params, self.decay = params, decay
        self.shadow = [p.detach().clone() for p in params]

    def update(self, step: int) -> None:
        decay = min(self.decay, (1 + step) / (10 + step))
        torch._foreach_lerp_(self.shadow, [p.detach() for p in self.params], 1 - decay)

    def apply(self) -> None:
        """The average into the parameters."""
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.shadow)


def learning_rate(step: int, cfg: ModelConfig) -> float:
    """Linear warmup, then cosine decay to a tenth."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def batches(n: int, size: int, rng: random.Random):
    """Endless batches of ``size`` item indices: every item once per epoch, in random order."""
    while True:
        order = list(range(n))
        rng.shuffle(order)
        for start in range(0, n - size + 1 if n >= size else 1, size):
            yield order[start : start + size]


def train(
    model,
    data: data_mod.Dataset,
    seqs: list[list[int]],
    pad_id: int,
    cfg: ModelConfig,
    bar=None,
    probe: Callable[[int], None] | None = None,
    joiner: dict[str, list[int]] | None = None,
) -> list[float]:
    """``cfg.steps`` AdamW steps; the loss of every step. ``probe(step)``, if given, runs
    every ``cfg.probe_every`` steps with the model in eval mode (a progress check in the log)."""
    model.train()
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )
    order = batches(len(seqs), cfg.batch, random.Random(cfg.seed))
    rng = np.random.default_rng(cfg.seed)
    packer = Packer(data, seqs, joiner or {}, cfg) if cfg.pack else None
    average = Average([p for p in model.parameters() if p.requires_grad], cfg.ema) if cfg.ema else None
    losses: list[float] = []
    t0 = time.monotonic()
    for step in range(cfg.steps):
        x, dec, labels = _batch(data, seqs, next(order), pad_id, cfg, rng, packer)
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, cfg)
        out = model(input_features=x, decoder_input_ids=dec, use_cache=False).logits
        loss = nn.functional.cross_entropy(
            out.reshape(-1, out.shape[-1]), labels.reshape(-1), ignore_index=IGNORE, label_smoothing=cfg.label_smoothing
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if average is not None:
            average.update(step)
        losses.append(loss.item())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}", refresh=False)
        if step % 100 == 0 or step == cfg.steps - 1:
            log.info(
                "step %d: loss %.4f, lr %.2e, %.0f s",
                step,
                sum(losses[-100:]) / len(losses[-100:]),
                learning_rate(step, cfg),
                time.monotonic() - t0,
            )
        if probe is not None and cfg.probe_every and (step + 1) % cfg.probe_every == 0 and step + 1 < cfg.steps:
            model.eval()
            probe(step + 1)
            model.train()
    if average is not None:
        average.apply()
    model.eval()
    return losses


@torch.no_grad()
def greedy_decode(
    model, features: torch.Tensor, prompts: list[list[int]], eot: int, max_new_tokens: int | None = None
) -> list[list[int]]:
    """Greedy transcripts (token ids after the prompt, without end of text) of a batch of
    ``[batch, n_mels, window]`` features; all prompts have the same length. The decoder's
    keys and values are kept between steps; end of text is suppressed at the first step, as
    Whisper's ``begin_suppress_tokens`` does."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    encoded = model.model.encoder(features).last_hidden_state
    limit = model.config.max_target_positions - len(prompts[0])
    steps = min(limit, max_new_tokens or limit)
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    done = torch.zeros(len(prompts), dtype=torch.bool)
    out: list[list[int]] = [[] for _ in prompts]
    step_input = torch.tensor(prompts, dtype=torch.long)
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

"""Batched greedy transcription over an exported Whisper, with text deltas streamed per row.

``AsrModel.transcribe`` pads a batch of features (``features.pad_batch``), runs the encoder
once, then decodes every row in lockstep with the KV cache: one decoder call per token for the
whole batch. Rows start from prompts of one length, so they stay aligned and the decoder needs
no attention mask. ``AsrModel.start`` gives the same decoding a step at a time (``Decoding``):
what the speech service's batching loop runs (switchboard/asr/service.py). What Whisper's own
greedy decoding does, done here too:

- ``suppress_tokens`` are never produced, ``begin_suppress_tokens`` (a blank, end of text) not
  as the first token: the same logits processors as transformers' ``WhisperForConditionalGeneration.generate``;
- a multilingual model given no language detects it: one decoder step on the start token
  alone, the most likely of the language tokens (transformers' ``detect_language``); the rest of
  the prompt then follows on that cache. Rows with a language given get it the same way, so the
  batch stays in lockstep;
- a row ends at the end-of-text token, at ``max_new_tokens`` (default: as many as the
  decoder's positions leave after the prompt), or when its caller is gone (``cancelled``).

A finished row leaves the batch: its slice of the self-attention cache and of the encoder's
keys and values is dropped, so the remaining rows' steps read and copy less.

Runaway repetition: on noise, music or a cut-off word, Whisper can fall into a loop, the same
few tokens over and over until its 448 positions run out (openai-whisper re-decodes at a higher
temperature when the text compresses too well). Here a row stops when the end of its output is
one block of at most ``max_period`` tokens repeated at least ``min_copies`` times over at least
``min_tokens`` tokens (defaults: 3 copies, 24 tokens, blocks up to 32): a loop is cut after a
few dozen tokens instead of 400 decoding steps of the whole batch, while what people repeat
("no, no, no", a digit said five times) is far shorter than 24 tokens. The text already
streamed stays; the transcript says ``finish_reason="repetition"``.

Text is streamed with ``IncrementalDetokenizer`` (whole UTF-8 characters only: a Chinese
character is often two byte-level tokens). It is the text as Whisper writes it, the blank
before its first word included, so the deltas of a row add up to its ``Transcript.text`` and
the transcripts of consecutive pieces of one recording join with their words apart; strip it
for display.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from switchboard.asr.features import SAMPLE_RATE, log_mel, pad_batch
from switchboard.asr.runtime import KV, TOKENIZER, AsrManifest
from switchboard.common.detok import IncrementalDetokenizer

EOS, LENGTH, REPETITION, CANCELLED = "eos", "length", "repetition", "cancelled"
# Added tokens that are markup, not text: <|en|>, <|notimestamps|>, <|0.00|>...
_MARKUP = re.compile(r"^<\|.*\|>$")


@dataclass
class Transcript:
    text: str
    language: str | None  # the given or detected language code
    tokens: list[int]  # the generated tokens, without the prompt and the end-of-text token
    finish_reason: str = EOS  # eos, length, repetition or cancelled


@dataclass(frozen=True)
class Repetition:
    """When a row counts as looping (see the module docstring)."""

    min_copies: int = 3
    min_tokens: int = 24
    max_period: int = 32

    def looping(self, tokens: list[int]) -> bool:
        for period in range(1, self.max_period + 1):
            span = max(self.min_tokens, self.min_copies * period)
            if len(tokens) < span:
                break
            tail = tokens[-span:]
            if tail[period:] == tail[:-period]:
                return True
        return False


class Runtime(Protocol):
    """What decoding needs from an exported Whisper (``runtime.OnnxWhisper``; fakes in tests).
    A runtime that keeps its own per-batch state also has ``steps(cross, batch) -> Steps | None``
    (``torch_runtime.TorchWhisper``: fixed-size buffers and CUDA graphs); the others decode on
    a ``GrowingCache``."""

    def encode(self, features: np.ndarray) -> KV: ...

    def empty_past(self, batch: int) -> KV: ...

    def decode(self, input_ids: np.ndarray, past: KV, cross: KV) -> tuple[np.ndarray, KV]: ...


class Tokenizer(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass
class _Row:
    """One utterance being decoded: where it is in the caller's list, and what it has so far."""

    index: int
    language: str | None
    detok: IncrementalDetokenizer
    tokens: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # prompt tokens still to feed, one a step
    text: str = ""
    finish_reason: str | None = None

    def transcript(self) -> Transcript:
        return Transcript(self.text, self.language, self.tokens, self.finish_reason or EOS)


class AsrModel:
    def __init__(
        self,
        runtime: Runtime,
        manifest: AsrManifest,
        tokenizer: Tokenizer,
        hidden_tokens: set[int] | None = None,
        repetition: Repetition | None = Repetition(),
    ):
        """``hidden_tokens``: ids that are never text (language, task, timestamp markers), kept
        out of the detokenizer; ``repetition``: the loop guard (None: off)."""
        self.runtime = runtime
        self.manifest = manifest
        self.tokenizer = tokenizer
        self.repetition = repetition
        self._hidden = set(hidden_tokens or ()) | set(manifest.special.values())
        self._hidden |= {t for t in manifest.languages.values() if t is not None}
        # The tokens never chosen, at the first step (index True) and at every later one.
        later = set(manifest.suppress_tokens)
        self._banned = {
            False: np.array(sorted(later), dtype=np.int64),
            True: np.array(sorted(later | set(manifest.begin_suppress_tokens)), dtype=np.int64),
        }
        self._begin_only = np.array(sorted(set(manifest.begin_suppress_tokens) - later), dtype=np.int64)
        self._language_codes = list(manifest.languages)
        # Detection picks among these (multilingual models only: they have a token each).
        self._language_ids = np.array(list(manifest.languages.values()) if manifest.multilingual else [], np.int64)

    @classmethod
    def load(cls, directory: Path, precision: str = "fp32", threads: int = 0, fitted_windows: bool = False) -> AsrModel:
        """The artifacts in ``directory`` (``python -m switchboard.export.asr``) on ONNX Runtime;
        ``fitted_windows``: see ``AsrManifest.fitted_windows``. ValueError names what is missing
        or wrong."""
        from switchboard.asr.runtime import OnnxWhisper

        directory = Path(directory)
        manifest = dataclasses.replace(AsrManifest.load(directory), fitted_windows=fitted_windows)
        tok_path = directory / TOKENIZER
        if not tok_path.is_file():
            raise ValueError(f"{tok_path} missing (written by python -m switchboard.export.asr)")
        return cls._with_tokenizer(OnnxWhisper(directory, manifest, precision, threads), manifest, tok_path)

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Path, device: str = "cuda", dtype: str | None = None, fitted_windows: bool = False, **kw
    ) -> AsrModel:
        """A Hugging Face Whisper checkpoint run in PyTorch (``torch_runtime.TorchWhisper``, which
        takes ``kw``), with no export: the GPU path where ONNX Runtime has no CUDA provider.
        ``fitted_windows``: see ``AsrManifest.fitted_windows``."""
        import tempfile

        from tokenizers import Tokenizer as HFTokenizer

        from switchboard.asr.checkpoint import copy_tokenizer, describe
        from switchboard.asr.torch_runtime import TorchWhisper

        checkpoint = Path(checkpoint)
        with tempfile.TemporaryDirectory() as tmp:
            tok_path = copy_tokenizer(checkpoint, Path(tmp))
            manifest = describe(checkpoint, HFTokenizer.from_file(str(tok_path)))
            manifest = dataclasses.replace(manifest, fitted_windows=fitted_windows)
            runtime = TorchWhisper.load(checkpoint, manifest, device, dtype, **kw)
            return cls._with_tokenizer(runtime, manifest, tok_path)

    @classmethod
    def _with_tokenizer(cls, runtime: Runtime, manifest: AsrManifest, tok_path: Path) -> AsrModel:
        from tokenizers import Tokenizer as HFTokenizer

        tokenizer = HFTokenizer.from_file(str(tok_path))
        hidden = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special or _MARKUP.match(t.content)}
        return cls(runtime, manifest, tokenizer, hidden)

    # --- what callers need to know -----------------------------------------------------------

    @property
    def n_mels(self) -> int:
        return self.manifest.n_mels

    @property
    def window_frames(self) -> int | None:
        return self.manifest.window_frames

    @property
    def max_frames(self) -> int:
        return self.manifest.max_frames

    def _batch(self, features: list[np.ndarray], first: int = 0) -> np.ndarray:
        """[B, n_mels, T] of checked rows (``first``: the first's index, for errors), padded to
        the window, else to the longest row (rows of a model that takes any length, or already
        padded to their fitted windows: at least the shortest, should one come unpadded)."""
        rows = [self._checked(first + j, f) for j, f in enumerate(features)]
        m = self.manifest
        if m.window_frames is None:
            return pad_batch(rows)
        if not m.fitted_windows:
            return pad_batch(rows, m.window_frames)
        return pad_batch(rows, max(m.windows[0], max(f.shape[1] for f in rows)))

    def padded_s(self, seconds: float) -> float:
        """The seconds of input ``seconds`` of audio costs the encoder: the window it is padded
        to (a model that takes any length: ``seconds``)."""
        hop = self.manifest.hop_length
        frames = self.manifest.input_frames(math.ceil(seconds * SAMPLE_RATE / hop))
        return seconds if frames is None else frames * hop / SAMPLE_RATE

    @property
    def max_seconds(self) -> float:
        """The longest audio one input holds (the window, or the variable-length limit): the
        serving path cuts longer audio into chunks of at most this."""
        return self.max_frames * self.manifest.hop_length / SAMPLE_RATE

    @property
    def languages(self) -> list[str]:
        return list(self.manifest.languages)

    @property
    def multilingual(self) -> bool:
        return self.manifest.multilingual

    def features(self, samples: np.ndarray) -> np.ndarray:
        """[n_mels, T] log-mel features of 16 kHz mono samples, as this model takes them: padded
        with silence to the model's window, or to a window fitted to them
        (``AsrManifest.input_frames``); a batch pads its rows to its longest."""
        hop = self.manifest.hop_length
        frames = self.manifest.input_frames(-(-len(samples) // hop))
        return log_mel(samples, self.n_mels, frames=frames, hop=hop)

    # --- decoding ----------------------------------------------------------------------------

    def transcribe(
        self,
        features: list[np.ndarray],
        languages: list[str | None],
        on_delta: Callable[[int, str], None] | None = None,
        max_new_tokens: int | None = None,
        cancelled: Callable[[int], bool] | None = None,
        on_done: Callable[[int, Transcript], None] | None = None,
        more: Callable[[int], list[tuple[np.ndarray, str | None]]] | None = None,
    ) -> list[Transcript]:
        """Transcripts of ``features`` ([n_mels, T] each, as ``features`` makes them), in order.
        ``languages[i]``: a code from ``self.languages`` or None (detected by a multilingual
        model). ``on_delta(i, text)`` gets each row's text as it becomes final; ``cancelled(i)``,
        asked before every step, ends row i there; ``on_done(i, transcript)`` gets row i's
        transcript the step it ends, while the batch's longer rows go on (a 2 s question is not
        held for a 15 s chunk's last words). ``more(room)``, asked between steps where the
        runtime lets rows join a running batch (``TorchWhisper``'s fixed-size buffers) and it
        has room, gives up to ``room`` more (features, language) pairs: they join as rows
        ``len(features)``, ``+ 1``, ... (in the order given; the callbacks and the returned list
        count them so), a row that ended leaving its place to a waiting one rather than the
        batch running on half empty. ValueError names the input that is wrong.

        The whole batch on the calling thread; the speech service's loop runs the same
        ``Decoding`` (``start``) a step at a time (switchboard/asr/service.py)."""
        self._check_request(features, languages, max_new_tokens)
        if not features:
            return []
        decoding = Decoding(self, features, languages, max_new_tokens, on_delta)

        def report() -> None:
            for row in decoding.ended():
                if on_done is not None:
                    on_done(row.index, row.transcript())

        try:
            report()
            while decoding.live:
                if cancelled is not None:
                    decoding.cancel([r.index for r in decoding.live if cancelled(r.index)])
                    report()
                    if not decoding.live:
                        break
                decoding.step()
                report()
                if more is not None and decoding.room() > 0:
                    decoding.join(more(decoding.room()))
                    report()
        finally:
            decoding.close()
        return decoding.transcripts()

    def start(
        self,
        features: list[np.ndarray],
        languages: list[str | None],
        on_delta: Callable[[int, str], None] | None = None,
        max_new_tokens: int | None = None,
    ) -> Decoding:
        """The batch's ``Decoding``, encoded and ready for its first step (``transcribe`` says
        what the arguments are); the caller steps it and closes it."""
        self._check_request(features, languages, max_new_tokens)
        if not features:
            raise ValueError("no features: a batch has a row at least")
        return Decoding(self, features, languages, max_new_tokens, on_delta)

    def _check_request(self, features: list, languages: list, max_new_tokens: int | None) -> None:
        if len(features) != len(languages):
            raise ValueError(f"{len(features)} feature arrays but {len(languages)} languages")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"max_new_tokens {max_new_tokens}: expected at least 1")

    def _steps(self, cross: KV, batch: int) -> Steps:
        """The runtime's own decoding state for this batch if it keeps one (``TorchWhisper``'s
        fixed-size cache and CUDA graphs), else the growing cache every runtime has."""
        start = getattr(self.runtime, "steps", None)
        own = start(cross, batch) if start is not None else None
        return own if own is not None else GrowingCache(self.runtime, cross, batch)

    def _language(self, i: int, lang: str | None) -> str | None:
        if lang is None:
            return None if self.multilingual else self._language_codes[0] if self._language_codes else "en"
        code = str(lang).strip().lower()
        if code not in self.manifest.languages:
            have = ", ".join(self._language_codes) or "en"
            if not self.multilingual:
                raise ValueError(f"languages[{i}] = {lang!r}: this model is English-only ({have})")
            raise ValueError(f"languages[{i}] = {lang!r}: not a language of this model ({have})")
        return code

    def _checked(self, i: int, f: np.ndarray) -> np.ndarray:
        f = np.asarray(f)
        if f.ndim != 2 or f.shape[0] != self.n_mels or f.shape[1] < 1:
            raise ValueError(f"features[{i}]: shape {f.shape}, expected [{self.n_mels}, frames >= 1]")
        if (self.window_frames is None or self.manifest.fitted_windows) and f.shape[1] > self.max_frames:
            raise ValueError(
                f"features[{i}]: {f.shape[1]} frames, more than this model's {self.max_frames} "
                f"({self.max_seconds:g} s): cut the audio into shorter pieces"
            )
        if not np.isfinite(f).all():
            raise ValueError(f"features[{i}]: not finite (NaN or infinity)")
        return f.astype(np.float32, copy=False)

    def _prompt(self, rows: list[_Row], steps: Steps) -> list[list[int]]:
        """Each row's prompt tokens still to feed (all of one length), after any language
        detection (one step on the start token, on ``steps``)."""
        m = self.manifest
        if not m.multilingual:
            return [m.prompt(None) for _ in rows]
        if any(r.language is None for r in rows):
            logits = steps.step(np.full((len(rows), 1), m.special["start"], np.int64))
            best = np.asarray(logits)[:, self._language_ids].argmax(axis=1)
            for row, j in zip(rows, best):
                if row.language is None:
                    row.language = self._language_codes[int(j)]
            return [m.prompt(m.languages[r.language])[1:] for r in rows]
        return [m.prompt(m.languages[r.language]) for r in rows]

    def _next_tokens(self, steps: Steps, ids: np.ndarray, first: list[int]) -> np.ndarray:
        """Each row's next token, greedy: on the device where ``steps`` chooses there
        (``choose``: only the tokens come back), else from the logits here. ``first``: the rows
        choosing their first token, which the first step's tokens are banned from too."""
        choose = getattr(steps, "choose", None)
        if len(first) == len(ids) or not first:  # one set for every row
            banned = self._banned[bool(first)]
            return choose(ids, banned) if choose is not None else greedy(steps.step(ids), banned)
        # rows taking their first token (they joined a running batch) are banned more
        banned, extra = self._banned[False], self._begin_only
        if choose is not None:
            return choose(ids, banned, first=np.asarray(first, np.int64), first_banned=extra)
        logits = np.array(steps.step(ids), dtype=np.float32)
        logits[np.ix_(first, extra)] = -np.inf
        return greedy(logits, banned)

    def _advance(self, row: _Row, token: int, budget: int, on_delta) -> None:
        if token == self.manifest.special["eos"]:
            row.finish_reason = EOS
        else:
            row.tokens.append(token)
            if token not in self._hidden:
                self._emit(row, row.detok.add([token]), on_delta)
            if len(row.tokens) >= budget:
                row.finish_reason = LENGTH
            elif self.repetition is not None and self.repetition.looping(row.tokens):
                row.finish_reason = REPETITION
        if row.finish_reason is not None:
            self._emit(row, row.detok.flush(), on_delta)

    def _emit(self, row: _Row, delta: str, on_delta) -> None:
        if delta:
            row.text += delta
            if on_delta is not None:
                on_delta(row.index, delta)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @staticmethod
    def _keep(live: list[_Row], steps: Steps) -> list[_Row]:
        """The rows still decoding; ``steps`` drops the ones that finished."""
        keep = [j for j, r in enumerate(live) if r.finish_reason is None]
        if len(keep) < len(live):
            steps.keep(keep)
        return [live[j] for j in keep]


class Decoding:
    """One batch decoded a step at a time, its rows in lockstep: made by ``AsrModel.start`` (the
    encoder's pass, language detection), then ``step`` (one decoder call for the rows still
    ``live``) and between steps ``cancel`` (rows whose caller left end) and ``join`` (rows
    taking the places of ended ones, where the runtime allows: ``room``). Rows that ended come
    out of ``ended``, once each; ``close`` frees the runtime's state."""

    def __init__(self, model: AsrModel, features, languages, max_new_tokens: int | None, on_delta):
        self.model, self.on_delta = model, on_delta
        codes = [model._language(i, lang) for i, lang in enumerate(languages)]
        batch = model._batch(features)
        self.rows = [_Row(i, code, IncrementalDetokenizer(model._decode)) for i, code in enumerate(codes)]
        self.steps = model._steps(model.runtime.encode(batch), len(self.rows))
        try:
            self._prompt = model._prompt(self.rows, self.steps)
        except BaseException:
            self.steps.close()
            raise
        limit = model.manifest.max_target_positions - model.manifest.prompt_length
        self.budget = min(max_new_tokens or limit, limit)
        self.live = list(self.rows)
        self._ended: list[_Row] = []
        self._stepped = False
        if self.budget < 1:
            for row in self.live:
                row.finish_reason = LENGTH
            self._retire()

    def ended(self) -> list[_Row]:
        """The rows that ended since the last call (``index``, ``transcript()``)."""
        out, self._ended = self._ended, []
        return out

    def transcripts(self) -> list[Transcript]:
        return [r.transcript() for r in self.rows]

    def cancel(self, indices: list[int]) -> None:
        """Rows ``indices`` (of ``rows``) end, cancelled, before the next step."""
        if not indices:
            return
        wanted = set(indices)
        for row in self.live:
            if row.index in wanted:
                row.finish_reason = CANCELLED
        self._retire()

    def step(self) -> None:
        """One decoder call: a token for every live row. The first step feeds the prompt, every
        later one the token each row chose last; a row that joined feeds its prompt a token a
        step, its choices unread until the last."""
        live, first_step, self._stepped = self.live, not self._stepped, True
        ids = np.asarray([r.pending[:1] or r.tokens[-1:] or self._prompt[r.index] for r in live], np.int64)
        first = list(range(len(live))) if first_step else [j for j, r in enumerate(live) if len(r.pending) == 1]
        for row, token in zip(live, self.model._next_tokens(self.steps, ids, first)):
            if row.pending:
                row.pending.pop(0)
                if row.pending:
                    continue
            self.model._advance(row, int(token), self.budget, self.on_delta)
        self._retire()

    def room(self) -> int:
        """How many rows may join now: the places of ended rows in a runtime's fixed-size batch
        (``TorchWhisper``); 0 for one whose batches cannot take rows while they decode."""
        return self.steps.room() if getattr(self.steps, "join", None) is not None else 0

    def join(self, new: list[tuple[np.ndarray, str | None]]) -> None:
        """``new`` (features, language) pairs, at most ``room()``, encoded and placed in the
        running batch as rows ``len(rows)``, ``+ 1``, ... Their prompts then go in with the
        batch's steps, a token a step (a CUDA graph's step, not a prompt of its own launched
        kernel by kernel); a row whose language is to be detected has it detected, its prompt
        fed and its first token chosen here, on its rows alone."""
        if not new:
            return
        model, base = self.model, len(self.rows)
        codes = [model._language(base + j, lang) for j, (_, lang) in enumerate(new)]
        batch = model._batch([f for f, _ in new], base)
        joined = [_Row(base + j, code, IncrementalDetokenizer(model._decode)) for j, code in enumerate(codes)]
        self.rows += joined
        first = self.steps.join(model.runtime.encode(batch))
        self.live = self.live + joined
        if all(r.language is not None or not model.multilingual for r in joined):
            m = model.manifest
            for row in joined:
                row.pending = list(m.prompt(m.languages[row.language] if m.multilingual else None))
            return
        own = self.steps.rows(first, len(joined))
        ids = np.asarray(model._prompt(joined, own), np.int64)
        for row, token in zip(joined, model._next_tokens(own, ids, list(range(len(joined))))):
            model._advance(row, int(token), self.budget, self.on_delta)
        self._retire()

    def close(self) -> None:
        self.steps.close()

    def _retire(self) -> None:
        """Rows that finished leave the live rows (and the runtime's state) for ``ended``."""
        self._ended += [r for r in self.live if r.finish_reason is not None]
        self.live = self.model._keep(self.live, self.steps)


def greedy(logits: np.ndarray, banned: np.ndarray) -> np.ndarray:
    """Each row's best token of [B, V] ``logits``, never one of ``banned`` (the first on a tie)."""
    logits = np.array(logits, dtype=np.float32)  # a copy: banning writes into it
    if banned.size:
        logits[:, banned] = -np.inf
    return logits.argmax(axis=1)


class Steps(Protocol):
    """One batch's decoding state: what ``AsrModel`` asks of it between the encoder and the
    last row's end. A runtime that can pick tokens where its logits are adds
    ``choose(input_ids, banned) -> [B] tokens``: one step, then ``greedy`` there."""

    def step(self, input_ids: np.ndarray) -> np.ndarray:
        """Feed [B, S] tokens (B: the rows still decoding); the logits of the last position, [B, V]."""
        ...

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` (ascending indices into the current rows) decode from now on."""
        ...

    def close(self) -> None: ...


class GrowingCache:
    """Decoding on any ``Runtime``: the self-attention cache grows by a position each step, and
    the rows that finish are cut out of it and of the encoder's keys and values, so the
    remaining rows' steps read and copy less."""

    def __init__(self, runtime: Runtime, cross: KV, batch: int):
        self.runtime, self.cross, self.past = runtime, cross, runtime.empty_past(batch)

    def step(self, input_ids: np.ndarray) -> np.ndarray:
        logits, self.past = self.runtime.decode(input_ids, self.past, self.cross)
        return logits

    def keep(self, rows: list[int]) -> None:
        if not rows:
            self.past, self.cross = [], []
            return
        # The rows left as a leading run are a view of the arrays; others are copied out (the
        # cross cache of a 30 s window is 9 MB per row in tiny.en: one copy, then every later
        # step reads less).
        which = slice(0, len(rows)) if rows[-1] == len(rows) - 1 else rows
        self.past = [(k[which], v[which]) for k, v in self.past]
        self.cross = [(k[which], v[which]) for k, v in self.cross]

    def close(self) -> None:
        self.past, self.cross = [], []

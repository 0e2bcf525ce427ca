"""The ASR pool's work, apart from Triton: decode, cut, batch by length, transcribe, stream.

A request's audio is decoded and cut at silences into chunks on a small thread pool
(``prep_workers``): a file that cannot be decoded fails there, alone, before any batch sees
it. Each chunk becomes one item of the batcher (switchboard/asr/batcher.py), which groups
items of similar length under an audio-seconds budget, so a 2 s question never waits for a
30 s recording's decoding (seed 001's incident). ``workers`` threads run the batches on the
batching loop the generation pools run too (switchboard/common/loop.py): the batcher says which
batch is due, and this service is the loop's step, one decoding step of a batch
(``AsrModel.start``'s ``Decoding``) per call. Between two steps a row whose caller left ends
(its sink's ``cancelled``) and, with ``join`` (and a model whose runtime allows it:
``TorchWhisper``'s fixed-size buffers), a chunk queued meanwhile takes the place of a row that
ended, within the batcher's ``max_batch`` (``batcher.join``: in-flight batching), rather than
waiting for that batch's longest row. Every row's text streams as it is decoded. The chunks of
one request may run in different batches: their text is passed on in order (a later chunk's
text waits, buffered, for the earlier ones).

A batch that raises is run again one item at a time (its worker's next batches), so one bad
item fails alone.

Two admissions refuse a request UNAVAILABLE before it costs anything: ``max_pending_s`` of
audio already held, and, when given, a latency ``breaker`` (seed 001's: "while P99 latency is
over 1.5 s, refuse new requests"). The breaker hears how long each short request took, arrival
to transcript (audio of at most ``short_s``: a recording's length is its own, not a sign of
overload); open, it refuses new priority-2 requests, so the ones admitted and every priority-1
caller get the pool back (switchboard/common/breaker.py: when it closes again).
"""

from __future__ import annotations

import logging
import threading
import time
import unicodedata
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from switchboard.asr import audio as audio_mod
from switchboard.asr import segment
from switchboard.asr.batcher import Item
from switchboard.common.breaker import LatencyBreaker
from switchboard.common.loop import Loop, Sink, Worker
from switchboard.wire import AsrError, AsrResult

log = logging.getLogger("switchboard.asr")
SAMPLE_RATE = 16_000


def _gap(before: str, text: str) -> str:
    """What goes between a recording's text so far and its next chunk's: a blank where the
    model gave none and both sides are a script written with blanks between words (Whisper's
    tokens carry their leading blank, the embedded default's characters do not; Chinese takes
    none), else nothing."""
    if not before or not text or before[-1].isspace() or text[0].isspace():
        return ""
    return "" if _unspaced(before[-1]) or _unspaced(text[0]) else " "


def _unspaced(ch: str) -> bool:
    return unicodedata.east_asian_width(ch) in ("W", "F")  # CJK characters and their punctuation


class AsrRequestError(ValueError):
    """The request is refused: ``code`` an AsrError, "unavailable" (the pool is full) or
    "shed_breaker" (the latency breaker is open)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class AsrJob:
    """One request. Its ``Sink`` (switchboard/common/loop.py) hears ``emit(text)`` as the
    transcript grows, then ``finish(AsrResult)`` or ``fail(error)``; ``cancelled()``, asked
    between decoding steps, ends its rows."""

    audio: bytes
    sink: Sink
    language: str | None = None
    priority: int = 2


@dataclass
class _Chunk:
    start: int  # samples
    end: int
    features: np.ndarray | None = None
    text: str = ""
    done: bool = False
    sent: int = 0  # characters of ``text`` the sink has heard (a batch run again repeats none)


@dataclass
class _Transcription:
    """One request in flight: its chunks, what of their text went out, its timings."""

    job: AsrJob
    arrival: float
    seconds: float = 0.0
    language: str | None = None
    chunks: list[_Chunk] = field(default_factory=list)
    emitted: int = 0  # chunks whose text went out whole; deltas of chunk `emitted` go out live
    said: str = ""  # the last character the sink heard ("": nothing yet)
    started: float | None = None
    batch_size: int | None = None
    failed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class Decoding(Protocol):
    """One batch's decoding, a step at a time (switchboard/asr/model.py's ``Decoding``): rows
    ``live`` (each with its ``index``), ``ended`` rows (``index``, ``transcript()``) once each."""

    live: list

    def ended(self) -> list: ...
    def cancel(self, indices: list[int]) -> None: ...
    def step(self) -> None: ...
    def room(self) -> int: ...
    def join(self, new: list[tuple[np.ndarray, str | None]]) -> None: ...
    def close(self) -> None: ...


class Recognizer(Protocol):
    """What the service needs of a model (switchboard/asr/model.py's AsrModel)."""

    languages: list
    multilingual: bool

    def features(self, samples: np.ndarray) -> np.ndarray: ...
    def start(self, features, languages, on_delta=None) -> Decoding: ...


@dataclass
class _Batch:
    """A batch a worker decodes, a step per turn of the loop: its items (the joined ones
    appended), its rows in the model's order, the model's decoding while it runs."""

    items: list[Item]
    worker: _Worker
    rows: list[tuple[_Transcription, int]] = field(default_factory=list)
    decoding: Decoding | None = None
    done: bool = False


class _Worker:
    """The loop's policy for one worker: the next step of the batch it decodes, else the items
    of a failed batch one at a time, else the batch the batcher has due (the batcher says when)."""

    def __init__(self, batcher):
        self.batcher, self.batch = batcher, None
        self.alone: deque[Item] = deque()  # its own thread touches it (step, take), or close once it stopped

    def take(self, now: float) -> _Batch | None:
        batch = self.under_way()
        if batch is None:
            items = self.batcher.take(now)
            self.batch = batch = _Batch(items, self) if items else None
        return batch

    def under_way(self) -> _Batch | None:
        """The batch this worker began, else the next item of a failed batch, alone; None: it
        has nothing of its own to finish."""
        if self.batch is None or self.batch.done:
            self.batch = _Batch([self.alone.popleft()], self) if self.alone else None
        return self.batch

    def next_due(self, now: float) -> float | None:
        return self.batcher.next_due(now)


class AsrService:
    def __init__(
        self,
        model: Recognizer,
        batcher,
        *,
        max_audio_s: float = 600.0,
        chunk_s: float = 15.0,
        max_pending_s: float = 600.0,
        workers: int = 1,
        prep_workers: int = 2,
        breaker: LatencyBreaker | None = None,
        short_s: float = 15.0,
        join: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.model, self.batcher, self.clock = model, batcher, clock
        self.max_audio_s, self.chunk_s, self.max_pending_s = max_audio_s, chunk_s, max_pending_s
        self.breaker, self.short_s, self.join = breaker, short_s, join
        self._pending_s = 0.0  # audio seconds decoded and waiting or running (under the loop's lock)
        self._prep = ThreadPoolExecutor(prep_workers, thread_name_prefix="asr-prep")
        self.batches = 0  # batches run (for tests and metrics)
        # each worker's policy: its batch's next step, else the batcher's next batch
        self.loop = Loop(self, [Worker(f"asr-batch-{i}", _Worker(batcher)) for i in range(workers)], clock)
        self.loop.start()

    # -- requests --------------------------------------------------------------------------
    def submit(self, job: AsrJob) -> None:
        """Takes the job and returns at once; the sink hears the rest (always ending with
        done or error)."""
        state = _Transcription(job, self.clock())
        self._prep.submit(self._prepare, state)

    def _prepare(self, state: _Transcription) -> None:
        if state.job.priority > 1 and self.breaker is not None and self.breaker.is_open():
            p99 = self.breaker.p99() or 0.0
            state.job.sink.fail(
                AsrRequestError(
                    "shed_breaker",
                    f"the speech recognizer is over its latency bound (P99 {p99:.1f} s of recent questions); "
                    "try again later",
                )
            )
            return
        try:
            self._check_language(state.job.language)
            decoded = audio_mod.decode(state.job.audio, self.max_audio_s)
            state.seconds = decoded.seconds
            ranges = segment.split(decoded.samples, max_s=self.chunk_s, rate=SAMPLE_RATE)
            chunks = [self._chunk(decoded.samples, a, b) for a, b in ranges]
            if all(chunk.done for chunk in chunks):  # silence only
                state.job.sink.finish(
                    AsrResult("", state.job.language, decoded.seconds, [], self._ms(state), 0.0, None, 0)
                )
                return
            state.chunks = chunks
        except audio_mod.AudioError as e:
            state.job.sink.fail(AsrRequestError(e.code, str(e)))
            return
        except AsrRequestError as e:
            state.job.sink.fail(e)
            return
        except Exception as e:  # a bug, not the caller's file: logged here, INTERNAL to the client
            log.exception("preparing audio failed")
            state.job.sink.fail(e)
            return
        failure = self.loop.submit(lambda: self._queue(state))
        if isinstance(failure, AsrRequestError):  # refused: it holds nothing
            state.job.sink.fail(failure)
        elif failure is not None:
            self._fail(state, failure)

    def _queue(self, state: _Transcription) -> Exception | None:
        """Queue the request's spoken chunks (under the loop's lock); the error it fails with, if any."""
        if self._pending_s + state.seconds > self.max_pending_s and self._pending_s > 0:
            return AsrRequestError("unavailable", "the speech recognizer is full; try again later")
        self._pending_s += state.seconds
        try:
            # chunks of silence are done already: past leading ones, the first spoken one streams live
            while state.chunks[state.emitted].done:
                state.emitted += 1
            for i, chunk in enumerate(state.chunks):
                if not chunk.done:
                    seconds = (chunk.end - chunk.start) / SAMPLE_RATE
                    self.batcher.add(Item((state, i), seconds, state.job.priority, state.arrival, state.seconds))
        except Exception as e:  # a bug: this request fails (its queued chunks are skipped), never hangs
            log.exception("queueing audio failed")
            return e
        return None

    def _chunk(self, samples: np.ndarray, start: int, end: int) -> _Chunk:
        """A chunk to transcribe, or one already done (empty) when it is all silence: a long
        pause in a recording never reaches the model, which hears "you" in silence."""
        piece = samples[start:end]
        if segment.is_silence(piece):
            return _Chunk(start, end, text="", done=True)
        return _Chunk(start, end, self.model.features(piece))

    def _check_language(self, language: str | None) -> None:
        if language is None:
            return
        if language not in self.model.languages:
            known = ", ".join(self.model.languages)
            raise AsrRequestError(AsrError.BAD_LANGUAGE, f"language {language!r}: this recognizer knows {known}")

    # -- batches: the loop's step (switchboard/common/loop.py), one decoding step a call ----------
    def step(self, batch: _Batch) -> None:
        """The batch's next step: its encoder pass first, then one decoding step. Rows whose
        caller left end before it; queued chunks take the places of ended rows after it
        (``join``, where the model allows); a row that ends goes out while the rest decode."""
        if batch.decoding is None:
            self._begin(batch)
        else:
            decoding = batch.decoding
            decoding.cancel([r.index for r in decoding.live if batch.rows[r.index][0].job.sink.cancelled()])
            self._report(batch)
            if decoding.live:
                decoding.step()
                self._report(batch)
                if self.join and decoding.room() > 0:
                    self._more(batch)
        if batch.decoding is None or not batch.decoding.live:
            self._end(batch)

    def failed(self, batch: _Batch, error: Exception) -> None:
        """A batch that raised (the rows that joined it included) runs again one item at a time,
        so one bad item fails alone; an item that fails alone fails its request."""
        self._end(batch, ran=False)
        if len(batch.items) == 1:
            self._fail(batch.items[0].key[0], RuntimeError("transcribing failed"))
            return
        log.warning("a batch of %d failed; running its items one by one", len(batch.items))
        for item in batch.items:
            state, i = item.key
            with state.lock:
                chunk = state.chunks[i]
                if chunk.done:  # ended before the batch failed: delivered already
                    continue
                chunk.text = ""  # decoded again from the start; what went out is not repeated
            batch.worker.alone.append(item)

    def _begin(self, batch: _Batch) -> None:
        now = self.clock()
        for item in batch.items:
            state, _ = item.key
            if state.started is None:
                state.started, state.batch_size = now, len(batch.items)
        batch.rows = [item.key for item in batch.items if not item.key[0].failed]
        if not batch.rows:
            return
        batch.decoding = self.model.start(
            [state.chunks[i].features for state, i in batch.rows],
            [state.job.language or state.language for state, _ in batch.rows],
            on_delta=lambda row, text: self._delta(*batch.rows[row], text),
        )
        self._report(batch)

    def _more(self, batch: _Batch) -> None:
        """Queued chunks joining the batch where rows have ended (in-flight batching), as many as
        the batcher's max_batch leaves room for; they join its items too, so a batch that fails
        runs them again one by one."""
        running = len(batch.decoding.live)
        room = min(batch.decoding.room(), self.batcher.max_batch - running)
        joined = self.loop.join(lambda: self.batcher.join(self.clock(), room))
        now, new = self.clock(), []
        for item in joined:
            batch.items.append(item)
            state, i = item.key
            if state.started is None:
                state.started, state.batch_size = now, running + len(joined)
            if not state.failed:
                batch.rows.append((state, i))
                new.append((state.chunks[i].features, state.job.language or state.language))
        batch.decoding.join(new)
        self._report(batch)

    def _report(self, batch: _Batch) -> None:
        for row in batch.decoding.ended():
            self._chunk_done(*batch.rows[row.index], row.transcript())

    def _end(self, batch: _Batch, ran: bool = True) -> None:
        batch.done = True
        if batch.decoding is not None:
            decoding, batch.decoding = batch.decoding, None
            decoding.close()
        if ran:
            with self.loop.cond:  # workers end batches at once
                self.batches += 1

    def _delta(self, state: _Transcription, i: int, text: str) -> None:
        with state.lock:
            chunk = state.chunks[i]
            chunk.text += text
            if i == state.emitted and not state.failed and len(chunk.text) > chunk.sent:
                self._pass_on(state, i)

    def _pass_on(self, state: _Transcription, i: int) -> None:
        """Chunk i's text the sink has not heard (every earlier chunk's went out whole); under
        ``state.lock``."""
        chunk = state.chunks[i]
        sent, new, chunk.sent = chunk.sent, chunk.text[chunk.sent :], len(chunk.text)
        if not state.said:  # no blank before the transcript's first word
            new = new.lstrip()
        elif sent == 0:
            new = _gap(state.said, new) + new
        if new:
            state.said = new[-1]
            state.job.sink.emit(new)

    def _chunk_done(self, state: _Transcription, i: int, result) -> None:
        with state.lock:
            chunk = state.chunks[i]
            if state.failed or chunk.done:  # reported as it ended, or failed meanwhile
                return
            chunk.text, chunk.done = result.text, True
            state.language = state.language or result.language
            # pass on the text of later chunks that finished while this one ran
            while state.emitted < len(state.chunks) and state.chunks[state.emitted].done:
                state.emitted += 1
                if state.emitted < len(state.chunks):
                    self._pass_on(state, state.emitted)
            finished = state.emitted == len(state.chunks)
        if finished:
            self._release(state)
            result = self._result(state)
            if self.breaker is not None and state.seconds <= self.short_s:
                self.breaker.observe(result.asr_ms / 1000)
            state.job.sink.finish(result)

    def _result(self, state: _Transcription) -> AsrResult:
        segments, start_text = [], ""
        for n, chunk in enumerate(state.chunks):
            segments.append(
                {
                    "id": n,
                    "start": round(chunk.start / SAMPLE_RATE, 3),
                    "end": round(chunk.end / SAMPLE_RATE, 3),
                    "text": chunk.text.strip(),
                }
            )
            start_text += _gap(start_text, chunk.text) + chunk.text
        queue_ms = None if state.started is None else (state.started - state.arrival) * 1000
        return AsrResult(
            text=start_text.strip(),
            language=state.job.language or state.language,
            duration=round(state.seconds, 3),
            segments=segments,
            asr_ms=self._ms(state),
            queue_ms=queue_ms,
            batch_size=state.batch_size,
            chunks=len(state.chunks),
        )

    def _fail(self, state: _Transcription, error: Exception) -> None:
        with state.lock:
            if state.failed:
                return
            state.failed = True
        self._release(state)
        state.job.sink.fail(error)

    def _release(self, state: _Transcription) -> None:
        with self.loop.cond:
            self._pending_s = max(0.0, self._pending_s - state.seconds)

    def _ms(self, state: _Transcription) -> float:
        return round((self.clock() - state.arrival) * 1000, 1)

    @property
    def pending_s(self) -> float:
        with self.loop.cond:
            return self._pending_s

    def close(self) -> None:
        """Take no more batches; the ones under way are decoded to their end (here, once the
        workers stopped), as a batch always was."""
        if self.loop.close():
            for worker in self.loop.workers:
                while (batch := worker.policy.under_way()) is not None:
                    self.loop.run(batch)
        self._prep.shutdown(wait=False, cancel_futures=True)

"""AsrService with a fake recognizer: order of streamed text, failures that stay alone."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

from switchboard.asr.audio import encode_wav
from switchboard.asr.batcher import make_batcher
from switchboard.asr.service import AsrJob, AsrRequestError, AsrService

RATE = 16_000


def tone(seconds: float, hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def speech(*parts: float, gap_s: float = 0.6) -> bytes:
    """Tones of the given lengths separated by silences, as a WAV file."""
    pieces = []
    for i, seconds in enumerate(parts):
        pieces += [tone(seconds, 200 + 50 * i), np.zeros(int(gap_s * RATE), np.float32)]
    return encode_wav(np.concatenate(pieces))


@dataclass
class Transcript:
    text: str
    language: str | None
    tokens: list


class FakeRecognizer:
    """Transcribes a chunk as its length in tenths of a second, streamed word by word; a chunk
    of exactly ``poison_s`` seconds makes its batch's steps raise. ``batches``: each batch's
    rows' seconds (the rows that joined it included)."""

    languages = ["en", "zh"]
    multilingual = True

    def __init__(self, poison_s: float | None = None):
        self.poison_s, self.batches = poison_s, []
        self.lock = threading.Lock()

    def features(self, samples):
        return np.full((1, 1), len(samples) / RATE, np.float32)

    def start(self, features, languages, on_delta=None):
        decoding = FakeDecoding(self, on_delta)
        with self.lock:
            self.batches.append(decoding.seconds)
        decoding.add(features, languages)
        return decoding

    def pieces(self, seconds, language):
        """A row's text as it streams: word by word, each with its leading blank, as Whisper's tokens come."""
        return [" " + word for word in f"chunk of {round(seconds * 10)} tenths".split(" ")]

    def stepping(self, decoding):
        """Called at the start of each step."""
        if self.poison_s is not None and any(abs(r.seconds - self.poison_s) < 0.05 for r in decoding.live):
            raise RuntimeError("poisoned batch")

    def ending(self, row, decoding):
        """Called as ``row`` ends."""

    def room(self, decoding):
        return 0  # rows cannot join its batches


class FakeRow:
    def __init__(self, index, seconds, language, pieces):
        self.index, self.seconds, self.language, self.pieces = index, seconds, language, pieces
        self.streamed = False

    def transcript(self):
        return Transcript("".join(self.pieces), self.language, [])


class FakeDecoding:
    """A step streams the text of the rows that have not streamed theirs yet, then ends the
    shortest live row (shorter rows end first); the model's hooks run in between."""

    def __init__(self, model, on_delta):
        self.model, self.on_delta = model, on_delta
        self.rows, self.live, self.seconds, self._ended = [], [], [], []

    def add(self, features, languages):
        for f, language in zip(features, languages):
            s = float(f[0, 0])
            row = FakeRow(len(self.rows), s, language or "en", self.model.pieces(s, language))
            self.rows.append(row)
            self.live.append(row)
            self.seconds.append(s)

    def ended(self):
        out, self._ended = self._ended, []
        return out

    def cancel(self, indices):
        for row in [r for r in self.live if r.index in indices]:
            self.live.remove(row)
            self._ended.append(row)

    def step(self):
        self.model.stepping(self)
        for row in self.live:
            if not row.streamed:
                row.streamed = True
                for piece in row.pieces:
                    self.on_delta(row.index, piece)
        row = min(self.live, key=lambda r: r.seconds)
        self.model.ending(row, self)
        self.live.remove(row)
        self._ended.append(row)

    def room(self):
        return self.model.room(self)

    def join(self, new):
        self.add([f for f, _ in new], [lang for _, lang in new])

    def close(self):
        pass


class Sink:
    def __init__(self):
        self.deltas, self.result, self.failure = [], None, None
        self.finished = threading.Event()

    def emit(self, text):
        self.deltas.append(text)

    def finish(self, result):
        self.result = result
        self.finished.set()

    def fail(self, error):
        self.failure = error
        self.finished.set()

    def cancelled(self):
        return False


@pytest.fixture
def service_for():
    made = []

    def make(model, wait_s=0.02, **kw):
        batcher = make_batcher("length", budget_s=60.0, max_batch=8, max_ratio=2.0, max_wait_s=wait_s, wait_alone=True)
        service = AsrService(model, batcher, **kw)
        made.append(service)
        return service

    yield make
    for s in made:
        s.close()


def run(service, audio: bytes, **kw) -> Sink:
    sink = Sink()
    service.submit(AsrJob(audio=audio, sink=sink, **kw))
    assert sink.finished.wait(10), "no answer"
    return sink


def test_a_question_streams_its_text_then_the_result(service_for):
    sink = run(service_for(FakeRecognizer()), speech(2.0))
    assert sink.failure is None
    assert "".join(sink.deltas) == sink.result.text
    assert sink.result.chunks == 1 and sink.result.duration == pytest.approx(2.6, abs=0.01)
    assert sink.result.segments[0]["start"] == 0.0 and sink.result.segments[0]["text"] == sink.result.text
    assert sink.result.queue_ms is not None and sink.result.asr_ms >= sink.result.queue_ms


def test_long_audio_is_cut_into_chunks_whose_text_goes_out_in_order(service_for):
    model = FakeRecognizer()
    sink = run(service_for(model, chunk_s=5.0), speech(4.0, 3.0, 4.0, 2.0))
    assert sink.failure is None and sink.result.chunks >= 3
    assert "".join(sink.deltas) == sink.result.text
    assert [s["id"] for s in sink.result.segments] == list(range(sink.result.chunks))
    starts = [s["start"] for s in sink.result.segments]
    assert starts == sorted(starts)
    assert all(s["end"] - s["start"] <= 5.0 + 1e-6 for s in sink.result.segments)


def test_a_request_the_batcher_refuses_fails_and_the_pool_goes_on(service_for):
    """A bug between the audio checks and the queue fails that request, never hangs it."""
    service = service_for(FakeRecognizer(), chunk_s=5.0)
    add, calls = service.batcher.add, []

    def refusing(item):
        calls.append(item)
        if len(calls) == 2:  # the second chunk of the first recording
            raise ValueError("batcher: refused")
        add(item)

    service.batcher.add = refusing
    sink = run(service, speech(4.0, 4.0))
    assert isinstance(sink.failure, ValueError) and sink.result is None
    assert service.pending_s == 0.0
    assert run(service, speech(2.0)).result.text, "the next request is heard"


def test_an_undecodable_file_fails_alone(service_for):
    service = service_for(FakeRecognizer())
    bad, good = Sink(), Sink()
    service.submit(AsrJob(audio=b"this is not audio at all" * 10, sink=bad))
    service.submit(AsrJob(audio=speech(1.5), sink=good))
    assert bad.finished.wait(10) and good.finished.wait(10)
    assert isinstance(bad.failure, AsrRequestError) and bad.failure.code == "not_audio"
    assert good.failure is None and good.result.text


def test_a_batch_that_raises_is_run_again_item_by_item(service_for):
    model = FakeRecognizer(poison_s=3.0)  # the 2.4 s + 0.6 s gap question poisons its batch
    service = service_for(model)
    poisoned, fine = Sink(), Sink()
    service.submit(AsrJob(audio=speech(2.4), sink=poisoned))
    service.submit(AsrJob(audio=speech(2.0), sink=fine))
    assert poisoned.finished.wait(10) and fine.finished.wait(10)
    assert poisoned.failure is not None and not isinstance(poisoned.failure, AsrRequestError)
    assert fine.failure is None and fine.result.text


def test_a_short_row_is_answered_while_its_batch_decodes_a_longer_one(service_for):
    longer_ended = threading.Event()

    class Held(FakeRecognizer):
        """The longest row of a batch ends only once the test has seen the short one answered."""

        def ending(self, row, decoding):
            if row.seconds == max(decoding.seconds) and len(decoding.seconds) > 1:
                assert longer_ended.wait(10), "the short row's answer never came"

    service = service_for(Held(), wait_s=2.0, chunk_s=5.0)  # both queued before a batch runs
    short, long_ = Sink(), Sink()
    service.submit(AsrJob(audio=speech(4.0), sink=long_))
    service.submit(AsrJob(audio=speech(2.6), sink=short))  # 4.6 s and 3.2 s: one batch (ratio 2)
    assert short.finished.wait(10) and short.failure is None
    assert not long_.finished.is_set()
    longer_ended.set()
    assert long_.finished.wait(10) and long_.failure is None
    assert "".join(long_.deltas) == long_.result.text


def queued(service, timeout_s: float = 10.0) -> None:
    """Wait until a request submitted is in the batcher's queue."""
    deadline = time.monotonic() + timeout_s
    while not len(service.batcher):
        assert time.monotonic() < deadline, "the request never reached the queue"
        time.sleep(0.005)


class Joining(FakeRecognizer):
    """Rows may join its batches (in-flight batching); the first batch's first step waits until
    ``queued`` is set. ``joined``: how many rows joined, each time some did."""

    def __init__(self, poison_s: float | None = None):
        super().__init__(poison_s)
        self.running, self.queued, self.joined = threading.Event(), threading.Event(), []

    def start(self, features, languages, on_delta=None):
        decoding = super().start(features, languages, on_delta)
        join = decoding.join

        def joining(new):
            if new:
                self.joined.append(len(new))
            join(new)

        decoding.join = joining
        return decoding

    def stepping(self, decoding):
        if decoding.seconds is self.batches[0] and not self.running.is_set():
            self.running.set()
            assert self.queued.wait(10)
        super().stepping(decoding)

    def room(self, decoding):
        return 8 - len(decoding.live)


def test_a_queued_request_joins_a_running_batch(service_for):
    model = Joining()
    service = service_for(model, wait_s=0.0, join=True)
    first, second = Sink(), Sink()
    service.submit(AsrJob(audio=speech(1.0), sink=first))
    assert model.running.wait(10)  # the first batch runs: a request now queued joins it
    service.submit(AsrJob(audio=speech(2.0), sink=second, language="zh"))
    queued(service)
    model.queued.set()
    assert first.finished.wait(10) and second.finished.wait(10)
    assert model.joined == [1] and len(model.batches) == 1  # one batch, the second request in it
    assert second.result.text == "chunk of 26 tenths" and second.result.language == "zh"
    assert "".join(second.deltas) == second.result.text
    assert first.result.text == "chunk of 16 tenths"


def test_a_batch_with_a_joined_row_that_raises_runs_every_row_again_alone(service_for):
    model = Joining(poison_s=2.6)  # the request that joins poisons the batch
    service = service_for(model, wait_s=0.0, join=True)
    first, second = Sink(), Sink()
    service.submit(AsrJob(audio=speech(1.0), sink=first))
    assert model.running.wait(10)
    service.submit(AsrJob(audio=speech(2.0), sink=second))
    queued(service)
    model.queued.set()
    assert first.finished.wait(10) and second.finished.wait(10)
    assert first.failure is None and first.result.text == "chunk of 16 tenths"
    assert second.failure is not None and not isinstance(second.failure, AsrRequestError)


def test_a_batch_run_again_streams_no_text_twice(service_for):
    class Flaky(FakeRecognizer):
        """Streams every row's text, then the first batch of two fails."""

        failed = False

        def stepping(self, decoding):
            if len(decoding.rows) > 1 and not self.failed:
                for row in decoding.rows:
                    decoding.on_delta(row.index, " chunk")
                self.failed = True
                raise RuntimeError("the batch failed after streaming")

    service = service_for(Flaky(), wait_s=2.0)  # both queued before a batch runs
    first, second = Sink(), Sink()
    service.submit(AsrJob(audio=speech(2.0), sink=first))
    service.submit(AsrJob(audio=speech(2.2), sink=second))
    for sink in (first, second):
        assert sink.finished.wait(10) and sink.failure is None
        assert "".join(sink.deltas) == sink.result.text  # " chunk" once, not twice
    assert service.model.failed


def test_silence_is_an_empty_transcript_without_the_model(service_for):
    model = FakeRecognizer()
    sink = run(service_for(model), encode_wav(np.zeros(RATE * 2, np.float32)))
    assert sink.failure is None and sink.result.text == "" and sink.result.chunks == 0
    assert model.batches == []


def test_a_chunk_of_silence_in_a_long_recording_is_empty_without_the_model(service_for):
    # silence, a tone, a long pause, a tone, silence: cut at 5 s, the pauses make chunks of their own
    quiet = lambda s: np.zeros(int(s * RATE), np.float32)  # noqa: E731
    audio = encode_wav(np.concatenate([quiet(6.0), tone(3.0), quiet(8.0), tone(2.0, 330.0), quiet(6.0)]))
    model = FakeRecognizer()
    sink = run(service_for(model, chunk_s=5.0), audio)
    assert sink.failure is None
    segments = sink.result.segments
    spoken = [s for s in segments if s["text"]]
    assert len(segments) > len(spoken) == 2 and sink.result.chunks == len(segments)
    assert sorted(round(s, 1) for batch in model.batches for s in batch) == sorted(
        round(s["end"] - s["start"], 1) for s in spoken
    )  # only the spoken chunks reached the model
    assert "".join(sink.deltas) == sink.result.text == " ".join(s["text"] for s in spoken)


def test_an_unknown_language_is_refused(service_for):
    sink = run(service_for(FakeRecognizer()), speech(1.0), language="fr")
    assert isinstance(sink.failure, AsrRequestError) and sink.failure.code == "bad_language"
    assert "en, zh" in str(sink.failure)


class Held(FakeRecognizer):
    """Transcribes only once ``gate`` is set: its audio stays pending meanwhile."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def start(self, *a, **kw):
        self.gate.wait(10)
        return super().start(*a, **kw)


def wait_pending(service) -> None:
    """Until some audio is decoded and held by the pool."""
    for _ in range(1000):
        if service.pending_s > 0:
            return
        threading.Event().wait(0.01)


def test_too_much_audio_waiting_is_refused_as_unavailable(service_for):
    held = Held()
    service = service_for(held, max_pending_s=5.0)
    first, second = Sink(), Sink()
    service.submit(AsrJob(audio=speech(3.0), sink=first))
    wait_pending(service)  # the first one decoded and waiting
    service.submit(AsrJob(audio=speech(3.0), sink=second))
    assert second.finished.wait(10)
    assert isinstance(second.failure, AsrRequestError) and second.failure.code == "unavailable"
    held.gate.set()
    assert first.finished.wait(10) and first.failure is None
    assert service.pending_s == 0.0


class CharRecognizer(FakeRecognizer):
    """Like the embedded default: characters, no blank before a chunk's first word."""

    def pieces(self, seconds, language):
        return list(f"{'词' * round(seconds)}。" if language == "zh" else f"Part {round(seconds)}.")


@pytest.mark.parametrize(("language", "joined"), [("en", " "), ("zh", "")])
def test_chunks_of_a_model_without_leading_blanks_join_as_their_language_writes(service_for, language, joined):
    sink = run(service_for(CharRecognizer(), chunk_s=5.0), speech(4.0, 3.0, 4.0, 2.0), language=language)
    assert sink.failure is None and sink.result.chunks >= 3
    spoken = [s["text"] for s in sink.result.segments if s["text"]]
    assert len(spoken) >= 3 and sink.result.text == joined.join(spoken)
    assert "".join(sink.deltas) == sink.result.text


class FakeBreaker:
    """What AsrService asks of a LatencyBreaker: the times it heard, and whether it is open."""

    def __init__(self, open_=False):
        self.open, self.heard = open_, []

    def observe(self, seconds):
        self.heard.append(seconds)

    def is_open(self):
        return self.open

    def p99(self):
        return 2.5 if self.open else None


def test_the_breaker_hears_short_requests_times_not_long_recordings(service_for):
    breaker = FakeBreaker()
    service = service_for(FakeRecognizer(), breaker=breaker, short_s=5.0, chunk_s=4.0)
    short = run(service, speech(2.0))
    assert short.failure is None and breaker.heard == [pytest.approx(short.result.asr_ms / 1000)]
    long = run(service, speech(3.0, 3.0))  # 7 s of audio: a recording, however fast it went
    assert long.failure is None and long.result.chunks >= 2 and len(breaker.heard) == 1


def test_an_open_breaker_refuses_priority_2_before_decoding_and_lets_priority_1_in(service_for):
    model = FakeRecognizer()
    service = service_for(model, breaker=FakeBreaker(open_=True))
    refused = run(service, b"not audio at all", priority=2)  # refused before its bytes are read
    assert isinstance(refused.failure, AsrRequestError) and refused.failure.code == "shed_breaker"
    assert "latency bound" in str(refused.failure) and "2.5 s" in str(refused.failure)
    live = run(service, speech(1.0), priority=1)
    assert live.failure is None and live.result.text and len(model.batches) == 1


def test_a_request_whose_caller_left_ends_before_the_next_decoding_step(service_for):
    class Counting(FakeRecognizer):
        steps = 0

        def stepping(self, decoding):
            self.steps += 1

    class Leaving(Sink):
        def cancelled(self):
            return bool(self.deltas)  # gone once it heard something

    model = Counting()
    service = service_for(model, wait_s=2.0)  # both queued before a batch runs
    stays, leaves = Sink(), Leaving()
    service.submit(AsrJob(audio=speech(1.0), sink=stays))
    service.submit(AsrJob(audio=speech(1.8), sink=leaves))  # the longer row: it would end at the second step
    assert stays.finished.wait(10) and leaves.finished.wait(10)
    assert stays.failure is None and leaves.failure is None
    assert model.batches == [[pytest.approx(1.6), pytest.approx(2.4)]] and model.steps == 1


def test_closing_the_pool_decodes_the_batch_under_way_to_its_end(service_for):
    running, release = threading.Event(), threading.Event()

    class Slow(FakeRecognizer):
        def stepping(self, decoding):
            running.set()
            assert release.wait(10)

    service = service_for(Slow(), wait_s=2.0)  # both queued before a batch runs: two steps
    first, second = Sink(), Sink()
    service.submit(AsrJob(audio=speech(1.0), sink=first))
    service.submit(AsrJob(audio=speech(1.8), sink=second))
    assert running.wait(10)  # its first step under way
    closing = threading.Thread(target=service.close)
    closing.start()
    release.set()
    closing.join(10)
    assert not closing.is_alive() and first.finished.is_set() and second.finished.is_set()
    assert first.failure is None and second.failure is None and service.batches == 1

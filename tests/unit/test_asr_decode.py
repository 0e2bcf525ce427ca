"""AsrModel's greedy loop against a scripted runtime: lockstep rows that finish at different
steps and leave the batch, Whisper's suppression and language detection, the stop rules, text
deltas, and the errors bad input gets."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from switchboard.asr import checkpoint
from switchboard.asr.features import log_mel
from switchboard.asr.model import AsrModel, GrowingCache, Repetition, greedy
from switchboard.asr.runtime import AsrManifest

V = 32
START, EOS, TRANSCRIBE, NOTS, EN, ZH, TIMESTAMP = 20, 21, 22, 23, 24, 25, 26
# Byte-level pieces, as Whisper's tokenizer has them: 5 and 6 are the two halves of 好.
PIECES = {0: b" Hello", 1: b" world", 2: b"!", 3: b" a", 4: b" b", 5: "好".encode()[:2], 6: "好".encode()[2:], 7: b" c"}


class Bytes:
    """A tokenizer whose tokens are byte strings (special tokens decode to nothing)."""

    def decode(self, ids, skip_special_tokens=True):
        return b"".join(PIECES.get(i, b"") for i in ids).decode("utf-8", errors="replace")


class Scripted:
    """A runtime whose rows say what ``scripts[row]`` says, one token per step. Which row a
    batch row is travels in the cross "keys" (the encoder writes the row's id there), so rows
    leaving the batch are followed; every call checks that the caches were sliced together."""

    def __init__(self, manifest: AsrManifest, scripts: list[list[int]], spoken: list[int] | None = None):
        self.manifest, self.scripts, self.spoken = manifest, scripts, spoken
        self.calls: list[tuple[list[int], list[list[int]]]] = []  # (rows, input ids) per decode

    def encode(self, features):
        rows = features[:, 0, 0].astype(np.float32)  # the tests put the row's id there
        b = len(rows)
        return [(rows.reshape(b, 1, 1, 1), np.zeros((b, 1, 1, 1), np.float32))]

    def empty_past(self, batch):
        return [(np.zeros((batch, 1, 0, 1), np.float32), np.zeros((batch, 1, 0, 1), np.float32))]

    def decode(self, input_ids, past, cross):
        rows = [int(r) for r in cross[0][0][:, 0, 0, 0]]
        b, s = input_ids.shape
        assert past[0][0].shape[0] == cross[0][1].shape[0] == b, "caches sliced with the rows"
        self.calls.append((rows, input_ids.tolist()))
        length = past[0][0].shape[2] + s
        grown = np.zeros((b, 1, length, 1), np.float32)
        return self.logits(rows, [length] * b), [(grown, grown)]

    def logits(self, rows: list[int], lengths: list[int]) -> np.ndarray:
        """What rows ``rows`` say next, having fed ``lengths`` tokens."""
        logits = np.tile(-0.01 * np.arange(V, dtype=np.float32), (len(rows), 1))  # a slight preference for low ids
        for j, (r, length) in enumerate(zip(rows, lengths)):
            n = length - self.manifest.prompt_length
            if n < 0:  # the start token alone: language detection
                logits[j, self.spoken[r]] += 10
            else:
                script = self.scripts[r]
                logits[j, script[n] if n < len(script) else EOS] += 10
        return logits


def manifest(multilingual=True, window=None, max_target=40, suppress=(), begin=(EOS,)) -> AsrManifest:
    return AsrManifest(
        name="fake",
        source="-",
        n_mels=4,
        window_frames=window,
        max_source_positions=50,
        max_target_positions=max_target,
        multilingual=multilingual,
        languages={"en": EN, "zh": ZH} if multilingual else {"en": EN},
        special={"start": START, "eos": EOS, "transcribe": TRANSCRIBE, "notimestamps": NOTS},
        suppress_tokens=list(suppress),
        begin_suppress_tokens=list(begin),
        num_layers=1,
        num_heads=1,
        head_dim=1,
        vocab_size=V,
        precisions={"fp32": {"encoder": "e.onnx", "decoder": "d.onnx"}},
    )


def model(scripts, spoken=None, **kw) -> tuple[AsrModel, Scripted]:
    m = manifest(**kw)
    runtime = Scripted(m, scripts, spoken)
    return AsrModel(runtime, m, Bytes(), hidden_tokens={TIMESTAMP}), runtime


def feats(n: int, frames: int = 30) -> list[np.ndarray]:
    out = []
    for row in range(n):
        f = np.full((4, frames + 7 * row), -1.0, np.float32)
        f[0, 0] = row
        out.append(f)
    return out


def collect():
    deltas: dict[int, list[str]] = {}
    return deltas, lambda i, d: deltas.setdefault(i, []).append(d)


def test_rows_decode_in_lockstep_and_leave_the_batch_when_done():
    scripts = [[0, 1, 2], [0], [3, 4, 3, 4, 7]]
    asr, rt = model(scripts, multilingual=False)
    deltas, on_delta = collect()
    got = asr.transcribe(feats(3), [None, "en", None], on_delta=on_delta)
    assert [t.text for t in got] == [" Hello world!", " Hello", " a b a b c"]
    assert [t.tokens for t in got] == scripts
    assert all(t.finish_reason == "eos" and t.language == "en" for t in got)
    assert ["".join(deltas[i]) for i in range(3)] == [t.text for t in got]
    assert [rows for rows, _ in rt.calls] == [[0, 1, 2], [0, 1, 2], [0, 2], [0, 2], [2], [2]]
    assert rt.calls[0][1] == [[START, NOTS]] * 3, "English-only prompt: start, no timestamps"
    assert rt.calls[1][1] == [[0], [0], [3]], "then each row's last token"


def test_each_row_is_reported_the_step_it_ends():
    asr, rt = model([[0, 1, 2], [0], [3, 4, 3, 4, 7]], multilingual=False)
    ended: list[tuple[int, str, int]] = []  # (row, its text, decode calls made by then)
    got = asr.transcribe(feats(3), [None] * 3, on_done=lambda i, t: ended.append((i, t.text, len(rt.calls))))
    assert [(i, n) for i, _, n in ended] == [(1, 2), (0, 4), (2, 6)], "shortest first, before the batch ends"
    assert [text for _, text, _ in sorted(ended)] == [t.text for t in got]


def test_cancelled_and_cut_rows_are_reported_once():
    asr, _ = model([[0, 1, 2, 3], [3, 4, 3, 7]], multilingual=False)
    ended: list[tuple[int, str]] = []
    got = asr.transcribe(
        feats(2),
        [None, None],
        max_new_tokens=3,
        cancelled=lambda row: row == 1,
        on_done=lambda i, t: ended.append((i, t.finish_reason)),
    )
    assert ended == [(1, "cancelled"), (0, "length")] and [t.finish_reason for t in got] == ["length", "cancelled"]


def test_language_is_detected_from_the_start_token_for_rows_without_one():
    asr, rt = model([[0], [5, 6], [3]], spoken=[EN, ZH, ZH])
    got = asr.transcribe(feats(3), [None, None, "en"])
    assert [t.language for t in got] == ["en", "zh", "en"], "a given language wins over detection"
    assert rt.calls[0][1] == [[START]] * 3
    assert rt.calls[1][1] == [[EN, TRANSCRIBE, NOTS], [ZH, TRANSCRIBE, NOTS], [EN, TRANSCRIBE, NOTS]]
    assert got[1].text == "好"


def test_no_detection_step_when_every_language_is_given():
    asr, rt = model([[0], [3]], spoken=[ZH, ZH])
    got = asr.transcribe(feats(2), ["EN", "zh"])
    assert rt.calls[0][1] == [[START, EN, TRANSCRIBE, NOTS], [START, ZH, TRANSCRIBE, NOTS]]
    assert [t.language for t in got] == ["en", "zh"]


def test_multibyte_characters_are_streamed_whole():
    asr, _ = model([[0, 5, 6, 2]], multilingual=False)
    deltas, on_delta = collect()
    (t,) = asr.transcribe(feats(1), [None], on_delta=on_delta)
    assert t.text == " Hello好!" and "".join(deltas[0]) == t.text
    assert not any("\ufffd" in d for d in deltas[0]), "half a character is held back"


def test_suppressed_tokens_are_never_chosen_and_the_first_token_is_not_eos():
    # Row 0 would say token 1 (suppressed): it gets the next best, token 0. Row 1 would end
    # at once (empty audio): eos is suppressed at the first step only.
    asr, _ = model([[1, 2], [EOS]], multilingual=False, suppress=(1,), begin=(EOS, 0))
    got = asr.transcribe(feats(2), [None, None])
    assert got[0].tokens == [2, 2], "step 0: 1 suppressed, 0 too at the start: the next best, 2"
    assert got[1].tokens == [2] and got[1].finish_reason == "eos"


class Choosing(Scripted):
    """A runtime whose steps choose the tokens themselves (as ``TorchWhisper``'s do on the
    device): each ``choose`` call's banned ids are recorded."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.banned: list[list[int]] = []

    def steps(self, cross, batch):
        runtime = self

        class Steps(GrowingCache):
            def choose(self, input_ids, banned):
                runtime.banned.append(banned.tolist())
                return greedy(self.step(input_ids), banned)

        return Steps(self, cross, batch)


def test_steps_that_choose_get_the_banned_tokens_and_their_choice_is_kept():
    m = manifest(multilingual=False, suppress=(1,), begin=(EOS, 0))
    runtime = Choosing(m, [[1, 2], [EOS]])
    got = AsrModel(runtime, m, Bytes()).transcribe(feats(2), [None, None])
    assert runtime.banned == [[0, 1, EOS], [1], [1]], "the first step bans the begin tokens too, later ones do not"
    assert got[0].tokens == [2, 2] and got[1].tokens == [2], "the same as chosen on the host"
    assert greedy(np.array([[3.0, 5.0, 5.0], [1.0, 0.0, 2.0]]), np.array([], np.int64)).tolist() == [1, 2]
    assert greedy(np.array([[3.0, 5.0, 5.0]]), np.array([1])).tolist() == [2], "banned, then the first on a tie"


def test_timestamp_tokens_are_kept_as_tokens_not_text():
    asr, _ = model([[0, TIMESTAMP, 1]], multilingual=False)
    (t,) = asr.transcribe(feats(1), [None])
    assert t.tokens == [0, TIMESTAMP, 1] and t.text == " Hello world"


def test_max_new_tokens_and_the_positions_left_stop_a_row():
    asr, _ = model([[0] * 100, [1]], multilingual=False, max_target=12)
    got = asr.transcribe(feats(2), [None, None], max_new_tokens=3)
    assert got[0].tokens == [0, 0, 0] and got[0].finish_reason == "length"
    assert got[1].finish_reason == "eos"
    asr.repetition = None
    (t,) = asr.transcribe(feats(1), [None])
    assert len(t.tokens) == 12 - 2 and t.finish_reason == "length", "the decoder's positions minus the prompt"
    (t,) = asr.transcribe(feats(1), [None], max_new_tokens=500)
    assert len(t.tokens) == 10, "never past the decoder's positions"


def test_a_cancelled_row_stops_and_the_others_go_on():
    asr, rt = model([[0, 1, 2, 3], [3, 4, 3, 7]], multilingual=False)
    deltas, on_delta = collect()
    asked: list[int] = []

    def cancelled(row):
        asked.append(row)
        return row == 1 and asked.count(1) > 2

    got = asr.transcribe(feats(2), [None, None], on_delta=on_delta, cancelled=cancelled)
    assert got[1].finish_reason == "cancelled" and got[1].tokens == [3, 4]
    assert got[1].text == " a b" and "".join(deltas[1]) == " a b"
    assert got[0].finish_reason == "eos" and got[0].text == " Hello world! a"
    assert [rows for rows, _ in rt.calls][2:] == [[0], [0], [0]]


def test_every_row_cancelled_before_the_first_step_decodes_nothing():
    asr, rt = model([[0], [1]], multilingual=False)
    got = asr.transcribe(feats(2), [None, None], cancelled=lambda row: True)
    assert [t.finish_reason for t in got] == ["cancelled"] * 2 and rt.calls == []


def test_a_runaway_loop_is_cut():
    loop = [3, 4, 7] * 40
    asr, _ = model([loop, [0, 1]], multilingual=False, max_target=200)
    got = asr.transcribe(feats(2), [None, None])
    assert got[0].finish_reason == "repetition" and len(got[0].tokens) == 24
    assert got[1].finish_reason == "eos"
    asr.repetition = None
    (t,) = asr.transcribe(feats(1), [None])
    assert len(t.tokens) == 120, "without the guard the loop runs to its end"


@pytest.mark.parametrize(
    "tokens,looping",
    [
        ([5] * 23, False),
        ([5] * 24, True),
        ([1, 2] * 11 + [1], False),
        ([9] + [1, 2, 3, 4, 5, 6, 7, 8] * 3, True),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 2, False),  # a sentence said twice
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 3, True),
        (list(range(30)), False),
        ([0, 0, 0, 1, 0, 0, 0, 0, 0], False),  # "no, no, no": short
    ],
)
def test_repetition_rule(tokens, looping):
    assert Repetition().looping(tokens) is looping


def test_fixed_window_features_are_padded_to_the_window():
    asr, rt = model([[0], [1]], multilingual=False, window=50)
    seen = []
    encode = rt.encode
    rt.encode = lambda f: seen.append(f.shape) or encode(f)
    asr.transcribe(feats(2, frames=20), [None, None])
    assert seen == [(2, 4, 50)]
    assert asr.features(np.zeros(1600, np.float32)).shape == (4, 50)


def test_fitted_windows_pad_each_chunk_to_a_window_that_leaves_room_after_it():
    """``fitted_windows``: a 30 s window model's chunk is padded to 10, 15 or 20 s, whichever
    leaves 7 s after its audio (else 30); a batch pads its rows to its longest's window, at least
    the shortest window; longer than the model's window is refused, not cut."""
    asr, rt = model([[0], [1]], multilingual=False, window=3000)
    asr.manifest = rt.manifest = dataclasses.replace(asr.manifest, max_source_positions=1500, fitted_windows=True)
    shapes = [asr.features(np.zeros(int(s * 16000), np.float32)).shape for s in (2, 3, 3.5, 8, 13, 14, 30)]
    assert shapes == [(4, n) for n in (1000, 1000, 1500, 1500, 2000, 3000, 3000)]
    assert (asr.padded_s(2.0), asr.padded_s(8.0), asr.padded_s(14.0)) == (10.0, 15.0, 30.0)
    seen = []
    encode = rt.encode
    rt.encode = lambda f: seen.append(f.shape) or encode(f)
    rows = [asr.features(np.zeros(16000 * s, np.float32)) for s in (2, 8)]
    for row, f in enumerate(rows):
        f[0, 0] = row
    got = asr.transcribe(rows, [None, None])
    assert [t.text for t in got] == [" Hello", " world"]
    asr.transcribe(feats(1, frames=20), [None])  # unpadded: the shortest window at least
    assert seen == [(2, 4, 1500), (1, 4, 1000)]
    with pytest.raises(ValueError, match=r"3001 frames, more than this model's 3000"):
        asr.transcribe([np.zeros((4, 3001), np.float32)], [None])
    asr.manifest = dataclasses.replace(asr.manifest, fitted_windows=False)
    assert asr.padded_s(2.0) == 30.0 and asr.features(np.zeros(32000, np.float32)).shape == (4, 3000)


def test_variable_length_features_are_padded_to_the_longest():
    asr, rt = model([[0], [1]])
    seen = []
    encode = rt.encode
    rt.encode = lambda f: seen.append(f.shape) or encode(f)
    asr.transcribe(feats(2, frames=20), ["en", "en"])
    assert seen == [(2, 4, 27)]
    assert asr.features(np.zeros(1600, np.float32)).shape == (4, 10)


@pytest.mark.parametrize(
    "features,languages,kw,match",
    [
        (feats(2), [None], {}, "2 feature arrays but 1 languages"),
        ([np.zeros((5, 10), np.float32)], [None], {}, r"features\[0\]: shape \(5, 10\), expected \[4, frames >= 1\]"),
        ([np.zeros((4, 0), np.float32)], [None], {}, r"features\[0\]: shape \(4, 0\)"),
        ([np.zeros((4, 101), np.float32)], [None], {}, r"101 frames, more than this model's 100"),
        ([np.full((4, 10), np.nan, np.float32)], [None], {}, "not finite"),
        (feats(1), ["fr"], {}, r"languages\[0\] = 'fr': not a language of this model \(en, zh\)"),
        (feats(1), [None], {"max_new_tokens": 0}, "max_new_tokens 0: expected at least 1"),
    ],
)
def test_bad_input_is_a_clear_error(features, languages, kw, match):
    asr, rt = model([[0]], spoken=[EN])
    with pytest.raises(ValueError, match=match):
        asr.transcribe(features, languages, **kw)
    assert rt.calls == []


def test_an_english_only_model_refuses_other_languages():
    asr, _ = model([[0]], multilingual=False)
    with pytest.raises(ValueError, match="'zh': this model is English-only"):
        asr.transcribe(feats(1), ["zh"])
    assert asr.languages == ["en"] and not asr.multilingual


def test_nothing_to_transcribe():
    asr, rt = model([])
    assert asr.transcribe([], []) == [] and rt.calls == []


def test_load_names_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="asr.json missing: not an ASR artifact directory"):
        AsrModel.load(tmp_path)
    manifest().save(tmp_path)
    with pytest.raises(ValueError, match="tokenizer.json missing"):
        AsrModel.load(tmp_path)
    (tmp_path / "asr.json").write_text('{"name": "x"}')
    with pytest.raises(ValueError, match="missing field"):
        AsrModel.load(tmp_path)


def test_the_manifests_hop_sets_the_features_and_the_longest_chunk(tmp_path):
    """A checkpoint with frames 20 ms apart (the embedded default's ``hop_length`` 320): the
    pool computes its features at that hop and cuts audio at its window in seconds."""
    asr, _ = model([[0]], multilingual=False, window=50)
    assert asr.max_seconds == 0.5 and asr.features(np.zeros(1600, np.float32)).shape == (4, 50)
    asr.manifest = dataclasses.replace(asr.manifest, hop_length=320)
    assert asr.max_seconds == 1.0
    speech = np.random.default_rng(0).standard_normal(16_000).astype(np.float32) * 0.1
    np.testing.assert_array_equal(asr.features(speech), log_mel(speech, 4, frames=50, hop=320))
    # what the export writes, read back; a bad hop is named
    asr.manifest.save(tmp_path)
    assert AsrManifest.load(tmp_path).hop_length == 320
    data = json.loads((tmp_path / "asr.json").read_text())
    (tmp_path / "asr.json").write_text(json.dumps(data | {"hop_length": 0}))
    with pytest.raises(ValueError, match="hop_length 0"):
        AsrManifest.load(tmp_path)


@pytest.mark.parametrize(("config", "hop"), [(None, 160), ({}, 160), ({"hop_length": 320}, 320)])
def test_a_checkpoints_hop_comes_from_its_preprocessor_config(tmp_path, config, hop):
    if config is not None:
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    assert checkpoint.hop_length(tmp_path) == hop


@pytest.mark.parametrize("bad", [0, -1, 1.5, "320", True])
def test_a_bad_hop_in_the_preprocessor_config_is_named(tmp_path, bad):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"hop_length": bad}))
    with pytest.raises(ValueError, match="preprocessor_config.json: hop_length"):
        checkpoint.hop_length(tmp_path)


class Seats:
    """Decoding state with a fixed number of seats that rows may join while it decodes
    (``TorchWhisper``'s buffers, by hand): each seat holds a row and how many tokens it fed."""

    def __init__(self, runtime: Scripted, cross, size: int):
        self.runtime, self.size = runtime, size
        self.ids, self.fed = [], []
        self.join(cross)

    def step(self, input_ids):
        return self._step(range(len(self.ids)), input_ids)

    def _step(self, seats, input_ids):
        seats = list(seats)
        assert len(seats) == input_ids.shape[0]
        self.runtime.calls.append(([self.ids[k] for k in seats], input_ids.tolist()))
        for k in seats:
            self.fed[k] += input_ids.shape[1]
        return self.runtime.logits([self.ids[k] for k in seats], [self.fed[k] for k in seats])

    def keep(self, rows):
        self.ids, self.fed = [self.ids[i] for i in rows], [self.fed[i] for i in rows]

    def room(self):
        return self.size - len(self.ids)

    def join(self, cross) -> int:
        first, new = len(self.ids), [int(r) for r in cross[0][0][:, 0, 0, 0]]
        assert len(new) <= self.room(), "more rows than seats"
        self.ids, self.fed = self.ids + new, self.fed + [0] * len(new)
        return first

    def rows(self, first, count):
        seats = self

        class Own:
            def step(self, input_ids):
                return seats._step(range(first, first + count), input_ids)

        return Own()

    def close(self):
        pass


class Seated(Scripted):
    def __init__(self, *args, seats: int = 2, **kw):
        super().__init__(*args, **kw)
        self.seats = seats

    def steps(self, cross, batch):
        return Seats(self, cross, self.seats)


@pytest.mark.parametrize("multilingual", [False, True])
def test_a_row_joins_where_one_ended_and_says_what_it_says_alone(multilingual):
    """In-flight batching: row 2 waits until row 1 leaves its seat, then feeds its prompt a token
    a step beside row 0 (a multilingual row without a language detects it on its own first)."""
    scripts, spoken = [[0, 1, 2, 7], [3], [5, 6, 2]], [EN, EN, ZH]
    m = manifest(multilingual=multilingual)
    runtime = Seated(m, scripts, spoken, seats=2)
    asr = AsrModel(runtime, m, Bytes())
    deltas, on_delta = collect()
    asked, ended = [], []

    def more(room):
        asked.append(room)
        return [(feats(3)[2], None)] if len(asked) == 1 else []

    got = asr.transcribe(feats(2), ["en", "en"], on_delta=on_delta, on_done=lambda i, t: ended.append(i), more=more)
    alone = [AsrModel(Scripted(m, scripts, spoken), m, Bytes()).transcribe([f], [None])[0] for f in feats(3)]
    assert [t.tokens for t in got] == [t.tokens for t in alone] == scripts
    assert [t.text for t in got] == [t.text for t in alone] and got[2].text == "好!"
    assert got[2].language == ("zh" if multilingual else "en")
    assert ["".join(deltas[i]) for i in range(3)] == [t.text for t in got]
    assert asked[0] == 1 and ended == [1, 0, 2], "row 1's seat taken; row 0 ends before row 2"
    assert max(len(rows) for rows, _ in runtime.calls) == 2, "never more rows than seats"

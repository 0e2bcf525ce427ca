"""switchboard.asr.batcher: length-aware batching keeps short audio away from long audio (seed
001), within a budget, VIPs first, nothing starved; the count baseline mixes them."""

import math
import random

import pytest

from switchboard.asr.batcher import CountBatcher, Item, LengthBatcher, audio_budget, length_batcher, make_batcher


def keys(batch):
    return [item.key for item in batch]


def filled(batcher, *items):
    for item in items:
        batcher.add(item)
    return batcher


def drain(batcher, now=100.0):
    batches = []
    while len(batcher):
        batch = batcher.take(now)
        assert batch, "a queue past every deadline must yield a batch"
        batches.append(batch)
    return batches


def test_shorts_and_longs_are_never_mixed_beyond_max_ratio():
    b = LengthBatcher(budget_s=1000, max_batch=16, max_ratio=2.0)
    lengths = [2, 30, 2.5, 28, 3, 16, 1, 40, 3.9, 25, 8, 2.1]
    filled(b, *(Item(i, s, arrival=i * 0.001) for i, s in enumerate(lengths)))
    batches = drain(b)
    assert sorted(k for batch in batches for k in keys(batch)) == list(range(len(lengths)))
    for batch in batches:
        seconds = [item.seconds for item in batch]
        assert max(seconds) <= 2.0 * min(seconds)
        assert seconds == sorted(seconds)  # shortest first within a batch


def test_short_work_runs_first():
    b = filled(LengthBatcher(), Item("long", 30.0, arrival=0.0), Item("short", 2.0, arrival=0.001))
    assert keys(b.take(1.0)) == ["short"]
    assert keys(b.take(1.0)) == ["long"]


def test_the_budget_is_respected():
    b = LengthBatcher(budget_s=60.0, max_batch=8, max_ratio=4.0)
    filled(b, *(Item(i, 25.0, arrival=0.0) for i in range(5)))
    batches = drain(b)
    assert [len(batch) for batch in batches] == [2, 2, 1]
    assert all(sum(item.seconds for item in batch) <= 60.0 for batch in batches)


def test_a_fixed_window_counts_each_item_as_the_window():
    # Whisper's 30 s window: a 2 s question costs the encoder a 30 s row
    b = filled(
        LengthBatcher(budget_s=60.0, max_batch=8, max_ratio=math.inf, window_s=30.0), *(Item(i, 2.0) for i in range(5))
    )
    assert b.next_due(0.0) == 0.0  # two rows fill the budget: full, due at once
    assert [len(batch) for batch in drain(b)] == [2, 2, 1]
    # items longer than the window (none reach the model, but the rule holds) count as themselves
    b = filled(
        LengthBatcher(budget_s=60.0, max_batch=8, max_ratio=math.inf, window_s=5.0), *(Item(i, 25.0) for i in range(3))
    )
    assert [len(batch) for batch in drain(b)] == [2, 1]


def test_a_window_fitted_to_the_audio_costs_each_row_its_longest_window():
    """Windows fitted to the audio (AsrModel.padded_s): a 2 s question costs a 10 s row, so six
    fill a 60 s budget where two 30 s windows did; a batch's rows are padded to its longest
    item's window, so a 12 s chunk makes every row cost 20 s."""

    def fitted(s: float) -> float:
        return 10.0 if s <= 3 else 20.0 if s <= 13 else 30.0

    b = filled(
        LengthBatcher(budget_s=60.0, max_batch=8, max_ratio=math.inf, window_s=fitted),
        *(Item(i, 2.0) for i in range(7)),
        Item("chunk", 12.0),
    )
    assert b.next_due(0.0) == 0.0  # six rows of 10 s fill the budget
    assert [keys(batch) for batch in drain(b)] == [[0, 1, 2, 3, 4, 5], [6, "chunk"]]
    with pytest.raises(ValueError, match="window_s must be finite"):
        LengthBatcher(window_s=-1.0)


def test_the_pools_batcher_follows_the_models_window():
    settings = {
        "budget_s": 60.0,
        "max_batch": 8,
        "max_length_ratio": 0.0,
        "max_wait_s": 0.01,
        "long_s": 15.0,
        "long_every": 3,
    }
    fixed, free = length_batcher(30.0, **settings), length_batcher(None, **settings)
    assert (fixed.window_s, fixed.max_ratio) == (30.0, math.inf)
    assert (free.window_s, free.max_ratio) == (0.0, 2.0)
    assert length_batcher(30.0, **(settings | {"max_length_ratio": 3.0})).max_ratio == 3.0
    filled(fixed, *(Item(i, 2.0) for i in range(8)))
    filled(free, *(Item(i, 2.0) for i in range(8)))
    assert len(fixed.take(0.0)) == 2 and len(free.take(0.0)) == 8


def test_max_batch_is_respected():
    b = filled(LengthBatcher(max_batch=3), *(Item(i, 2.0) for i in range(7)))
    assert [len(batch) for batch in drain(b)] == [3, 3, 1]


def test_an_item_longer_than_the_budget_runs_alone_and_at_once():
    b = filled(
        LengthBatcher(budget_s=60.0, starve_s=5.0), Item("huge", 90.0, arrival=0.0), Item("also", 80.0, arrival=0.0)
    )
    assert b.next_due(0.0) == 0.0
    assert keys(b.take(0.0)) == ["also"]  # the shorter of the two, alone
    assert keys(b.take(0.0)) == ["huge"]


def test_an_item_over_the_budget_never_joins_a_batch():
    b = filled(LengthBatcher(budget_s=60.0, max_ratio=100.0), Item("a", 1.0), Item("huge", 61.0))
    assert keys(b.take(10.0)) == ["a"]


def test_priority_1_never_waits_behind_priority_2():
    b = LengthBatcher()
    filled(b, Item("old", 2.0, priority=2, arrival=0.0), Item("vip", 30.0, priority=1, arrival=0.5))
    assert keys(b.take(10.0)) == ["vip"]  # longer and younger, but a VIP
    assert keys(b.take(10.0)) == ["old"]


def test_priority_2_fills_room_left_in_a_vip_batch():
    b = LengthBatcher(max_batch=4)
    filled(b, Item("vip", 3.0, priority=1), Item("p2", 3.5, priority=2), Item("far", 30.0, priority=2))
    assert keys(b.take(1.0)) == ["vip", "p2"]


def test_ageing_prevents_starvation():
    b = LengthBatcher(max_wait_s=0.01, starve_s=2.0, long_every=3)
    b.add(Item("long", 30.0, arrival=0.0))
    t = 0.0
    served = []
    # a steady stream of short questions, each ready before the previous one ran
    while "long" not in served:
        t += 0.1
        b.add(Item(f"s{t:.1f}", 2.0, arrival=t))
        served += keys(b.take(t + 0.02))
        assert t < 3.0, "the long item starved"
    # it starved at 2.0 s; the questions of 2.0 and 2.1 s went first, then the long one
    assert 2.15 <= t <= 2.25


def test_under_an_overload_long_audio_gets_every_third_batch():
    """Questions and a recording's chunks arrive faster than batches run: the chunks that have
    waited starve_s anchor one batch in long_every, the questions the rest, so the backlog lands
    on the recordings and a question waits a few batches, not starve_s."""
    b = LengthBatcher(budget_s=60.0, max_batch=2, max_wait_s=0.01, starve_s=2.0, window_s=30.0, long_every=3)
    for i in range(24):  # chunks of 30 s recordings, queued long before
        b.add(Item(f"chunk{i}", 15.0, arrival=0.0, audio_s=30.0))
    now, anchored, question_waits = 10.0, [], []
    for n in range(30):
        b.add(Item(f"q{n}", 2.0 + n % 3, arrival=now))
        batch = b.take(now + 0.01)  # a lone question waits max_wait_s for company
        anchored.append("long" if any(k.startswith("chunk") for k in keys(batch)) else "short")
        question_waits += [now + 0.01 - item.arrival for item in batch if item.key.startswith("q")]
        now += 0.5
    assert anchored[:9] == ["short", "short", "long"] * 3
    assert anchored.count("long") == 10
    assert max(question_waits) <= 1.0 + 1e-9  # the backlog waits, not the questions


def test_a_source_a_sample_shorter_than_its_resampled_chunk_is_queued():
    """A 44.1 kHz file's duration and its 16 kHz samples' can differ by a sample (a request that
    was refused here once hung its caller: the service queues chunks after the audio checks)."""
    b = LengthBatcher()
    b.add(Item("q", 3.0000625, arrival=0.0, audio_s=3.0))
    assert keys(b.take(1.0)) == ["q"]


def test_a_chunk_is_as_long_as_its_recording():
    """A 10 s chunk of a 30 s recording is long audio; a 10 s question is not."""
    b = LengthBatcher(budget_s=60.0, max_batch=1, starve_s=2.0, long_every=3)
    filled(b, Item("chunk", 10.0, arrival=0.0, audio_s=30.0), Item("question", 12.0, arrival=1.0))
    assert keys(b.take(5.0)) == ["question"]  # both starving; long audio waits for its turn
    assert keys(b.take(5.0)) == ["chunk"]  # alone: no question to go before it


def test_ageing_within_a_priority_only():
    b = LengthBatcher(starve_s=1.0)
    filled(b, Item("p2", 2.0, priority=2, arrival=0.0), Item("vip", 30.0, priority=1, arrival=9.0))
    assert keys(b.take(9.5)) == ["vip"]


def test_a_request_alone_runs_at_once_and_company_brings_the_wait_back():
    """The wait gathers a batch only while requests come in company: a caller on its own (the
    first request, or one after a batch of one that left nothing queued) is not held."""
    b = LengthBatcher(max_wait_s=0.01)
    b.add(Item("first", 2.0, arrival=1.0))
    assert keys(b.take(1.0)) == ["first"]
    b.add(Item("alone", 2.0, arrival=2.0))
    assert b.next_due(2.0) == 2.0 and keys(b.take(2.0)) == ["alone"]
    # load starts: two arrive while "alone" runs, and go together as soon as a worker is free
    filled(b, Item("a", 2.0, arrival=2.001), Item("b", 2.1, arrival=2.002))
    assert keys(b.take(2.003)) == ["a", "b"]
    # a batch had company, so the next request waits for more
    b.add(Item("c", 2.0, arrival=2.05))
    assert b.take(2.05) == [] and b.next_due(2.05) == pytest.approx(2.06)
    b.add(Item("d", 2.2, arrival=2.055))
    assert keys(b.take(2.06)) == ["c", "d"]
    # a batch of one that left another queued (too long to join it) also counts as company
    one = LengthBatcher(max_ratio=2.0, max_wait_s=0.01)
    filled(one, Item("short", 2.0, arrival=0.0), Item("long", 10.0, arrival=0.0))
    assert keys(one.take(0.0)) == ["short"]
    assert one.take(0.0) == [] and one.next_due(0.0) == pytest.approx(0.01)
    assert keys(one.take(0.01)) == ["long"]
    one.add(Item("after", 2.0, arrival=1.0))
    assert keys(one.take(1.0)) == ["after"]  # that batch was alone and left nothing


def test_a_batch_waits_max_wait_for_company_then_runs():
    """``wait_alone``: every request is held for company (Triton's dynamic batcher's rule)."""
    b = LengthBatcher(max_wait_s=0.01, wait_alone=True)
    b.add(Item("a", 2.0, arrival=1.0))
    assert b.take(1.005) == []
    assert b.next_due(1.005) == pytest.approx(1.01)
    b.add(Item("b", 2.5, arrival=1.006))
    assert keys(b.take(1.0101)) == ["a", "b"]
    assert len(b) == 0 and b.next_due(1.0101) is None


def test_a_full_batch_runs_at_once():
    b = filled(LengthBatcher(max_batch=2), Item("a", 2.0, arrival=1.0), Item("b", 2.0, arrival=1.0))
    assert b.next_due(1.0) == 1.0
    assert keys(b.take(1.0)) == ["a", "b"]
    # full by budget: no item that could still join (>= 20 s, within the ratio of 40 s) fits
    b = filled(LengthBatcher(budget_s=55.0), Item("c", 40.0, arrival=2.0))
    assert keys(b.take(2.0)) == ["c"]


@pytest.mark.parametrize("seed", range(20))
def test_next_due_is_exactly_when_take_answers(seed):
    rng = random.Random(seed)
    b = LengthBatcher(budget_s=60.0, max_batch=4, max_wait_s=0.05, starve_s=0.5)
    now = 0.0
    for i in range(30):
        seconds = rng.choice([1.0, 2.0, 3.0, 15.0, 30.0, 70.0])
        audio_s = rng.choice([None, None, seconds * 3])  # some are chunks of a longer recording
        b.add(Item(i, seconds, rng.choice([1, 2, 2]), now, audio_s))
        now += rng.random() * 0.05
        due = b.next_due(now)
        assert due >= now
        if due > now:
            assert b.take(now) == []
            assert b.take(math.nextafter(due, -math.inf)) == []
        assert b.take(due)
        now = due


def test_count_baseline_is_fifo_and_mixes_lengths():
    b = CountBatcher(max_batch=3, max_wait_s=0.01)
    filled(b, Item("long", 30.0, arrival=0.0), Item("short", 2.0, arrival=0.001), Item("mid", 9.0, arrival=0.002))
    assert keys(b.take(0.0)) == ["long", "short", "mid"]  # full: runs at once, lengths mixed


def test_count_baseline_times_out_from_the_oldest():
    b = filled(CountBatcher(max_batch=8, max_wait_s=0.01), Item("a", 2.0, arrival=1.0), Item("b", 30.0, arrival=1.004))
    assert b.take(1.009) == []
    assert b.next_due(1.009) == pytest.approx(1.01)
    assert keys(b.take(1.0101)) == ["a", "b"]


def test_count_baseline_serves_priorities_in_order():
    b = filled(
        CountBatcher(max_batch=1), Item("p2", 2.0, priority=2, arrival=0.0), Item("vip", 30.0, priority=1, arrival=1.0)
    )
    assert keys(b.take(5.0)) == ["vip"]


def test_remove_a_queued_item():
    for b in (LengthBatcher(), CountBatcher()):
        filled(b, Item("a", 2.0), Item("b", 2.0))
        assert b.remove("a").key == "a"
        assert b.remove("a") is None
        assert len(b) == 1 and keys(b.take(1.0)) == ["b"]


def test_bad_items_and_parameters_are_refused():
    b = LengthBatcher()
    for bad in (
        Item("x", -1.0),
        Item("x", math.nan),
        Item("x", math.inf),
        Item("x", 1.0, arrival=math.nan),
        Item("x", 5.0, audio_s=-1.0),
        Item("x", 5.0, audio_s=math.inf),
    ):
        with pytest.raises(ValueError, match="batcher"):
            b.add(bad)
    assert len(b) == 0
    for kw in (
        {"max_batch": 0},
        {"budget_s": 0},
        {"max_ratio": 0.5},
        {"max_wait_s": 1.0, "starve_s": 0.5},
        {"window_s": -1.0},
        {"window_s": math.inf},
        {"long_s": 0.0},
        {"long_every": 0},
        {"long_every": 2.5},
    ):
        with pytest.raises(ValueError, match="batcher"):
            LengthBatcher(**kw)


def test_make_batcher_by_name():
    length = make_batcher("length", budget_s=30.0, max_batch=4)
    assert isinstance(length, LengthBatcher) and length.budget_s == 30.0 and length.max_batch == 4
    assert isinstance(make_batcher("count", max_batch=2), CountBatcher)
    with pytest.raises(ValueError, match="length"):
        make_batcher("fifo")
    with pytest.raises(ValueError, match="budget_s"):
        make_batcher("count", budget_s=30.0)


def test_empty_batchers_have_nothing_due():
    for b in (LengthBatcher(), CountBatcher()):
        assert len(b) == 0 and b.take(0.0) == [] and b.next_due(0.0) is None


def test_under_a_backlog_short_work_still_goes_first():
    """Every item has waited past starve_s (a backlog): the anchor is the item that has waited
    longest for its length, so a short question is not queued behind older long recordings."""
    b = LengthBatcher(budget_s=60.0, max_batch=8, max_ratio=2.0, max_wait_s=0.01, starve_s=2.0)
    for i in range(4):
        b.add(Item(f"long{i}", 30.0, arrival=float(i)))
    b.add(Item("short", 3.0, arrival=5.0))
    batch = b.take(10.0)  # the longs waited 7-10 s for 30 s of audio, the short 5 s for 3 s
    assert [item.key for item in batch] == ["short"]
    b.add(Item("late short", 3.0, arrival=9.5))
    assert keys(b.take(10.0)) == ["late short"]
    # two batches passed a starving recording over: the third is the longest waiting one's
    b.add(Item("later short", 3.0, arrival=9.9))
    assert keys(b.take(10.0))[0] == "long0"
    assert keys(b.take(10.0)) == ["later short"]


def test_among_questions_the_longest_wait_for_its_length_goes_first():
    b = LengthBatcher(budget_s=60.0, max_batch=1, max_ratio=2.0, max_wait_s=0.01, starve_s=2.0)
    filled(b, Item("twelve", 12.0, arrival=0.0), Item("three", 3.0, arrival=5.0))
    assert keys(b.take(10.0)) == ["three"]  # 5 s for 3 s against 10 s for 12 s
    b.add(Item("late three", 3.0, arrival=45.0))
    assert keys(b.take(50.0)) == ["twelve"]  # 50 s for 12 s against 5 s for 3 s


def test_the_automatic_budget_is_two_windows_on_a_cpu_and_max_batch_on_a_gpu():
    assert audio_budget(0.0, 30.0, 8, gpu=False) == 60.0  # two of Whisper's windows
    assert audio_budget(0.0, 30.0, 8, gpu=True) == 240.0  # eight cost little more than one
    assert audio_budget(0.0, 5.0, 8, gpu=True) == 60.0  # never below the CPU's
    assert audio_budget(0.0, None, 8, gpu=True) == 60.0  # audio of any length: no window to count
    assert audio_budget(90.0, 30.0, 8, gpu=True) == 90.0  # a configured budget is kept

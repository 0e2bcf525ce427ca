"""The soak's memory verdict (pure: samples in, rows and pass/fail out)."""

from perf.soak import growth_rows


def samples(values_by_time):
    return [(t, v) for t, v in values_by_time]


def test_flat_memory_passes_and_warm_up_is_ignored():
    s = samples(
        [(10, {"tritonserver": 10_000, "redis used_memory": 100, "redis keys": 5})]
        + [
            (t, {"tritonserver": 50_000 + t, "redis used_memory": 1000 + (t % 3), "redis keys": 9})
            for t in range(30, 130, 10)
        ]
    )
    rows, ok = growth_rows(s, 120)
    assert ok, rows
    assert [r[0] for r in rows] == ["tritonserver", "redis used_memory per live key"]


def test_redis_is_judged_per_live_key():
    busier = samples(
        [
            (t, {"redis used_memory": 1000 * (1 + (t >= 80)), "redis keys": 10 * (1 + (t >= 80))})
            for t in range(30, 130, 10)
        ]
    )
    rows, ok = growth_rows(busier, 120)
    assert ok and rows[0][3] == "+0.0%", rows
    leaking = samples(
        [(t, {"redis used_memory": 1000 * (1 + (t >= 80)), "redis keys": 10}) for t in range(30, 130, 10)]
    )
    rows, ok = growth_rows(leaking, 120)
    assert not ok and rows[0][-1] == "GREW"


def test_growth_over_ten_percent_fails():
    s = samples([(t, {"stub chat": 50_000 + 1000 * t}) for t in range(30, 130, 10)])
    rows, ok = growth_rows(s, 120)
    assert not ok and rows[0][-1] == "GREW"


def test_no_samples_after_warm_up_fails():
    assert growth_rows([(1, {"tritonserver": 1})], 120) == ([], False)

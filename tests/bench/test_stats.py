"""The suite's two percentile readings, and what each says for no samples; ratios of figures."""

import math

from perf.stats import nearest_rank, percentile, ratio


def test_percentile_interpolates_between_ranks_and_is_nan_for_none():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert math.isnan(percentile([], 99))


def test_nearest_rank_is_one_of_the_samples_and_none_for_none():
    assert nearest_rank([4.0, 1.0, 3.0, 2.0], 50) == 3.0  # rank round(1.5) = 2 of the sorted four
    assert nearest_rank([1.0, 2.0, 3.0], 99) == 3.0
    assert nearest_rank([], 50) is None


def test_ratio_is_nan_when_a_side_is_missing():
    assert ratio(6.0, 2.0) == 3.0
    assert all(math.isnan(ratio(a, b)) for a, b in [(1, 0), (math.nan, 1), (1, math.nan), (None, 1)])

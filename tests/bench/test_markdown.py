"""The suite's one way of writing a figure in a report (perf/markdown.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perf.markdown import MISSING, ms, number, table, times


@pytest.mark.parametrize("missing", [None, math.nan, np.float64("nan"), np.float32("nan")])
def test_a_missing_figure_reads_as_a_dash_never_nan(missing):
    assert number(missing, 2) == ms(missing) == times(missing) == MISSING


def test_figures_with_their_digits_and_units():
    assert number(3.14159, 2) == "3.14" and number(2, 0, " s") == "2 s" and number(np.float32(1.25), 1) == "1.2"
    assert ms(0.4567) == "457 ms" and ms(0) == "0 ms"
    assert times(3.5) == "3.50x"


def test_a_table_is_a_header_a_rule_and_its_rows():
    assert table(["a", "b"], [[1, MISSING]]) == "| a | b |\n|---|---|\n| 1 | – |"

"""The export's choice between the packed and the padded graph (export/packed_choice.py), on
made-up timings (the passes it times: tests/bench/test_packed_cost.py)."""

from __future__ import annotations

from switchboard.export import packed_choice


def _passes(*ms: tuple[float, float, float]) -> dict:
    keys = ("padded", "packed", "per_length")
    return {f"case {i}": {"ms": dict(zip(keys, m))} for i, m in enumerate(ms)}


def test_the_packed_graph_serves_only_where_it_costs_no_more_on_every_pass():
    # each case at the padded graph's cheaper way: one padded pass or a pass per new length
    cheaper = packed_choice.choose(_passes((10.0, 6.0, 8.0), (5.0, 4.9, 5.2)))
    assert cheaper["chosen"] == "packed" and cheaper["padded_ms"] == 13.0 and cheaper["packed_ms"] == 10.9
    # far cheaper in all, but slower on one pass (the decode rows alone, most passes): padded
    assert packed_choice.choose(_passes((10.0, 6.0, 8.0), (5.0, 5.1, 5.0)))["chosen"] == "padded"
    mixed = packed_choice.choose(_passes((10.0, 3.0, 8.0), (1.0, 1.2, 1.0)))
    assert mixed["chosen"] == "padded" and mixed["ratio"] < 1 and mixed["worst_ratio"] == 1.2

"""The dashboard's picture, drawn by the bench suite from a real run: its command and how it
lays out and draws the panels of switchboard.ops.dashboard."""

from __future__ import annotations

import subprocess
import sys

from perf import dashboard_run
from switchboard.ops import dashboard
from switchboard.paths import ROOT

BOARD = dashboard.build()
EXPRS = {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard.panels(BOARD)}


def test_the_picture_is_the_bench_suites_command():
    """The picture is drawn by ``python -m perf.dashboard_run`` from the checkout (the ops layer
    does not import the bench suite): its options, help and exit status."""

    def run(*args):
        cmd = [sys.executable, "-m", "perf.dashboard_run", *args]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)

    shown = run("--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: python -m perf.dashboard_run")
    assert "--replot" in shown.stdout
    wrong = run("--no-such-option")
    assert wrong.returncode == 2 and "perf.dashboard_run: error: unrecognized arguments" in wrong.stderr


def test_the_picture_has_the_dashboard_rows_and_titles_and_draws_from_series(tmp_path):
    grid = dashboard_run.rows(BOARD)
    assert [title for title, _ in grid] == [title for title, _ in dashboard.ROWS]
    assert [[p["title"] for p in panels] for _, panels in grid] == [
        [s.title for s in specs] for _, specs in dashboard.ROWS
    ]
    assert dashboard_run.legend("P99 priority {{priority}}", {"priority": "1"}) == "P99 priority 1"
    assert dashboard_run.legend("{{ model }} x{{batch_size}}", {"model": "engine_short", "batch_size": "4"}) == (
        "engine_short x4"
    )
    data = {title: [{"name": "a", "t": [0.0, 60.0], "v": [0.0, 0.5]}] for title in EXPRS}
    data["Pools up"] = []
    out = tmp_path / "dashboard.png"
    drawn = dashboard_run.draw(BOARD, data, out, "a test", [(30.0, "restart")])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any(len(panels) > dashboard_run.PER_LINE for _, panels in grid)  # Speech, Business: a second line
    assert drawn == [p["title"] for _, panels in grid for p in panels]  # every panel, none cut off


def test_paced_turns_are_counted_by_outcome_and_error(monkeypatch):
    """The side traffic's loop: one turn per period until the duration is over, each counted
    under what it returned, a ChatError under its code, anything else as ``failed``."""
    from collections import Counter

    from switchboard.client import ChatError

    clock = {"now": 100.0}
    monkeypatch.setattr(dashboard_run.time, "time", lambda: clock["now"])
    monkeypatch.setattr(dashboard_run.time, "sleep", lambda s: clock.__setitem__("now", clock["now"] + s))

    def turn(i: int) -> str:
        clock["now"] += 0.1
        if i == 1:
            raise ChatError("busy", code="UNAVAILABLE")
        if i == 2:
            raise ConnectionError("restarting")
        return "answered"

    counts: Counter = Counter()
    dashboard_run._paced(100.0, 5.0, 1.0, counts, turn)
    assert counts == Counter({"answered": 3, "UNAVAILABLE": 1, "failed": 1})

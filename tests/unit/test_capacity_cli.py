"""``python -m switchboard.ops.capacity``: help, bad input, the plan's dry run for `make serve`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from switchboard import paths
from switchboard.ops.capacity.__main__ import main
from switchboard.ops.capacity.simulate import recorded_day

EXAMPLE = paths.ROOT / "deploy" / "capacity" / "double-11.toml"


@pytest.mark.parametrize("command", [[], ["check"], ["plan"], ["serve"], ["record"], ["simulate"]])
def test_every_command_has_help(command):
    out = subprocess.run(
        [sys.executable, "-m", "switchboard.ops.capacity", *command, "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "usage: python -m switchboard.ops.capacity" in out.stdout


def test_check_lists_when_each_promotion_asks(capsys):
    assert main(["check", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "flash sale: 2026-11-11T20:00:00+08:00" in out and "asks from 2026-11-11T19:48:30+08:00" in out


def test_a_bad_calendar_exits_2_naming_the_field(tmp_path, capsys):
    bad = tmp_path / "promotions.toml"
    bad.write_text('[[promotion]]\nname = "x"\nstart = 2026-11-11T20:00:00\nend = 2026-11-11T21:00:00Z\nreplicas = 2\n')
    assert main(["check", str(bad)]) == 2
    assert f"error: {bad}: promotion 1 (x): start: give a UTC offset" in capsys.readouterr().err


def test_a_time_without_offset_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--calendar", str(EXAMPLE), "--at", "2026-11-11T19:49:00"])
    assert e.value.code == 2 and "give a UTC offset" in capsys.readouterr().err


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    path = tmp_path_factory.mktemp("capacity") / "series.csv"
    recorded_day().write_csv(path)
    return path


@pytest.mark.parametrize(
    "replicas, fleet, says",
    [
        (None, False, "would start: make serve REPLICAS=12"),
        (2, True, "would scale `make serve` from 2 to 12 replicas (dry run): make scale REPLICAS=12"),
        (2, False, "runs 2 without a balancer that scales: to run 12, make stop && make serve REPLICAS=12"),
        (12, True, "runs 12 replicas, as planned"),
    ],
)
def test_plan_local_says_what_make_serve_would_run(tmp_path, capsys, series, replicas, fleet, says):
    if replicas:
        (tmp_path / "replicas.json").write_text(json.dumps([{"name": f"replica-{i}"} for i in range(replicas)]))
    if fleet:
        (tmp_path / "fleet.json").write_text("{}")
    argv = ["plan", "--calendar", str(EXAMPLE), "--series", str(series), "--at", "2026-11-11T19:49:00+08:00"]
    assert main([*argv, "--local", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "12 replicas (floor 2, forecast 3, calendar 15); promotions asking: flash sale" in out
    assert says in out


def test_apply_refuses_a_stack_it_cannot_scale_and_every_s_without_apply(tmp_path, capsys, series):
    argv = ["plan", "--calendar", str(EXAMPLE), "--series", str(series), "--run-dir", str(tmp_path)]
    assert main([*argv, "--at", "2026-11-11T19:49:00+08:00", "--apply"]) == 1
    assert "`make serve` is not running" in capsys.readouterr().out
    assert main([*argv, "--every-s", "5"]) == 2
    assert "--every-s repeats --apply" in capsys.readouterr().err


def test_simulate_refuses_a_series_that_does_not_cover_the_day(tmp_path, capsys):
    series = tmp_path / "short.csv"
    series.write_text("minute,chats_per_s\n2026-11-11T20:00:00+08:00,10\n")
    assert main(["simulate", "--series", str(series), "--out", str(tmp_path / "out")]) == 2
    assert "error: the series covers 2026-11-11T20:00:00+08:00" in capsys.readouterr().err


def test_record_refuses_an_end_before_its_start(tmp_path, capsys):
    argv = ["record", "--prometheus=http://127.0.0.1:1", f"--out={tmp_path / 's.csv'}"]
    assert main([*argv, "--start=2026-11-11T20:00:00Z", "--end=2026-11-11T19:00:00Z"]) == 2
    assert "is not after --start" in capsys.readouterr().err


def test_record_without_prometheus_exits_2_naming_it(tmp_path, capsys):
    from switchboard.ops.launch import free_port

    argv = ["record", f"--prometheus=http://127.0.0.1:{free_port()}", f"--out={tmp_path / 's.csv'}"]
    assert main([*argv, "--start=2026-11-11T20:00:00Z", "--end=2026-11-11T20:05:00Z"]) == 2
    assert "error: http://127.0.0.1:" in capsys.readouterr().err and not (tmp_path / "s.csv").exists()

"""A step's own lines reach the terminal; everything else, C-level writes included, its log."""

from __future__ import annotations

import logging
import os
import sys
import warnings

import pytest

from switchboard import console


@pytest.fixture(autouse=True)
def not_verbose(monkeypatch):
    monkeypatch.delenv("SWITCHBOARD_VERBOSE", raising=False)


def test_third_party_output_goes_to_the_log_and_own_lines_to_the_terminal(tmp_path, capfd):
    log = tmp_path / "step.log"
    with console.step("demo", log) as out:
        out.line("one line for the user")
        print("a library's print")
        os.write(2, b"C++ writes to fd 2\n")
        warnings.warn("a library's warning", stacklevel=1)
        logging.getLogger("somelib").info("detail")
        with out.bar(3, "work") as bar:
            bar.update(3)
    terminal = capfd.readouterr()
    assert terminal.out == "[demo] one line for the user\n" and terminal.err == ""
    text = log.read_text()
    for expected in (
        "a library's print",
        "C++ writes to fd 2",
        "a library's warning",
        "detail",
        "one line for the user",
    ):
        assert expected in text
    print("after the step")
    assert capfd.readouterr().out == "after the step\n"  # file descriptors restored


def test_a_failure_shows_the_end_of_the_log_its_path_and_the_error(tmp_path, capfd):
    log = tmp_path / "step.log"
    with pytest.raises(SystemExit) as e:
        with console.step("demo", log):
            print("the detail that explains it")
            raise SystemExit("gate failed: int8-x: greedy 0.5 < 0.8")
    assert e.value.code == "gate failed: int8-x: greedy 0.5 < 0.8"
    out = capfd.readouterr().out
    assert "the detail that explains it" in out and f"full log: {log}" in out
    assert "FAILED: gate failed" in log.read_text()


def test_an_unexpected_error_ends_the_step_with_its_traceback_in_the_log(tmp_path, capfd):
    log = tmp_path / "step.log"
    with pytest.raises(SystemExit, match="ValueError: bad shape"):
        with console.step("demo", log):
            raise ValueError("bad shape")
    assert "Traceback" in log.read_text()
    assert "Traceback" in capfd.readouterr().out  # in the tail shown on the terminal


def test_success_exits_through_the_step(tmp_path):
    with pytest.raises(SystemExit) as e:
        with console.step("demo", tmp_path / "step.log"):
            sys.exit(0)
    assert e.value.code == 0


def test_verbose_leaves_the_output_alone(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("SWITCHBOARD_VERBOSE", "1")
    with console.step("demo", tmp_path / "step.log") as out:
        print("shown")
        out.line("mine")
    assert capfd.readouterr().out == "shown\n[demo] mine\n"
    assert not (tmp_path / "step.log").exists()

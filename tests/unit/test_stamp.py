"""A build step is skipped when its inputs are unchanged, and only then (switchboard.stamp)."""

from __future__ import annotations

import pytest

from switchboard.stamp import Stamp, cached_step


def test_a_step_that_finished_is_current_for_its_key_alone(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    assert not Stamp(out, "k1").current()
    with Stamp(out, "k1").building():
        (out / "weights").write_text("w")
    assert Stamp(out, "k1").current()
    assert (out / ".inputs").read_text() == "k1\n"
    assert not Stamp(out, "k2").current()  # another corpus, code or setting
    assert not Stamp(out, "k1", ".built").current()  # the name is part of the record


def test_a_step_that_stopped_half_way_runs_again(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    with Stamp(out, "k1").building():
        pass
    with pytest.raises(RuntimeError), Stamp(out, "k2").building():
        raise RuntimeError("killed")
    assert not Stamp(out, "k1").current() and not Stamp(out, "k2").current()


def test_a_stamp_written_without_a_newline_still_counts(tmp_path):
    (tmp_path / ".built").write_text('{"inputs": "abc"}')  # as the converters wrote it before
    assert Stamp(tmp_path, '{"inputs": "abc"}', ".built").current()


def test_building_needs_no_output_directory_yet(tmp_path):
    out = tmp_path / "not-yet"
    with Stamp(out, "k").building():
        out.mkdir()  # the build makes it (an importer renames a finished folder into place)
    assert Stamp(out, "k").current()


def test_cached_step_builds_once_and_then_says_it_is_up_to_date(tmp_path, monkeypatch, capsys):
    import contextlib

    steps = []

    @contextlib.contextmanager
    def step(name):
        steps.append(name)
        yield "console"

    monkeypatch.setattr("switchboard.console.step", step)
    out, built = tmp_path / "ckpt", []

    def build(con):
        out.mkdir(exist_ok=True)
        built.append(con)

    assert cached_step(out, "k", "model-x", build) is True
    assert cached_step(out, "k", "model-x", build) is False
    assert built == ["console"] and steps == ["model-x"]
    assert capsys.readouterr().out == f"[model-x] {out} is up to date\n"
    assert (out / ".built").is_file()
    assert cached_step(out, "k2", "model-x", build) is True and len(built) == 2

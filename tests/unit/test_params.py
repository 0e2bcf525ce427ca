import pytest

from switchboard.triton.params import ConfigError, Params


def cfg(**kv):
    return {"name": "m", "parameters": {k: {"string_value": v} for k, v in kv.items()}}


def test_typed_reads_and_env_override(monkeypatch):
    p = Params(cfg(n="4", f="0.5", flag="yes", s="x"))
    assert (p.int("n", 1), p.float("f", 0.0), p.bool("flag", False), p.str("s")) == (4, 0.5, True, "x")
    assert p.int("missing", 9) == 9
    monkeypatch.setenv("SWITCHBOARD_N", "7")
    assert p.int("n", 1) == 7


@pytest.mark.parametrize(
    "kv, call",
    [
        ({"n": "four"}, lambda p: p.int("n", 1)),
        ({"n": "0"}, lambda p: p.int("n", 1, lo=1)),
        ({"b": "maybe"}, lambda p: p.bool("b", False)),
        ({"f": "nan"}, lambda p: p.float("f", 1.0)),
    ],
)
def test_bad_values_name_the_field(kv, call):
    with pytest.raises(ConfigError, match=f"parameter '{next(iter(kv))}'"):
        call(Params(cfg(**kv)))

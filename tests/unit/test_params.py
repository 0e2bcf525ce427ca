import pytest

from switchboard.repository.params import ConfigError, Params


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


@pytest.mark.parametrize(
    "mode,compute_bound,own",
    [("auto", False, True), ("auto", True, False), ("on", True, True), ("off", False, False), (" Off ", True, False)],
)
def test_priority_lane_auto_shares_the_batch_only_on_a_compute_bound_model(mode, compute_bound, own):
    from switchboard.repository.config import EngineConfig

    assert EngineConfig(priority_lane=mode).own_priority_lane(compute_bound) is own


def test_a_bad_priority_lane_names_the_parameter():
    from switchboard.repository.config import EngineConfig

    with pytest.raises(ValueError, match="'priority_lane' = 'sometimes': expected auto, on or off"):
        EngineConfig(priority_lane="sometimes").own_priority_lane(False)


def test_compute_bound_means_a_large_model_on_the_cpu():
    from switchboard.engine.sizing import MANY_THREADS_FROM_BYTES, compute_bound

    assert compute_bound(2 << 30, "onnxruntime") and compute_bound(MANY_THREADS_FROM_BYTES, "torch:cpu")
    assert not compute_bound(15 << 20, "onnxruntime"), "the default model: Python and the server take the cores"
    assert not compute_bound(2 << 30, "torch:cuda") and not compute_bound(2 << 30, "triton:decoder"), "a GPU"

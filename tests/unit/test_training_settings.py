"""``--set KEY=VALUE`` for every trainer (switchboard.training.settings): one rule for the
value's type and for the error that names the settings there are."""

from __future__ import annotations

import dataclasses

import pytest

from switchboard.training.settings import override


@dataclasses.dataclass(frozen=True)
class Data:
    utterances: int = 10
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Model:
    lr: float = 0.1
    seed: int = 0
    utterances: int = 99  # also a field of Data: the first part that has it takes it


@dataclasses.dataclass(frozen=True)
class Build:
    data: Data = Data()
    model: Model = Model()


def test_a_nested_setting_lands_in_the_first_part_that_has_it():
    cfg = override(Build(), "lr=0.5", parts=("data", "model"))
    assert cfg.model.lr == 0.5 and cfg.data == Data()
    cfg = override(cfg, "utterances=3", parts=("data", "model"))
    assert cfg.data.utterances == 3 and cfg.model.utterances == 99


def test_a_fixed_setting_is_refused_and_left_out_of_the_names():
    with pytest.raises(ValueError, match="KEY one of utterances, lr, utterances$"):
        override(Build(), "seed=3", parts=("data", "model"), fixed=("seed",))


def test_the_value_takes_the_defaults_type():
    assert override(Data(), "seed=7") == Data(seed=7)
    with pytest.raises(ValueError, match="lr must be float"):
        override(Build(), "lr=fast", parts=("data", "model"))

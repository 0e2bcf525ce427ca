"""Build steps skipped when what they are made of is unchanged.

A step (training a model, converting a checkpoint, exporting artifacts) writes its output
directory and, last, a stamp file in it holding the key of its inputs: digests of the files it
reads and of its own code, and its settings. The next run with the same key finds the stamp and
does nothing. The stamp is removed before the step starts and written only when it succeeded,
so a step that stopped half way runs again.

Each step computes its own key (what it depends on is its business); this module only keeps
the record. The stamp's name is part of what other code reads: ``.inputs`` next to a trained
checkpoint or an export, ``.built`` next to a converted or random-weight checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

INPUTS = ".inputs"
BUILT = ".built"


class Stamp:
    """The record, in ``out``, of the key of the inputs ``out`` was built from."""

    def __init__(self, out: Path, key: str, name: str = INPUTS):
        self.out, self.key = Path(out), key
        self.path = self.out / name

    def current(self) -> bool:
        """Whether ``out`` was built, to the end, from inputs with this key."""
        return self.path.is_file() and self.path.read_text().strip() == self.key

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """Around the build: the old stamp goes first, the new one is written if the build returns."""
        self.path.unlink(missing_ok=True)
        yield
        self.path.write_text(self.key + "\n")


def cached_step(out: Path, key: str, step: str, build: Callable, name: str = BUILT) -> bool:
    """``build(console)`` writes ``out`` inside the console step ``step``, unless ``out`` is
    current; then one line says so and no step (nor its log) is opened. Whether it built."""
    stamp = Stamp(out, key, name)
    if stamp.current():
        print(f"[{step}] {out} is up to date")
        return False
    from switchboard import console

    with console.step(step) as con, stamp.building():
        build(con)
    return True

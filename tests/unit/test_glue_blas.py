"""Every Triton model's ``initialize`` first puts numpy's BLAS on one thread: idle OpenBLAS
workers spin in sched_yield between small products and took CPU from the asr stub
under load (docs/benchmarks.md)."""

from __future__ import annotations

import numpy  # noqa: F401 (loads the OpenBLAS it bundles)
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from tests.unit.pb_stub import forget, stub_glue

GLUE = [
    "switchboard.triton.asr_model",
    "switchboard.triton.chat_model",
    "switchboard.triton.engine_model",
    "switchboard.triton.voice_chat_model",
]


def blas_threads() -> set[int]:
    return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}


def test_one_blas_thread_limits_numpys_blas(monkeypatch):
    common = stub_glue(monkeypatch, "switchboard.triton.common")
    try:
        with threadpool_limits(limits=2, user_api="blas"):  # put back afterwards
            assert blas_threads() == {2}
            common.one_blas_thread()
            assert blas_threads() == {1}
    finally:
        forget("switchboard.triton.common")


@pytest.mark.parametrize("module", GLUE)
def test_every_model_limits_blas_as_it_initializes(monkeypatch, module):
    glue = stub_glue(monkeypatch, module)
    try:

        class Limited(Exception):
            pass

        def limited():
            raise Limited

        monkeypatch.setattr(glue, "load_config", lambda args: ({"name": "m"}, None))
        monkeypatch.setattr(glue, "require_decoupled", lambda config: None)
        monkeypatch.setattr(glue, "one_blas_thread", limited)
        with pytest.raises(Limited):
            glue.TritonPythonModel().initialize({})
    finally:
        forget(module)

"""A stand-in for ``triton_python_backend_utils`` (which exists only inside tritonserver), for
testing the Triton glue once each. Installed per test by ``stub_glue``, never at import time."""

from __future__ import annotations

import importlib
import sys
import types

FINAL = 1


class Tensor:
    def __init__(self, name, array):
        self.name, self.array = name, array

    def as_numpy(self):
        return self.array


class Response:
    def __init__(self, output_tensors=(), error=None):
        self.outputs = {t.name: t.array for t in output_tensors}
        self.error = error


class TritonError:
    INTERNAL, INVALID_ARG, UNAVAILABLE, CANCELLED = "INTERNAL", "INVALID_ARG", "UNAVAILABLE", "CANCELLED"

    def __init__(self, message, code):
        self.message, self.code = message, code


def _stub_module():
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor, pb.InferenceResponse, pb.TritonError = Tensor, Response, TritonError
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    pb.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    return pb


def stub_glue(monkeypatch, module: str):
    """Import ``module`` (a switchboard.triton glue module) against the stub; the caller's
    monkeypatch undoes it."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _stub_module())
    for name in _glue_modules(module):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(module)


def forget(module: str) -> None:
    for name in _glue_modules(module):
        sys.modules.pop(name, None)


def _glue_modules(module: str) -> list[str]:
    """``module`` and the glue modules it may import, each bound to the stub it was imported with."""
    return sorted({module, *(name for name in sys.modules if name.startswith("switchboard.triton."))})

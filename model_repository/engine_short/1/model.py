"""Triton entry point: the logic lives in switchboard.triton.engine_model."""

from switchboard.triton.engine_model import TritonPythonModel  # noqa: F401

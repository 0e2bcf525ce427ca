"""Triton entry point: the logic lives in switchboard.triton.asr_model."""

from switchboard.triton.asr_model import TritonPythonModel  # noqa: F401

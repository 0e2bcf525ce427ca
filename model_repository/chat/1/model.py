"""Triton entry point: the logic lives in switchboard.triton.chat_model."""

from switchboard.triton.chat_model import TritonPythonModel  # noqa: F401

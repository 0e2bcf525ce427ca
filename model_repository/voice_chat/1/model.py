"""Triton entry point: the logic lives in switchboard.triton.voice_chat_model."""

from switchboard.triton.voice_chat_model import TritonPythonModel  # noqa: F401

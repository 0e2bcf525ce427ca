"""Switchboard: real-time customer-service LLM chat on NVIDIA Triton Inference Server.

The core package imports without Triton; only ``switchboard.triton`` talks to
``triton_python_backend_utils`` and it does so lazily, inside the server.
"""

__version__ = "0.1.0"

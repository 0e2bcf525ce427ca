"""Helpers shared by the Python-backend models (imported only inside tritonserver)."""

from __future__ import annotations

import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

from switchboard.triton.params import ConfigError
from switchboard.wire import tag


def load_config(args: dict) -> tuple[dict, Path]:
    """The model config and the version folder that holds the installed artifacts."""
    config = json.loads(args["model_config"])
    version = Path(args["model_repository"]) / args["model_version"]
    return config, version


def require_decoupled(config: dict) -> None:
    if not pb_utils.using_decoupled_model_transaction_policy(config):
        raise ConfigError(f"{config['name']}/config.pbtxt: model_transaction_policy {{ decoupled: true }} is required")


def request_parameters(request) -> dict:
    raw = request.parameters()
    try:
        params = json.loads(raw) if raw else {}
    except ValueError:
        params = {}
    return params if isinstance(params, dict) else {}


def input_array(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def send_error(sender, message: str, code: str = "INTERNAL") -> None:
    """A final error response; ``code`` is a TritonError code name, also written at the head of
    the message (switchboard.wire) because 2.51 streams drop codes without the error header."""
    error = pb_utils.TritonError(tag(code, message), getattr(pb_utils.TritonError, code))
    sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

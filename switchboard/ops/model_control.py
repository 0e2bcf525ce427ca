"""Triton's model-repository API, as the operators use it: load one model, or reload it.

The server runs with ``--model-control-mode explicit`` and answers this API only to requests
carrying the operator key (``OPERATOR_HEADER``). Loading a model whose files changed (a new
version: switchboard.ops.rollout) loads what changed. Loading one whose files and config did
not change does nothing, even when its stub process died (Triton keeps no note of that), so
``reload_model`` sends the model's own config with a parameter that changes on every call:
Triton then starts new instances, moves traffic to them once they are ready and unloads the old
ones, and a model whose stub died comes back without restarting the server
(switchboard.ops.supervisor).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

OPERATOR_HEADER = "switchboard-operator-key"


class ModelControlError(RuntimeError):
    """The server refused or failed the load."""


RELOAD_PARAMETER = "switchboard_reload"  # not read by the models: it only makes the config new


def load_model(http_url: str, model: str, key: str, timeout_s: float = 600, config: dict | None = None) -> None:
    """Load ``model`` on the server at ``http_url`` (``http://host:port``), with ``config`` in
    place of its config.pbtxt if given; returns once it is ready. Raises ``ModelControlError``
    naming the server, the model and the server's reason."""
    body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
    request = urllib.request.Request(
        f"{http_url}/v2/repository/models/{model}/load",
        data=json.dumps(body).encode(),
        method="POST",
        headers={OPERATOR_HEADER: key, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:500]
        raise ModelControlError(f"{http_url}: loading {model} failed ({e.code}): {detail}") from None
    except OSError as e:
        raise ModelControlError(f"{http_url}: loading {model} failed: {e}") from None


def reload_model(http_url: str, model: str, key: str, timeout_s: float = 600) -> None:
    """Load ``model`` again, new instances in place of the running ones, though nothing changed."""
    try:
        with urllib.request.urlopen(f"{http_url}/v2/models/{model}/config", timeout=10) as r:
            config = json.loads(r.read())
    except (OSError, ValueError) as e:
        raise ModelControlError(f"{http_url}: reading {model}'s config failed: {e}") from None
    config.setdefault("parameters", {})[RELOAD_PARAMETER] = {"string_value": str(time.time_ns())}
    load_model(http_url, model, key, timeout_s, config)


def version_ready(http_url: str, model: str, version: str) -> bool:
    """Whether Triton has ``model``'s ``version`` loaded and READY (a version whose stub died
    still is, in 2.51); True when the server cannot say, so the caller acts as for a dead stub."""
    try:
        with urllib.request.urlopen(f"{http_url}/v2/models/{model}/versions/{version}/ready", timeout=5) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False
    except OSError:
        return True

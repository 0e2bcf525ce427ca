"""One typed reader for ``config.pbtxt`` parameters, with one rule for booleans.

Every parameter can be overridden by an environment variable ``SWITCHBOARD_<KEY>`` (upper
case), which is how tests and deployments point a repository at their Redis without editing
the repository. Bad values fail model loading with a message naming the file and field.
"""

from __future__ import annotations

import os

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    pass


class Params:
    def __init__(self, model_config: dict, source: str = "config.pbtxt"):
        self.source = f"{source} ({model_config.get('name', '?')})"
        self._raw = {k: v.get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()}

    def _get(self, key: str) -> str | None:
        env = os.environ.get(f"SWITCHBOARD_{key.upper()}")
        return env if env is not None else self._raw.get(key)

    def _fail(self, key: str, value: str, want: str) -> ConfigError:
        return ConfigError(f"{self.source}: parameter {key!r} = {value!r}: expected {want}")

    def str(self, key: str, default: str | None = None) -> str | None:
        value = self._get(key)
        return default if value in (None, "") else value

    def int(self, key: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        value = self._get(key)
        if value in (None, ""):
            return default
        try:
            out = int(value)
        except ValueError:
            raise self._fail(key, value, "an integer") from None
        if (lo is not None and out < lo) or (hi is not None and out > hi):
            raise self._fail(key, value, f"an integer in [{lo}, {hi}]")
        return out

    def float(self, key: str, default: float, lo: float | None = None, hi: float | None = None) -> float:
        value = self._get(key)
        if value in (None, ""):
            return default
        try:
            out = float(value)
        except ValueError:
            raise self._fail(key, value, "a number") from None
        if out != out or (lo is not None and out < lo) or (hi is not None and out > hi):
            raise self._fail(key, value, f"a number in [{lo}, {hi}]")
        return out

    def bool(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value in (None, ""):
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise self._fail(key, value, "true or false")

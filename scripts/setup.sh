#!/usr/bin/env bash
# Installs everything Switchboard needs on a plain Debian 12 machine: system packages,
# the pinned Python environment, and a Triton backend directory for the Python backend.
# Idempotent: every step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
# The Python backend stub in the tritonserver build links Debian's libpython3.11 and then
# imports the standard library of the environment first on PATH; a venv made from any other
# 3.11 (pyenv, a newer patch release) mixes two interpreters and fails in C extensions such
# as _ssl. So the venv is always made from Debian's own python3.11.
PY=${PYTHON:-/usr/bin/python3.11}

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v openssl >/dev/null || need_apt+=(openssl)   # certificates for the Redis TLS test
ldconfig -p | grep -q libb64.so.0d || need_apt+=(libb64-0d)
ldconfig -p | grep -q libjemalloc.so.2 || need_apt+=(libjemalloc2)   # tritonserver's allocator (launch.py)
ldconfig -p | grep -q libpython3.11.so.1.0 || need_apt+=(libpython3.11)
[ -x "$PY" ] || need_apt+=(python3.11)
"$PY" -c "import ensurepip" 2>/dev/null || need_apt+=(python3.11-venv)
if ((${#need_apt[@]})); then
  echo "==> installing system packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

want_home=$(dirname "$(readlink -f "$PY")")
if [ -f "$VENV/pyvenv.cfg" ] && ! grep -qx "home = $want_home" "$VENV/pyvenv.cfg"; then
  echo "==> $VENV was made from another Python; re-creating it from $PY"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.switchboard-setup"
want=$(cat requirements.lock pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> installing pinned Python packages (requirements.lock)"
  # pip warns once per package about this machine's extra local index folders; keep the rest.
  quiet() { "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }
  quiet "$VENV/bin/pip" install -q --upgrade pip
  quiet "$VENV/bin/pip" install -q -r requirements.lock
  # setuptools is chatty about editable installs; show its output only if it fails.
  "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e . >"$VENV/editable-install.log" 2>&1 \
    || { cat "$VENV/editable-install.log"; exit 1; }
  echo "$want" > "$stamp"
fi

# Triton looks for backends/<name>/ under --backend-directory; the pytriton wheel keeps
# the Python backend and its per-Python stubs apart, so assemble the directory once.
"$VENV/bin/python" -m switchboard.triton.install_backend build/triton/backends
echo "==> setup done ($VENV, build/triton/backends)"

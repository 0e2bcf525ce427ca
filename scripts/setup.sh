#!/usr/bin/env bash
# Installs everything Switchboard needs on a plain Debian 12 machine: system packages,
# the pinned Python environment, and a Triton backend directory for the Python backend.
# Idempotent: every step checks before it acts. Prints a line per step; apt's and pip's own
# output goes to build/logs/setup.log, shown when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
# The Python backend stub in the tritonserver build links Debian's libpython3.11 and then
# imports the standard library of the environment first on PATH; a venv made from any other
# 3.11 (pyenv, a newer patch release) mixes two interpreters and fails in C extensions such
# as _ssl. So the venv is always made from Debian's own python3.11.
PY=${PYTHON:-/usr/bin/python3.11}
LOG=build/logs/setup.log
mkdir -p "$(dirname "$LOG")"
: > "$LOG"
t0=$SECONDS

say() { echo "[setup] $*"; }
# Runs a command with its output in the log; on failure shows the log's end and stops.
run() {
  echo "+ $*" >> "$LOG"
  if ! "$@" >> "$LOG" 2>&1; then
    tail -n 40 "$LOG"
    say "FAILED: $*"
    say "full log: $LOG"
    exit 1
  fi
}
# Runs pip with a one-line progress bar on a terminal: packages collected out of those pinned.
pip_install() {
  local total=$1; shift
  echo "+ pip install $*" >> "$LOG"
  "$VENV/bin/pip" install --progress-bar off "$@" >> "$LOG" 2>&1 &
  local pid=$! start n
  start=$(wc -l < "$LOG")
  if [ -t 1 ]; then
    while kill -0 "$pid" 2>/dev/null; do
      n=$(tail -n +"$start" "$LOG" | grep -c '^Collecting' || true)
      if tail -n +"$start" "$LOG" | grep -q '^Installing collected'; then
        printf '\r[setup]   installing %d packages ... %ds ' "$total" $((SECONDS - t0))
      else
        printf '\r[setup]   collecting %d/%d ... %ds ' "$n" "$total" $((SECONDS - t0))
      fi
      sleep 1
    done
    printf '\r\033[K'
  fi
  if ! wait "$pid"; then
    tail -n 40 "$LOG"
    say "FAILED: pip install $*"
    say "full log: $LOG"
    exit 1
  fi
}

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v openssl >/dev/null || need_apt+=(openssl)   # certificates for the Redis TLS test
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need_apt+=(haproxy)   # gRPC balancer for REPLICAS=2
# SETUP_TEST_TOOLS=0 (deploy/Dockerfile's build stage): without what only the tests and `make
# monitor` run; a pod runs none of them and the runtime stage would not keep them anyway.
if [ "${SETUP_TEST_TOOLS:-1}" != 0 ]; then
  command -v promtool >/dev/null || need_apt+=(prometheus)   # make monitor; promtool tests of the alert rules
  command -v prometheus-alertmanager >/dev/null || need_apt+=(prometheus-alertmanager)
  command -v chromium >/dev/null || need_apt+=(chromium)   # the web chat test (Playwright drives the system browser)
fi
command -v espeak-ng >/dev/null || need_apt+=(espeak-ng)   # speech to train the default recognizer on and to test with
ldconfig -p | grep -q libb64.so.0d || need_apt+=(libb64-0d)
ldconfig -p | grep -q libjemalloc.so.2 || need_apt+=(libjemalloc2)   # tritonserver's allocator (launch.py)
ldconfig -p | grep -q libpython3.11.so.1.0 || need_apt+=(libpython3.11)
[ -x "$PY" ] || need_apt+=(python3.11)
"$PY" -c "import ensurepip" 2>/dev/null || need_apt+=(python3.11-venv)
if ((${#need_apt[@]})); then
  say "installing system packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  run $SUDO apt-get update -qq
  run $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

want_home=$(dirname "$(readlink -f "$PY")")
if [ -f "$VENV/pyvenv.cfg" ] && ! grep -qx "home = $want_home" "$VENV/pyvenv.cfg"; then
  say "$VENV was made from another Python; re-creating it from $PY"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  run "$PY" -m venv "$VENV"
fi
# requirements.lock: what Switchboard runs on; requirements-dev.lock: the tests', benchmarks' and
# lint's packages, left out where SETUP_TEST_TOOLS=0 (the image).
locks=(requirements.lock)
[ "${SETUP_TEST_TOOLS:-1}" = 0 ] || locks+=(requirements-dev.lock)
stamp="$VENV/.switchboard-setup"
want=$(cat "${locks[@]}" pyproject.toml setup.py | sha256sum | cut -c1-16)   # setup.py: the package layout
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing pinned Python packages (${locks[*]}; a minute or two on a fresh clone)"
  run "$VENV/bin/pip" install -q --upgrade pip
  pip_install "$(cat "${locks[@]}" | grep -c '==')" "${locks[@]/#/-r}"
  run "$VENV/bin/pip" install --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi

# Commit subjects of at most 72 characters (scripts/hooks/commit-msg), in a checkout whose hooks
# are not set up otherwise.
if [ -d .git ] && [ -z "$(git config --get core.hooksPath || true)" ]; then
  git config core.hooksPath scripts/hooks
fi

# Triton looks for backends/<name>/ under --backend-directory; the pytriton wheel keeps
# the Python backend and its per-Python stubs apart, so assemble the directory once.
run "$VENV/bin/python" -m switchboard.ops.install_backend build/triton/backends
if ((SECONDS - t0 > 2)); then
  say "done in $((SECONDS - t0)) s ($VENV, build/triton/backends; log: $LOG)"
else
  say "up to date ($VENV)"
fi

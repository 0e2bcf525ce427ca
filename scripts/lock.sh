#!/usr/bin/env bash
# Re-resolves the pins: requirements.in into requirements.lock (what Switchboard runs on, all the
# image installs), then requirements-dev.in on top of it into requirements-dev.lock (the tests',
# benchmarks' and lint's packages, those requirements.lock does not already pin). Resolved in a
# fresh venv, so nothing installed by hand leaks into a lock.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build/lock-venv
PY=${PYTHON:-/usr/bin/python3.11}
rm -rf "$VENV"
"$PY" -m venv "$VENV"
freeze() { "$VENV/bin/pip" freeze --exclude-editable | sed 's/+cpu$//'; }
echo "[lock] resolving requirements.in"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -r requirements.in
freeze > requirements.lock
echo "[lock] resolving requirements-dev.in on top of requirements.lock"
"$VENV/bin/pip" install -q -r requirements-dev.in
freeze | grep -vxF -f requirements.lock > requirements-dev.lock
rm -rf "$VENV"
echo "[lock] requirements.lock: $(grep -c '==' requirements.lock) pins; requirements-dev.lock: $(grep -c '==' requirements-dev.lock)"

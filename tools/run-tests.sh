#!/usr/bin/env bash
# Installs everything the test suite needs on a machine that has only python3, then runs it.
# Used by the README and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found; installing it with apt-get" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

# The System Health page test drives Debian's chromium through Playwright (no browser download).
if [ ! -x /usr/bin/chromium ]; then
  echo "chromium not found; installing it with apt-get" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e '.[test]'

# House style is part of the suite: lint everything, type-check the protocol and the coordinator
# strictly (pyproject.toml's [tool.mypy] lists the few modules temporarily excluded).
.venv/bin/ruff check .
.venv/bin/mypy --strict protocol coordinator

exec .venv/bin/python -m pytest "$@"

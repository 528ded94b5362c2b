#!/usr/bin/env bash
# Installs everything the test suite needs on a machine that has only python3, then runs it.
# Used by the README and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the suite needs, installed with apt-get when missing:
# - redis-server: the Redis tests and every multi-instance end-to-end test;
# - chromium: the System Health page test drives Debian's chromium through Playwright (no
#   browser download);
# - prometheus (for promtool): checks deploy/prometheus/rules.yml and runs its unit tests
#   (tests/coordinator/test_metrics_rules.py).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing with apt-get: ${missing[*]}" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# The exact versions CI tests (constraints.txt; pyproject.toml has only ranges): an existing
# venv is moved to them too, so every run tests the same set.
.venv/bin/python -m pip install -q -c constraints.txt -e '.[test]'

# House style is part of the suite: lint and format-check everything, type-check the protocol,
# the coordinator and the simulator strictly (the tools are followed for types only:
# pyproject.toml's [tool.mypy]).
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy --strict protocol coordinator sim

# Three workers on a 2-core machine: the tests wait on real processes and sockets for about a
# third of their time, so a third worker fills the gaps (measured on a fresh clone: 450 s with
# two, 348 s with three; four made timing-sensitive tests flaky). GEMMANET_TEST_WORKERS=0 runs
# it in one process. The timing bounds of the tests are written for a loaded machine.
exec .venv/bin/python -m pytest -n "${GEMMANET_TEST_WORKERS:-3}" --dist load "$@"

#!/usr/bin/env bash
# The project's test command, on a fresh machine too: sets up the pinned CPU virtualenv (ci/setup.sh: creates
# it when absent, installs requirements/cpu.lock when what is installed differs), then runs pytest offline.
# Extra arguments go to pytest, e.g. `bash ci/test.sh -k zero3`. VENV (default .venv) and PYTHON as in ci/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
VENV=${VENV:-.venv}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Two pytest-xdist workers by default, tests handed out one by one (`--dist load`), the smoke module's first
# (tests/conftest.py says why); the smoke runs that tests of several modules share are made once per session, by the
# first worker that needs each (tests/helpers/launcher.py SmokeRuns). A training run leaves part of two cores idle (start-up,
# teardown, waits), which the other worker's tests fill. TEST_WORKERS=N for N workers; TEST_WORKERS=0 runs pytest in
# one process without xdist (e.g. to debug with -s or --pdb).
workers=${TEST_WORKERS:-2}
xdist=()
[ "$workers" != 0 ] && xdist=(--numprocesses "$workers" --dist load)
# Lint first (ruff, pinned in requirements/cpu.lock; its rules in pyproject.toml [tool.ruff]): a second, not minutes.
"$VENV/bin/ruff" check .
exec "$VENV/bin/python" -m pytest "${xdist[@]}" "$@"

#!/usr/bin/env bash
# The project's test command (README "Tests"): builds a pinned CPU virtualenv from requirements/ on a fresh
# machine, then runs pytest. Extra arguments go to pytest, e.g. `bash ci/test.sh -k zero3`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements/cpu.txt
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e .
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$VENV/bin/python" -m pytest "$@"

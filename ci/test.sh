#!/usr/bin/env bash
# The project's test command, on a fresh machine too: sets up the pinned CPU virtualenv (ci/setup.sh: creates
# it when absent, installs requirements/cpu.lock when what is installed differs), then runs pytest offline.
# Extra arguments go to pytest, e.g. `bash ci/test.sh -k zero3`. VENV (default .venv) and PYTHON as in ci/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
VENV=${VENV:-.venv}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$VENV/bin/python" -m pytest "$@"

#!/usr/bin/env bash
# The launcher on a fresh machine, without Docker: sets up the pinned CPU virtualenv (ci/setup.sh: creates it
# when absent, installs requirements/cpu.lock when what is installed differs), then runs `python -m launch`
# with these arguments in the current folder, e.g. `bash ci/launch.sh zero3 --smoke --cpu`.
# VENV (relative to the repository, default .venv) and PYTHON as in ci/setup.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
VENV=${VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$root/$VENV" ;; esac
VENV="$VENV" bash "$root/ci/setup.sh" >&2
exec "$VENV/bin/python" -m launch "$@"

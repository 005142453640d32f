#!/usr/bin/env bash
# Sets up the pinned CPU virtualenv from requirements/cpu.lock: creates it when absent, installs the lock when
# what is installed differs from it, installs this repository (editable: `launch` importable from the train
# scripts). A no-op, in about a second, when everything already matches. Used by ci/test.sh (the tests) and
# ci/launch.sh (the launcher).
#
#   VENV=.venv       where the virtualenv lives
#   PYTHON=python3   the interpreter that creates it: CPython 3.11 (the lock's target)
#   --check          change nothing: exit 0 when the virtualenv matches the lock, 1 when not
#
# torch is its CPU build (torch==<pin>+cpu in the lock), which is not on the package index: pip takes it from
# a wheel directory it is already configured with (PIP_FIND_LINKS, pip.conf), else from PyTorch's CPU wheel page.
# Every install of the lock is `pip install --require-hashes`: each file pip fetches (torch's CPU wheel included,
# wherever it comes from) must have one of the sha256 hashes its lock entry lists, or nothing is installed. This
# repository itself is installed editable afterwards, on its own (a local tree has no hash to check).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
check_only=false
case "${1:-}" in
    --check) check_only=true ;;
    "") ;;
    *) echo "usage: bash ci/setup.sh [--check]" >&2; exit 2 ;;
esac
LOCK=requirements/cpu.lock
TORCH_CPU_WHEELS=${TORCH_CPU_WHEELS:-https://download.pytorch.org/whl/cpu/torch/}

python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
if [ ! -x "$VENV/bin/python" ]; then
    if $check_only; then echo "ci/setup.sh: no virtualenv at $VENV" >&2; exit 1; fi
    if [ "$(python_version "$PYTHON")" != 3.11 ]; then
        echo "ci/setup.sh: $LOCK is for CPython 3.11 but $PYTHON is $(python_version "$PYTHON"): set PYTHON=python3.11" >&2
        exit 2
    fi
    echo "ci/setup.sh: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
if [ "$(python_version "$VENV/bin/python")" != 3.11 ]; then
    echo "ci/setup.sh: $VENV is Python $(python_version "$VENV/bin/python"), $LOCK is for 3.11: remove $VENV" >&2
    exit 2
fi

py="$(cd "$VENV" && pwd)/bin/python"
pip() { "$py" -m pip --disable-pip-version-check "$@"; }

# Up to date: every package of the lock is installed at its version (launch/pins.py reads the lock; it needs
# `packaging`, so on a new virtualenv this fails and the install runs) and `launch` is this checkout's.
up_to_date() {
    "$py" -m launch.pins check "$LOCK" > /dev/null 2>&1 \
        && [ "$(cd / && "$py" -c 'import launch; print(launch.__file__)' 2>/dev/null)" = "$PWD/launch/__init__.py" ]
}

if up_to_date; then
    echo "ci/setup.sh: $VENV matches $LOCK"
    exit 0
fi
if $check_only; then
    echo "ci/setup.sh: $VENV differs from $LOCK:" >&2
    "$py" -m launch.pins check "$LOCK" >&2 || true
    exit 1
fi

echo "ci/setup.sh: installing $LOCK into $VENV"
torch=$(sed -n 's/^torch==\([^ ]*\).*/\1/p' "$LOCK")
if ! pip install --quiet --dry-run --no-deps --no-index "torch==$torch" > /dev/null 2>&1; then
    export PIP_FIND_LINKS="${PIP_FIND_LINKS:+$PIP_FIND_LINKS }$TORCH_CPU_WHEELS"
fi
# The packages published as source only (the names in requirements/uv.toml) are built here without build
# isolation, by the build backends of the lock, which are installed first; everything else is a wheel.
source_only=$(sed -n 's/^name = "\(.*\)"$/\1/p' requirements/uv.toml | paste -sd, -)
# lock_entries LOCK NAME...: those entries of LOCK with their --hash lines (awk: launch.pins needs `packaging`,
# which a new virtualenv does not have yet)
lock_entries() {
    awk -v names=" ${*:2} " '/^[^ #]/ { split($1, a, "=="); keep = index(names, " " tolower(a[1]) " ") > 0 }
                             keep && !/^[[:space:]]*#/' "$1"
}
lock_entries "$LOCK" setuptools poetry-core > "$VENV/build-backends.lock"
pip install --quiet --require-hashes --no-deps --only-binary=:all: -r "$VENV/build-backends.lock"
rm -f "$VENV/build-backends.lock"
# --no-deps: the lock is the whole set, nothing is resolved or added (pip check proves it is complete)
pip install --quiet --require-hashes --no-deps --no-build-isolation --only-binary=:all: --no-binary="$source_only" -r "$LOCK"
pip install --quiet --no-deps --no-build-isolation -e .
pip check
if ! up_to_date; then
    echo "ci/setup.sh: $VENV still differs from $LOCK:" >&2
    "$py" -m launch.pins check "$LOCK" >&2 || true
    exit 1
fi
echo "ci/setup.sh: $VENV matches $LOCK"

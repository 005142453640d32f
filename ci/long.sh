#!/usr/bin/env bash
# The long tests (pytest marker `long`): failures and resumes per family, Ctrl-C, two machines on loopback, `trl sft`,
# the parity tests beyond each recipe's smoke run, the GPU check script end to end, a wheel bundle installed offline.
# CI cannot afford them on every commit (about 20 minutes on 2 cores), so CI checks their receipt instead:
# this script runs them on the current tree through the test command (ci/test.sh: the setup, ruff, pytest) and
# writes docs/long-tests-receipt.json (ci/long_receipt.py), whose inputs_sha256 covers every tracked file they can
# depend on; tests/test_long_receipt.py fails in CI when the receipt is for another tree or records a failure. Run it
# after a change to code, configs or tests, and commit the receipt with the change. Extra arguments go to pytest
# (e.g. `-k lora` to look at some; the receipt is then not written).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -gt 0 ]; then
    exec bash ci/test.sh --long -m long "$@"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
status=0
bash ci/test.sh --long -m long --junitxml "$work/long.xml" || status=$?
# The receipt records the outcome, a failure included (CI then fails on it): written whenever pytest ran its tests.
if [ -s "$work/long.xml" ]; then
    "${VENV:-.venv}/bin/python" ci/long_receipt.py write "$work/long.xml" "$(( $(date +%s) - start ))" || status=1
fi
exit "$status"

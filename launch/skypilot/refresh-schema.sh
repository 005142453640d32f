#!/usr/bin/env bash
# Writes launch/skypilot/task-schema.json: SkyPilot's own JSON schemas of a task and of its resources, as its task
# parser applies them (`sky.Task.from_yaml` -> sky.utils.schemas.get_task_schema / get_resources_schema), which
# tests/test_schedulers.py validates recipe.yaml against with SkyPilot's validator (Draft 7 + its enum keywords).
#
#   bash launch/skypilot/refresh-schema.sh [VERSION]        (default: the version the file holds now)
#
# Vendored, not installed: skypilot is not in requirements/cpu.lock because it pins click<8.2 and uvicorn<0.36,
# older than the versions cpu.lock shares with image.lock, and brings about 95 packages (317 MB). This script
# installs it into a scratch virtualenv (uv from .venv, the package index needed) and deletes it afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=launch/skypilot/task-schema.json
version=${1:-$(sed -n 's/^ *"skypilot_version": "\(.*\)",*$/\1/p' "$out" 2>/dev/null)}
[ -n "$version" ] || { echo "usage: bash $0 VERSION" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
.venv/bin/uv venv --quiet --python .venv/bin/python "$tmp/venv"
VIRTUAL_ENV="$tmp/venv" .venv/bin/uv pip install --quiet "skypilot==$version"
"$tmp/venv/bin/python" - "$version" > "$tmp/schema.json" <<'PY'
import json
import sys

from sky.utils import schemas

print(json.dumps({
    "$comment": "SkyPilot's task and resources schemas (sky.utils.schemas), written by "
                "launch/skypilot/refresh-schema.sh; do not edit",
    "skypilot_version": sys.argv[1],
    "task": schemas.get_task_schema(),
    "resources": schemas.get_resources_schema(),
}, indent=1, sort_keys=True))
PY
mv "$tmp/schema.json" "$out"
echo "wrote $out (skypilot $version)"

"""Shared helpers: running the launcher as a user would, and a cache of smoke runs shared across tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def launch_cli(*args, timeout=600, env=None) -> subprocess.CompletedProcess:
    """`python -m launch ARGS` from the repository root, output captured."""
    full_env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "launch", *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, env=full_env,
    )


class SmokeRuns:
    """Runs each (recipe, args) once per session; parity tests reuse the smoke tests' runs."""

    def __init__(self, root: Path):
        self.root = root
        self.done: dict[tuple, tuple[subprocess.CompletedProcess, dict]] = {}

    def run(self, recipe: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
        key = (recipe, *args)
        if key not in self.done:
            out = self.root / f"{recipe}-{len(self.done)}"
            proc = launch_cli(recipe, "--smoke", "--cpu", "--output-dir", out, *args)
            summary_path = out / "run_summary.json"
            summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
            self.done[key] = (proc, summary)
        return self.done[key]


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory) -> SmokeRuns:
    return SmokeRuns(tmp_path_factory.mktemp("smoke-runs"))


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-4000:]}\n--- stderr (tail)\n{proc.stderr[-4000:]}"

"""Where a run's metrics are tracked: trackio (local-first, no account), as the recipes configure it.

The launcher names the trackio project after the recipe and the run after the output folder, and picks the store:
smoke runs write into OUTPUT_DIR/trackio (self-contained and offline, so CI exercises it); other runs into trackio's
default store (HF_HOME/trackio: the cache volume in the container), where every run of every recipe shows in one
dashboard. `run_summary.json` records where the metrics are and how to open them.
"""

from __future__ import annotations

import os
from pathlib import Path

STORE_ENV = "TRACKIO_DIR"


def uses_trackio(training: dict) -> bool:
    report = training.get("report_to")
    reports = report if isinstance(report, list) else [report]
    return "trackio" in reports or "all" in reports


def store(setup) -> Path:
    if setup.options.smoke:
        return setup.output_dir / "trackio"
    if os.environ.get(STORE_ENV):
        return Path(os.environ[STORE_ENV])
    from huggingface_hub.constants import HF_HOME  # trackio's own default (trackio/utils.py)

    return Path(HF_HOME) / "trackio"


def launcher_args(setup_recipe_name: str, output_dir: Path, given: set[str]) -> dict:
    """--project and --run_name for the ranks, unless the user set them after `--`."""
    out = {}
    if "project" not in given:
        out["project"] = setup_recipe_name
    if "run_name" not in given:
        out["run_name"] = output_dir.name
    return out


def env(setup) -> dict:
    return {STORE_ENV: str(store(setup))} if uses_trackio(setup.training) else {}


def summary(setup) -> dict | None:
    if not uses_trackio(setup.training):
        return None
    where = store(setup)
    project = setup.training.get("project")
    return {
        "tracker": "trackio",
        "store": str(where),
        "project": project,
        "run": setup.training.get("run_name"),
        "dashboard": f"TRACKIO_DIR={where} trackio show --project {project}",
    }

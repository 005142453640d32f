"""Where a run's metrics are tracked: trackio (local-first, no account), as the recipes configure it.

The launcher names the trackio project after the recipe and the run after the output folder, and picks the store:
smoke runs write into OUTPUT_DIR/trackio (self-contained and offline, so CI exercises it); other runs into trackio's
default store (HF_HOME/trackio: the cache volume in the container), where every run of every recipe shows in one
dashboard. `run_summary.json` records where the metrics are and how to open them, and the launcher prints that
command once (`dashboard_line`).

Rank side: `quiet_dashboard_hint`, called by `launch.rank.monitor` in the training processes (imports nothing of the
launcher): trackio's own hint at `trackio.init` names no TRACKIO_DIR, so it would open another store.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

STORE_ENV = "TRACKIO_DIR"


def uses_trackio(training: dict) -> bool:
    report = training.get("report_to")
    reports = report if isinstance(report, list) else [report]
    return "trackio" in reports or "all" in reports


def store(setup) -> Path:
    if setup.options.smoke:
        return setup.folder.trackio
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


def dashboard_command(where: Path, project) -> str:
    """The shell command that opens this run's dashboard: trackio's `show` on the store the run wrote to."""
    return f"{STORE_ENV}={shlex.quote(str(where))} trackio show --project {shlex.quote(str(project))}"


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
        "dashboard": dashboard_command(where, project),
    }


def dashboard_line(setup) -> str | None:
    """What the launcher prints after a run that wrote trackio metrics (None: no trackio, or nothing written)."""
    info = summary(setup)
    if info is None or not Path(info["store"]).is_dir():
        return None
    return f"trackio dashboard: {info['dashboard']}"

"""pytest fixtures shared by the test files (helpers are plain modules in tests/helpers/)."""

from __future__ import annotations

import os

import pytest

from helpers.launcher import SmokeRuns


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory) -> SmokeRuns:
    """Each (recipe, arguments) run once per test session. Under pytest-xdist (`bash ci/test.sh` runs two workers)
    each worker's base folder is popen-gwN inside the session's: the runs live beside them, where every worker of the
    session finds them (SmokeRuns locks each run, so a worker that needs a run another is making waits for it)."""
    base = tmp_path_factory.getbasetemp()
    return SmokeRuns((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "smoke-runs")

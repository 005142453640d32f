"""pytest fixtures shared by the test files (helpers are plain modules in tests/helpers/)."""

from __future__ import annotations

import pytest

from helpers.launcher import SmokeRuns


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory) -> SmokeRuns:
    return SmokeRuns(tmp_path_factory.mktemp("smoke-runs"))

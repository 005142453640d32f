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


# ---- the long tier ----------------------------------------------------------------------------------------------
# Tests marked `long` start more training processes than CI's budget allows on every commit; `bash ci/long.sh` runs
# them (`--long -m long`) and writes docs/long-tests-receipt.json, which CI checks for this tree
# (tests/test_long_receipt.py). Without --long they are deselected, and the run's summary says how many.
def pytest_addoption(parser):
    parser.addoption("--long", action="store_true",
                     help="also run the tests marked long (bash ci/long.sh runs only those: --long -m long)")


# ---- scheduling over pytest-xdist workers ------------------------------------------------------------------------
# ci/test.sh runs `--dist load`: tests go to whichever worker is free, one by one, in this order: the smoke module's
# first (each a training run of its own, shared through SmokeRuns), then the rest as collected. Whole on one worker
# (`--dist loadfile`) the smoke module was the session's longest stretch (366 s of a 430 s session, the other worker
# idle for its last 58 s, measured on 2 cores); first, the worker that compiles DeepSpeed's cpu_adam for the offload
# runs starts early. A module's fixtures may so be set up on both workers. (`--dist loadgroup`, modules whole but the
# smoke tests spread, does not group with these pins: pytest-xdist 3.8 marks a group by rewriting `item._nodeid`,
# which pytest 9.2's `nodeid` no longer reads.)
FIRST = {"test_smoke_recipes.py"}


def pytest_collection_modifyitems(config, items):
    items[:] = [item for item in items if item.path.name in FIRST] + \
        [item for item in items if item.path.name not in FIRST]
    # the long tests of the whole suite, when this session collected it whole (before -k/-m deselect, which pytest's
    # own hooks do after this one): tests/test_long_receipt.py compares them with the receipt's without collecting again
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        config._long_tests = {item.nodeid for item in items if item.get_closest_marker("long")}
    if config.getoption("--long"):
        return
    long_items = [item for item in items if item.get_closest_marker("long")]
    if long_items:
        config.hook.pytest_deselected(items=long_items)
        items[:] = [item for item in items if not item.get_closest_marker("long")]
        config._long_deselected = len(long_items)


def pytest_terminal_summary(terminalreporter, config):
    if getattr(config, "_long_deselected", 0):
        terminalreporter.write_line(f"{config._long_deselected} long tests deselected: `bash ci/long.sh` runs them "
                                    "(or pytest --long); CI checks their receipt, docs/long-tests-receipt.json")

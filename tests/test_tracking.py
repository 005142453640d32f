"""launch/run/tracking.py: the dashboard command a run prints is the one that opens its own trackio store, and trackio's
own hint (which names no store) stays out of the ranks' output."""

from __future__ import annotations

import shlex

import pytest

from launch.run import tracking
from launch.rank import monitor
from launch.config.options import Options
from launch.run.resolve import resolve


def test_the_dashboard_command_names_the_runs_store(tmp_path):
    setup = resolve(Options(recipe="ddp", smoke=True, cpu=True, output_dir=str(tmp_path / "my run")),
                    progress=lambda *_: None)
    store = tmp_path / "my run" / "trackio"
    command = tracking.summary(setup)["dashboard"]
    assert command == f"TRACKIO_DIR={shlex.quote(str(store))} trackio show --project ddp"
    assert shlex.split(command)[0] == f"TRACKIO_DIR={store}"  # a folder with a space survives the shell
    assert tracking.dashboard_line(setup) is None  # nothing written there yet: nothing to open
    store.mkdir(parents=True)
    assert tracking.dashboard_line(setup) == f"trackio dashboard: {command}"


def test_trackios_own_hint_is_silenced_in_the_ranks(monkeypatch, capsys):
    utils = pytest.importorskip("trackio.utils")
    monkeypatch.setattr(utils, "print_dashboard_instructions", utils.print_dashboard_instructions)  # undone after
    utils.print_dashboard_instructions("zero3")
    assert 'trackio show --project "zero3"' in capsys.readouterr().out  # trackio's line, as trackio.init prints it
    monitor.quiet_dashboard_hint()
    utils.print_dashboard_instructions("zero3")
    assert capsys.readouterr().out == ""

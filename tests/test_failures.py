"""Clean failure: problems with the output folder are found before training; a dying rank or Ctrl-C stops the
whole job within a bounded time, names the cause, leaves no process behind, and keeps the last complete
checkpoint for --resume."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest

from launch import checkpoints, runner
from launch.recipes import LaunchError


def test_unwritable_output_dir_is_found_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(LaunchError, match="is not writable"):
        runner.check_output_dir(blocker / "out")


def test_full_disk_is_found_before_training(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(10 * 2**30, 10 * 2**30 - 5 * 2**20, 5 * 2**20))
    with pytest.raises(LaunchError, match=r"Only 5 MiB are free under .*at least 200 MiB"):
        runner.check_output_dir(tmp_path / "out")


def test_a_half_written_checkpoint_is_never_picked(tmp_path):
    for step, done in ((3, True), (6, True), (9, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_text("")
        if done:
            (folder / "trainer_state.json").write_text("{}")
    assert checkpoints.newest_complete(tmp_path) == tmp_path / "checkpoint-6"
    assert checkpoints.resolve_resume(tmp_path, "latest") == tmp_path / "checkpoint-6"
    with pytest.raises(LaunchError, match="not a complete checkpoint"):
        checkpoints.resolve_resume(tmp_path, str(tmp_path / "checkpoint-9"))
    with pytest.raises(LaunchError, match="no complete checkpoint"):
        checkpoints.resolve_resume(tmp_path / "empty", "latest")

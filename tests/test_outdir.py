"""The output folder is the run's, and only the run's (launch/results/outdir.py): a lock held by a live launcher
refuses a second one (a real second process here), a dead holder's lock is taken over, --overwrite deletes only what
earlier runs created, and the manifest records what a run created."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from helpers.launcher import REPO, explain, launch_in_process
from launch.results import outdir
from launch.errors import LaunchError
from launch.results.outdir import RunFolder

HOLD = """
import sys, time
from pathlib import Path
from launch.results import outdir
claim = outdir.claim(outdir.check(Path(sys.argv[1]), resume=False, overwrite=False), command="holder (a test)")
print("holding", flush=True)
time.sleep(120)
"""


def test_a_second_launcher_is_refused_with_the_holders_pid_and_start_time(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        before = sorted(p.name for p in out.iterdir())
        proc = launch_in_process("ddp", "--smoke", "--cpu", "--output-dir", out)
        assert proc.returncode == 2, explain(proc)
        assert f"Another launcher is using {out}: process {holder.pid} on" in proc.stderr
        assert "started 20" in proc.stderr and "holder (a test)" in proc.stderr
        assert sorted(p.name for p in out.iterdir()) == before  # nothing written by the refused launcher
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead: its lock is stale, taken over with a message
    claim = outdir.check(out, resume=False, overwrite=False)
    assert claim.stale_lock["pid"] == holder.pid
    assert any(f"taking over the lock of process {holder.pid}" in n for n in claim.notes)
    outdir.claim(claim, command="second")
    assert json.loads(RunFolder(out).lock(0).read_text())["command"] == "second"
    outdir.release(claim)
    assert not RunFolder(out).lock(0).exists()


def test_a_dead_runs_files_are_adopted_and_foreign_files_refused(tmp_path):
    out = tmp_path / "out"
    claim = outdir.claim(outdir.check(out, resume=False, overwrite=False), command="first")
    run = RunFolder(out)
    run.checkpoint(3).mkdir()  # written by the run, which then dies without releasing
    lock = json.loads(run.lock(0).read_text())
    run.lock(0).write_text(json.dumps({**lock, "pid": 2**22 + 7}))  # no such process
    claim = outdir.check(out, resume=True, overwrite=False)
    assert run.checkpoint(3).name in outdir._adoptable(out, [run.checkpoint(3).name], claim.stale_lock)
    (out / "notes.txt").write_text("mine")
    (out / "notes.txt").touch()
    import os

    os.utime(out / "notes.txt", (time.time() - 3600, time.time() - 3600))  # older than the dead run: not its file
    with pytest.raises(LaunchError, match="holds files no run of this launcher created: notes.txt"):
        outdir.check(out, resume=True, overwrite=False)


def test_overwrite_deletes_only_what_runs_created_and_says_so(tmp_path):
    out = tmp_path / "out"
    claim = outdir.claim(outdir.check(out, resume=False, overwrite=False), command="first")
    run = RunFolder(out)
    for folder in (run.checkpoint(4), run.final):
        folder.mkdir()
    run.trainer_state.write_text("{}")
    outdir.release(claim)
    manifest = json.loads(run.manifest.read_text())["entries"]
    # (the messages below name them as a user reads them)
    assert manifest == sorted(p.name for p in (run.checkpoint(4), run.final, run.trainer_state))
    with pytest.raises(LaunchError, match=r"earlier run's checkpoints or final weights \(checkpoint-4, final\)"):
        outdir.check(out, resume=False, overwrite=False)
    claim = outdir.check(out, resume=False, overwrite=True)
    assert claim.delete == ["checkpoint-4", "final", "trainer_state.json"]
    assert any("--overwrite: deleting the earlier run's checkpoint-4, final, trainer_state.json" in n
               for n in claim.notes)
    outdir.claim(claim, command="second")
    assert sorted(p.name for p in out.iterdir()) == [run.meta.name]
    outdir.release(claim)


def test_tilde_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert outdir.expand("~/x") == tmp_path / "x"


def test_a_claimed_folder_is_proven_writable_and_the_probe_leaves_nothing(tmp_path):
    out = RunFolder(tmp_path / "out")
    claim = outdir.claim(outdir.check(out.path, resume=False, overwrite=False), command="first")
    out.check_writable()
    assert sorted(p.name for p in out.meta.iterdir()) == sorted([out.manifest.name, out.lock(0).name])
    outdir.release(claim)
    blocked = RunFolder(tmp_path / "blocked")
    blocked.path.mkdir()
    blocked.meta.write_text("a file where the launcher's folder goes")  # refused even for root, unlike a chmod
    with pytest.raises(LaunchError, match=f"The output folder {blocked.path} is not writable"):
        blocked.check_writable()

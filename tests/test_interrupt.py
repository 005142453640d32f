"""Ctrl-C at any moment of the start-up (issue 27): no process of the job outlives the launcher, the output folder's
lock is released only once the job's processes are gone, and an early Ctrl-C is one line, not a traceback.

The launcher runs in-process on the ddp smoke recipe with its training job replaced by a fake one (a process that
starts a grandchild in its group and sleeps), so that each moment is hit exactly: just before `supervise.run`, inside
`Popen` right after the fork (the handler cannot know the job's group yet), right after `Popen` returns, and while
the job runs. One subprocess test sends SIGINT to `python -m launch` while it imports and resolves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from helpers.launcher import REPO, test_env
from launch import command, outdir, supervise
from launch.__main__ import main

# the fake job: a grandchild in the same process group, then a long sleep (a rank that would train for a minute)
FAKE_JOB = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(120)']); print('fake job started', flush=True); time.sleep(120)"]


def _hooked_popen(moment: str, spawned: list):
    """subprocess.Popen that sends this process SIGINT at `moment` of spawning the fake job (other commands pass)."""
    real = subprocess.Popen

    class Hooked(real):
        def __init__(self, args, *a, **k):
            ours = args == FAKE_JOB
            if ours and moment == "entering-popen":
                signal.raise_signal(signal.SIGINT)  # inside Popen, before the fork: the handler is installed
            super().__init__(args, *a, **k)
            if ours:
                if moment == "after-popen":
                    signal.raise_signal(signal.SIGINT)
                elif moment == "while-running":
                    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()

        def _execute_child(self, args, *a, **k):
            super()._execute_child(args, *a, **k)
            if args == FAKE_JOB:
                spawned.append(self.pid)  # the job's process group (it starts its own session)
            if args == FAKE_JOB and moment == "inside-popen":
                signal.raise_signal(signal.SIGINT)  # the child exists; Popen has not returned its pid yet

    return Hooked


@pytest.mark.parametrize("moment", ["before-run", "entering-popen", "inside-popen", "after-popen", "while-running"])
def test_ctrl_c_at_any_moment_leaves_no_process_and_releases_the_lock_last(moment, tmp_path, monkeypatch, capsys):
    spawned: list[int] = []
    released_with: list[list[int]] = []  # the job's processes still running when the lock was released
    monkeypatch.setattr(command, "build_command", lambda setup: list(FAKE_JOB))
    monkeypatch.setattr(subprocess, "Popen", _hooked_popen(moment, spawned))
    real_release, real_run = outdir.release, supervise.run

    def release(claim):
        released_with.append([p for pgid in spawned for p in supervise.group_alive(pgid)])
        return real_release(claim)

    def run(*a, **k):
        if moment == "before-run":
            # what Python's default SIGINT handler does in the main thread: raise KeyboardInterrupt where the code is.
            # Raised directly, not through raise_signal: a test process started as a background job of a
            # non-interactive shell (as CI runners and `cmd &` start it) inherits SIGINT ignored, and Python then
            # installs no KeyboardInterrupt handler, so a raised SIGINT does nothing (seen here: the fake job ran
            # its 120 s and the run exited 1). A user's `python -m launch` in a terminal has the default handler.
            raise KeyboardInterrupt
        return real_run(*a, **k)

    monkeypatch.setattr(outdir, "release", release)
    monkeypatch.setattr(supervise, "run", run)
    previous = signal.getsignal(signal.SIGINT)
    rc = main(["ddp", "--smoke", "--cpu", "--output-dir", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc == 130, f"SIGINT handler before the launcher: {previous!r}\n{out[-2000:]}\n{err[-3000:]}"
    assert "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is previous  # the launcher's handler is gone again
    assert released_with == [[]], f"the lock was released while {released_with} still ran"
    assert [p for pgid in spawned for p in supervise.group_alive(pgid)] == []
    assert not outdir.RunFolder(tmp_path / "out").lock(0).exists()
    if moment == "before-run":
        assert spawned == [] and err.strip().endswith("[launch] interrupted (Ctrl-C)")
    elif spawned:  # stopped through the launcher's handler (a Ctrl-C entering Popen may also spawn nothing)
        assert len(spawned) == 1 and "SIGINT received: stopping all ranks" in err, err[-3000:]


def test_an_early_ctrl_c_is_one_line(tmp_path):
    """SIGINT while `python -m launch` imports and resolves (the first seconds): one line, status 130."""
    # SIGINT at its default in the child, as a terminal gives it: a test process started as a background job of a
    # non-interactive shell (CI, `cmd &`) ignores SIGINT, the child would inherit that, and Python would then install
    # no KeyboardInterrupt handler (the Ctrl-C would be lost and the test skipped as "nothing to interrupt")
    proc = subprocess.Popen([sys.executable, "-m", "launch", "ddp", "--smoke", "--cpu", "--dry-run"], cwd=REPO,
                            env=test_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(1.0)  # past the interpreter's own start-up, inside the launcher's imports and checks
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the dry run finished within 1 s: nothing to interrupt")
    assert proc.returncode == 130, err
    assert err.strip() == "[launch] interrupted (Ctrl-C)", err

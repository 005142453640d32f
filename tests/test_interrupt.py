"""Ctrl-C at any moment of the start-up: no process of the job outlives the launcher, the output folder's
lock is released only once the job's processes are gone, and an early Ctrl-C is one line, not a traceback.

The launcher runs in-process on the ddp smoke recipe with its training job replaced by a fake one (a process that
starts a grandchild in its group and sleeps), so that each moment is hit exactly: just before `supervise.run`, inside
`Popen` right after the fork (the handler cannot know the job's group yet), right after `Popen` returns, and while
the job runs. Before the claim, the program `python -m launch` ends at once on a Ctrl-C (launch.run.interrupt): its
subprocess tests send SIGINT at named points of the start-up (imports, resolve, rules) through the test harness.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from helpers.launcher import HARNESS, REPO, test_env
from launch.results import outdir
from launch.run import command, interrupt, supervise
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


# Named points of `python -m launch ddp --smoke --cpu --dry-run`'s start-up, in order, where the harness
# (tests/harness/sitecustomize.py) makes the process send itself SIGINT: inside numpy's own import, under Accelerate's
# and torch's (numpy.lib starts while numpy/__init__ is half done: a KeyboardInterrupt there once left numpy
# half-initialised and the launcher ended with a RecursionError traceback from Accelerate's next `np.dtypes`), inside
# transformers' import of its trainer utilities (under TRL's parser classes, under the recipe's make_parser), at
# resolve, and at the output folder's check (after the rules and the memory plan: the last step before a run would
# claim the folder). About 6 s of subprocesses in all (measured at load average 0.7 on 2 cores).
START_UP = ["import:numpy.lib", "import:transformers.trainer_utils", "call:launch.run.resolve.resolve",
            "call:launch.results.outdir.check"]


@pytest.mark.parametrize("point", START_UP)
def test_an_early_ctrl_c_is_one_line(point):
    """SIGINT anywhere before the output folder is claimed: one line on stderr, status 130, no traceback."""
    env = test_env({"RECIPES_TEST_SIGINT_AT": point,
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(HARNESS), os.environ.get("PYTHONPATH")]))})
    # SIGINT at its default in the child, as a terminal gives it: a test process started as a background job of a
    # non-interactive shell (CI, `cmd &`) ignores SIGINT, the child would inherit that, and Python would then install
    # no KeyboardInterrupt handler (nor would the launcher install its own: the Ctrl-C would be lost)
    proc = subprocess.run([sys.executable, "-m", "launch", "ddp", "--smoke", "--cpu", "--dry-run"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # status 0 would mean the point was never reached (the dry run ran to its end)
    assert proc.returncode == interrupt.STATUS, f"{point}: status {proc.returncode}\n{proc.stderr[-3000:]}"
    assert proc.stderr.strip() == interrupt.LINE, proc.stderr[-3000:]


@pytest.mark.parametrize("argv, hands_over", [
    (["list"], False),  # reads only: a Ctrl-C ends it at once to its end
    (["compare", "--out", "x.txt", "a", "b"], True),  # writes from its start (refused here, before it writes)
])
def test_commands_that_write_hand_ctrl_c_back_to_python(argv, hands_over, capsys):
    """The program's exit-at-once handler (launch.run.interrupt) stays for a command that only reads and is replaced by
    Python's own (KeyboardInterrupt, so that cleanup runs) before a command that writes from its start."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (see above)
    try:
        interrupt.exit_at_once()
        assert signal.getsignal(signal.SIGINT) is interrupt._exit_now
        main(argv)
        expected = signal.default_int_handler if hands_over else interrupt._exit_now
        assert signal.getsignal(signal.SIGINT) is expected
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_run_hands_ctrl_c_back_to_python_before_it_claims_its_output_folder(tmp_path, monkeypatch, capsys):
    """From the claim on, a Ctrl-C is Python's KeyboardInterrupt (the moments above: the lock is released last);
    until then the program's handler ends it at once. The claim here is interrupted as it starts."""
    seen = []

    def claim(*a, **k):
        seen.append(signal.getsignal(signal.SIGINT))
        raise KeyboardInterrupt

    monkeypatch.setattr(outdir, "claim", claim)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupt.exit_at_once()
        rc = main(["ddp", "--smoke", "--cpu", "--output-dir", str(tmp_path / "out")])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.default_int_handler] and rc == interrupt.STATUS
    assert capsys.readouterr().err.strip().endswith(interrupt.LINE)

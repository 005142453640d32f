"""Ctrl-C at any moment of the start-up: no process of the job outlives the launcher, the output folder's
lock is released only once the job's processes are gone, and an early Ctrl-C is one line, not a traceback.

The launcher runs in-process on the ddp smoke recipe with its training job replaced by a fake one (a process that
starts a grandchild in its group and sleeps), so that each moment is hit exactly: just before `supervise.run`, inside
`Popen` right after the fork (the handler cannot know the job's group yet), right after `Popen` returns, and while
the job runs. Before the claim, the program `python -m launch` ends at once on a Ctrl-C (launch.run.interrupt): its
subprocess tests send SIGINT at named points of the start-up (imports, resolve, rules) through the test harness.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from helpers.launcher import HARNESS, REPO, leftover_processes, test_env
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


@pytest.mark.long
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


# ---- Ctrl-C while the ranks train: a stop, not a failure ------------------------------------------------------------
# `python -m launch ddp --smoke --cpu` (about 20 s to its first logged step on 2 cores), stopped by SIGINT once a
# training step is logged, as a terminal's Ctrl-C reaches the launcher (the job runs in a session of its own, so only
# the launcher gets it and stops the ranks itself).


def _start_smoke_run(out, env: dict | None = None) -> subprocess.Popen:
    # SIGINT at its default in the child, as a terminal gives it (see test_an_early_ctrl_c_is_one_line)
    return subprocess.Popen([sys.executable, "-m", "launch", "ddp", "--smoke", "--cpu", "--save-steps", "1",
                             "--output-dir", str(out)], cwd=REPO, env=test_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _read_until(proc: subprocess.Popen, wanted: str, count: int = 1, timeout: float = 300) -> str:
    """The launcher's output up to the `count`-th line holding `wanted` (stdout and stderr together)."""
    import time

    seen, found, deadline = "", 0, time.monotonic() + timeout
    while found < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
        found += wanted in line
    assert found == count, f"no {wanted!r} (x{count}) in the launcher's output:\n{seen[-3000:]}"
    return seen


STOP_LINE = re.compile(r"^\[launch\] stopped \(Ctrl-C\) after step (\d+): (.*) \(the full log: (.*)\)$", re.M)


@pytest.mark.long
def test_ctrl_c_while_training_is_a_stop_with_one_line_and_status_130(tmp_path):
    """A Ctrl-C while the ranks train: status 130 (the process's and run_summary.json's), which says stopped; one line
    naming the last complete checkpoint; no traceback of torchrun's (the SIGTERM its group was sent), which stays in
    the run's log; nothing left running."""
    out = tmp_path / "out"
    proc = _start_smoke_run(out)
    # the second logged step: checkpoint-1 (--save-steps 1, saved before step 2) is complete by then
    seen = _read_until(proc, "{'loss'", count=2)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    text = seen + rest
    assert proc.returncode == interrupt.STATUS, text[-3000:]
    assert "Traceback" not in text and "SignalException" not in text, rest[-3000:]
    assert "SIGINT received: stopping all ranks" in rest
    line = STOP_LINE.search(rest)
    assert line, rest[-3000:]
    folder = outdir.RunFolder(out)
    assert re.fullmatch(rf"last complete checkpoint: {re.escape(str(out))}/checkpoint-(\d+); continue with the same "
                        r"command plus --resume", line.group(2)), line.group(0)
    assert line.group(3) == str(folder.log)
    assert "failure" not in rest and "training stopped by" not in rest  # a stop is not a failure
    summary = json.loads(folder.summary.read_text())
    assert summary["exit_status"] == interrupt.STATUS and summary["outcome"] == "stopped"
    assert summary["stopped_by"] == "SIGINT"
    assert summary["verdict"] == {"passed": None,
                                  "reason": f"stopped (Ctrl-C) after step {line.group(1)}: not judged"}
    assert "SignalException" in folder.log.read_text()  # torchrun's traceback: in the log, not on the console
    assert leftover_processes(str(out)) == []
    assert not folder.lock(0).exists()


@pytest.mark.long
def test_a_second_ctrl_c_while_the_ranks_stop_kills_them_and_still_exits_130(tmp_path):
    """A second Ctrl-C during the bounded shutdown kills the ranks at once (no 30 s wait) and does not end the
    launcher by the signal; a third, once the job has ended (sent by the test harness when the launcher looks for the
    last checkpoint, as it writes the summary), is one line: status 130, the summary written, nothing left."""
    out = tmp_path / "out"
    harness = {"RECIPES_TEST_SIGINT_AT": "call:launch.run.checkpoints.newest_complete",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(HARNESS), os.environ.get("PYTHONPATH")]))}
    proc = _start_smoke_run(out, harness)
    seen = _read_until(proc, "{'loss'")
    proc.send_signal(signal.SIGINT)
    seen += _read_until(proc, "stopping all ranks")
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    text = seen + rest
    assert proc.returncode == interrupt.STATUS, text[-3000:]  # not -2 (ended by the signal)
    assert "SIGINT received while stopping: killing all ranks now" in rest, rest[-3000:]
    assert "SIGINT received: the job has already ended; writing its summary" in rest, rest[-3000:]
    assert STOP_LINE.search(rest), rest[-3000:]
    assert "Traceback" not in text and "SignalException" not in text and interrupt.LINE not in text, rest[-3000:]
    summary = json.loads(outdir.RunFolder(out).summary.read_text())
    assert summary["exit_status"] == interrupt.STATUS and summary["outcome"] == "stopped"
    assert leftover_processes(str(out)) == []
    assert not outdir.RunFolder(out).lock(0).exists()

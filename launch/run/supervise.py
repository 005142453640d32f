"""Starting `accelerate launch`, streaming its output, forwarding signals, and a bounded shutdown.

The job runs in its own process group so that every rank can be stopped together: on Ctrl-C or SIGTERM the
launcher sends SIGTERM to the whole group, waits GRACE_SECONDS, then SIGKILLs what is left; a second Ctrl-C (or
SIGTERM) during that wait SIGKILLs it at once. torchrun starts each rank in a session (and process group) of its own,
so a SIGKILL reaches, besides the group, every process that carries the job's token in its environment (`JOB_ENV`):
the ranks, and what they started, even once torchrun is dead and they are orphans.

Everything the job prints is also written to OUTPUT_DIR/launch.log, so nothing is lost when a run fails; after a stop
the user asked for (Ctrl-C, SIGTERM) it goes to the log only, not to the console: what the job prints while it stops
is torchrun's own traceback of the SIGTERM it was sent, not news.

A rank that dies ends the job through torchrun. A rank that stops making progress without dying (a deadlock, a
stuck collective, a hung data loader) would keep the others waiting in their next collective until its timeout
(30 minutes by default): the `Watchdog` reads the ranks' heartbeats (`launch.rank.monitor`) and stops the job when no
rank has made progress for the hang timeout, naming the rank(s) that fell behind.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from launch.rank.monitor import PHASES, read_heartbeats

GRACE_SECONDS = 30
POLL_SECONDS = 0.5


class Watchdog:
    """Decides, from the ranks' heartbeats, that the job hangs: no heartbeat anywhere for `timeout` seconds, where
    timeout = max(floor, FACTOR x the longest pause between two heartbeats seen so far), so that a recipe whose
    steps take minutes gets minutes. Before the first heartbeat (model loading, tokenization) it does not judge."""

    FACTOR = 5

    def __init__(self, folder: Path, ranks: list[int], floor: float):
        self.folder, self.ranks, self.floor = folder, list(ranks), floor  # ranks: this machine's global ranks
        self.last_seen: float | None = None
        self.longest_gap = 0.0

    @property
    def timeout(self) -> float:
        return max(self.floor, self.FACTOR * self.longest_gap)

    def check(self, now: float | None = None) -> str | None:
        now = time.time() if now is None else now
        beats = read_heartbeats(self.folder)
        if not beats:
            return None
        newest = max(b["time"] for b in beats.values())
        if self.last_seen is not None and newest > self.last_seen:
            self.longest_gap = max(self.longest_gap, newest - self.last_seen)
        self.last_seen = newest
        if all(b["event"] == "train_end" for b in beats.values()) and set(beats) >= set(self.ranks):
            return None
        if now - newest <= self.timeout:
            return None
        progress = {r: (b["step"], PHASES.get(b["event"], 0)) for r, b in beats.items()}
        missing = sorted(set(self.ranks) - set(beats))
        if missing:
            behind, where = missing, "before training started"
        else:
            low = min(progress.values())
            behind = sorted(r for r, p in progress.items() if p == low)
            b = beats[behind[0]]
            where = {"train_begin": "before its first step", "step_begin": f"in step {b['step']}",
                     "step_end": f"after step {b['step']}"}.get(b["event"], f"at {b['event']} {b['step']}")
        others = "" if len(behind) == len(self.ranks) else (
            f"; the other ranks got further and wait for {'it' if len(behind) == 1 else 'them'}")
        ranks = ", ".join(map(str, behind))
        return (f"rank{'s' if len(behind) > 1 else ''} {ranks} stopped making progress {where} (no heartbeat from "
                f"any rank for {now - newest:.0f} s, hang timeout {self.timeout:.0f} s{others})")


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


JOB_ENV = "LAUNCH_JOB"  # set in the job's environment to a token of this launcher's run: inherited by every rank


def job_processes(token: str) -> list[int]:
    """The running processes (zombies excluded) whose environment holds JOB_ENV=token: every process of the job,
    also those in sessions of their own (torchrun starts each rank in one) or orphaned by their parent's death. Empty
    where /proc is not readable."""
    needle = f"{JOB_ENV}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def _kill_job(pgid: int, token: str, sig: int) -> None:
    """`sig` to the job's process group and to every other process of the job (its ranks)."""
    _kill_group(pgid, sig)
    for pid in job_processes(token):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


USER_STOPS = ("SIGINT", "SIGTERM")  # what `run` returns as `stopped_by` for a stop the user asked for


def user_stop(stopped_by: str | None) -> bool:
    """Whether the job was stopped because the user asked (Ctrl-C: "SIGINT", or SIGTERM), not by a hang."""
    return stopped_by in USER_STOPS


def run(cmd: list[str], log_path: Path, env: dict | None = None, echo=True,
        watchdog: Watchdog | None = None, finishing=None) -> tuple[int, str | None]:
    """Run cmd to completion. Returns (exit status, what stopped it: a signal name, "hang: <why>", or None).

    No child outlives this call, whatever the moment of a Ctrl-C or SIGTERM: the handler that forwards them is
    installed before the job is spawned (a signal during the spawn is recorded, and the job stopped as soon as its
    process group is known), and on the way out the group is killed and waited for before the handlers are put
    back, so the caller (which then releases the output folder's lock) runs only once the ranks are gone.
    `finishing` (a `launch.run.interrupt.Finishing`): the handlers are handed to it instead of put back, with no
    moment between, so that a Ctrl-C after the job has ended cannot interrupt what the caller writes next."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stopped_by: list[str] = []
    group: list[int] = []  # the job's process group, once spawned
    token = f"{os.getpid()}-{time.time_ns()}"
    env = {**(os.environ if env is None else env), JOB_ENV: token}

    def stop(why: str, shown: str) -> None:
        if not stopped_by:
            stopped_by.append(why)  # a signal's name ("SIGINT") or "hang: <why>"
            again = "; Ctrl-C again kills them at once" if why in USER_STOPS else ""
            sys.stderr.write(f"\n[launch] {shown}: stopping all ranks (SIGKILL in {GRACE_SECONDS}s{again})\n")
        if group:
            _kill_group(group[0], signal.SIGTERM)

    def forward(signum, _frame):
        name = signal.Signals(signum).name
        if not stopped_by:
            stop(name, f"{name} received")
            return
        # a Ctrl-C (or SIGTERM) while the ranks stop: the user will not wait for the grace period
        if len(stopped_by) == 1:
            stopped_by.append(name)
            sys.stderr.write(f"[launch] {name} received while stopping: killing all ranks now (SIGKILL)\n")
        if group:
            _kill_job(group[0], token, signal.SIGKILL)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    proc = None
    try:
        if stopped_by:  # the signal came before the spawn: start nothing
            return 128 + signal.Signals[stopped_by[0]], stopped_by[0]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True
        )
        group.append(proc.pid)
        if stopped_by:  # the signal came while spawning: the handler could not know the group yet
            _kill_group(proc.pid, signal.SIGTERM)
        rc = _supervise(proc, log_path, echo, watchdog, stopped_by, stop,
                        kill=lambda: _kill_job(proc.pid, token, signal.SIGKILL))
    finally:
        if proc is not None:
            # No rank outlives the job: whatever is left of it goes, and is waited for.
            _kill_job(proc.pid, token, signal.SIGKILL)
            if proc.stdout is not None:
                proc.stdout.close()
            proc.wait()
            _wait_job_gone(proc.pid, token)
        if finishing is not None:
            finishing.start(previous)
        else:
            for s, handler in previous.items():
                signal.signal(s, handler)
    return rc, (stopped_by[0] if stopped_by else None)


def _supervise(proc, log_path: Path, echo: bool, watchdog: Watchdog | None, stopped_by: list[str], stop,
               kill) -> int:
    """Stream the job's output into the log (and the console) until it ends; stop it on a hang; SIGKILL what is
    left GRACE_SECONDS after a stop (`kill`)."""
    deadline = None
    newline = True  # whether the console's last echoed byte ended a line
    with open(log_path, "ab") as log:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            if watchdog is not None and not stopped_by and (hang := watchdog.check()):
                stop(f"hang: {hang}", hang)
            if stopped_by and deadline is None:
                deadline = time.monotonic() + GRACE_SECONDS
            if deadline is not None and time.monotonic() > deadline:
                kill()
            for _key, _ in sel.select(timeout=POLL_SECONDS):
                chunk = os.read(proc.stdout.fileno(), 65536)
                if chunk:
                    log.write(chunk)
                    log.flush()
                    if echo and not (stopped_by and user_stop(stopped_by[0])):
                        sys.stdout.buffer.write(chunk)
                        sys.stdout.flush()
                        newline = chunk.endswith(b"\n")
                    elif echo and not newline:  # the launcher's next line starts on a line of its own
                        sys.stdout.buffer.write(b"\n")
                        sys.stdout.flush()
                        newline = True
                else:
                    sel.unregister(proc.stdout)
            if not sel.get_map() or proc.poll() is not None and not _readable(proc):
                break
        return proc.wait()


GONE_WAIT_S = 10.0  # how long the launcher waits for SIGKILLed processes to leave (the kernel frees them in ms)


def group_alive(pgid: int) -> list[int]:
    """The processes of group `pgid` that still run (zombies, already dead, excluded)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    alive = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):  # state, ppid, pgrp
            alive.append(int(entry.name))
    return alive


def _wait_job_gone(pgid: int, token: str) -> None:
    deadline = time.monotonic() + GONE_WAIT_S
    while (group_alive(pgid) or job_processes(token)) and time.monotonic() < deadline:
        _kill_job(pgid, token, signal.SIGKILL)
        time.sleep(0.05)


def _readable(proc) -> bool:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    return bool(sel.select(timeout=0))


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)[^\n]*",
                         re.S)
_EXCEPTION = re.compile(r"^(?:\[rank(\d+)\]: )?([A-Za-z_.]*(?:Error|Exception|Interrupt)): (.*)$", re.M)


def failure_summary(log_path: Path, since: int = 0) -> str | None:
    """Which rank failed first and why, from torchrun's failure report and the ranks' tracebacks written after
    byte `since` of the log (the log collects every run in the output folder)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    root = _ROOT_CAUSE.search(text)
    errors = [m for m in _EXCEPTION.finditer(text) if "ChildFailedError" not in m.group(2)]
    cause = f"{errors[0].group(2)}: {errors[0].group(3).strip()}" if errors else None
    if root:
        rank, code = root.group(1), int(root.group(2))
        how = (f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
               else f"exit code {code}")
        return f"first failure: rank {rank} ({how})" + (f": {cause}" if cause else "")
    return f"failure: {cause}" if cause else None

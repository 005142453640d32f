"""Starting `accelerate launch`, streaming its output, forwarding signals, and a bounded shutdown.

The job runs in its own process group so that every rank can be stopped together: on Ctrl-C or SIGTERM the
launcher sends SIGTERM to the whole group, waits GRACE_SECONDS, then SIGKILLs what is left. Everything the job
prints is also written to OUTPUT_DIR/launch.log, so nothing is lost when a run fails.
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

GRACE_SECONDS = 30


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run(cmd: list[str], log_path: Path, env: dict | None = None, echo=True) -> tuple[int, str | None]:
    """Run cmd to completion. Returns (exit status, the signal name that stopped it or None)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stopped_by: list[str] = []
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
    )
    pgid = proc.pid

    def forward(signum, _frame):
        if not stopped_by:
            stopped_by.append(signal.Signals(signum).name)
            sys.stderr.write(f"\n[launch] {stopped_by[0]} received: stopping all ranks (SIGKILL in {GRACE_SECONDS}s)\n")
        _kill_group(pgid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = None
    try:
        with open(log_path, "ab") as log:
            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                if stopped_by and deadline is None:
                    deadline = time.monotonic() + GRACE_SECONDS
                if deadline is not None and time.monotonic() > deadline:
                    _kill_group(pgid, signal.SIGKILL)
                for _key, _ in sel.select(timeout=0.5):
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    if chunk:
                        log.write(chunk)
                        log.flush()
                        if echo:
                            sys.stdout.buffer.write(chunk)
                            sys.stdout.flush()
                    else:
                        sel.unregister(proc.stdout)
                if not sel.get_map() or proc.poll() is not None and not _readable(proc):
                    break
            rc = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        # No rank outlives the job: whatever is left in the group goes.
        _kill_group(pgid, signal.SIGKILL)
    return rc, (stopped_by[0] if stopped_by else None)


def _readable(proc) -> bool:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    return bool(sel.select(timeout=0))


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)[^\n]*", re.S)
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
        how = f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit code {code}"
        return f"first failure: rank {rank} ({how})" + (f": {cause}" if cause else "")
    return f"failure: {cause}" if cause else None

"""Ctrl-C before the launcher writes anything: one line and status 130, wherever it lands.

Until it writes (the imports, resolving the recipe, the rules, the plan: they only read), the launcher has nothing to
clean up, but a KeyboardInterrupt raised there lands inside whatever library code runs at that moment, which may
turn it into another error: raised inside numpy's import it left numpy half-initialised, and Accelerate's next
`np.dtypes` ended the launcher with a RecursionError traceback (status 1). So `python -m launch`, run as a program,
starts with a SIGINT handler that prints the line and ends the process at once (`exit_at_once`), raising nothing.
A command that writes hands over first (`writing()`: the run right before it claims its output folder, a command
that writes from its start before it starts): from then on Python's own handler raises KeyboardInterrupt again, so
that the `finally` blocks run (the output folder's lock is released once the job's processes are gone, a half-written
merge is removed), `launch.run.supervise` forwards a Ctrl-C to the ranks, and `launch.__main__` prints the same line.

An in-process caller (`launch.__main__.main` from a test) never gets the handler: its Ctrl-C stays a
KeyboardInterrupt. Nor does a launcher whose SIGINT is ignored (started in the background by a shell): it stays
ignored. What runs before the handler is installed (the interpreter's own start-up, a few milliseconds) is not covered.
One write happens before the hand-over: the smoke profile's first build of its tiny model and data
(`launch.config.smoke`,
once per machine) writes into a temporary folder of the cache that is renamed when complete; a Ctrl-C during that
build leaves the hidden temporary folder behind, which nothing reads.
"""

from __future__ import annotations

import os
import signal
import sys

LINE = "[launch] interrupted (Ctrl-C)"
STATUS = 130  # 128 + SIGINT, what a shell reports for a process a Ctrl-C ended


def _exit_now(signum, frame) -> None:
    for stream in (sys.stdout, sys.stderr):  # what was printed so far (os._exit flushes nothing)
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 (e.g. the signal came in the middle of a write to that stream)
            pass
    try:
        os.write(2, f"\n{LINE}\n".encode())  # after the terminal's ^C; unbuffered, so no reentrant write
    finally:
        os._exit(STATUS)


def exit_at_once() -> None:
    """From now until `writing()`, a Ctrl-C prints LINE and ends the process with STATUS. Only where Python's own
    handler is in place: not where SIGINT is ignored or someone else handles it."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _exit_now)


def writing() -> None:
    """The process is about to write: from now on a Ctrl-C raises KeyboardInterrupt again (Python's own handler),
    so that its cleanup runs. Does nothing where `exit_at_once` installed nothing (in-process callers)."""
    if signal.getsignal(signal.SIGINT) is _exit_now:
        signal.signal(signal.SIGINT, signal.default_int_handler)

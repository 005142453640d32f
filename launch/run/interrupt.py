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
Once the job has ended (`Finishing`), a further Ctrl-C raises nothing either: the run writes its summary, releases its
output folder and exits with the status it had (130 for a run stopped by a Ctrl-C).
One write happens before the hand-over: the smoke profile's first build of its tiny model and data
(`launch.config.smoke`,
once per machine) writes into a temporary folder of the cache that is renamed when complete; a Ctrl-C during that
build leaves the hidden temporary folder behind, which nothing reads.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

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


def _program() -> bool:
    """Whether this process is the program `python -m launch` (or `python path/to/launch`), not a caller that
    imported the launcher (a test, benchmarks/gpu/check.py's in-process use)."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return bool(main) and Path(main).resolve() == Path(__file__).resolve().parents[1] / "__main__.py"


class Finishing:
    """After the job has ended, until the run has written its summary and released its output folder: a Ctrl-C or
    SIGTERM is noted in one line and raises nothing, so that it can neither lose the summary nor (in the program, once
    `main` has returned) end the launcher by the signal. `launch.run.supervise.run` hands its handlers over with no
    moment between (`start`); the runner calls `end` once the output folder is released. In the program the noting
    handler then stays: all that is left is to exit with the run's status. An in-process caller gets its own handlers
    back. A signal noted here changes no status: the job had ended (stopped, failed or finished) before it came."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.previous: dict = {}

    def start(self, previous: dict) -> None:
        self.previous = dict(previous)
        for s in previous:
            signal.signal(s, self._note)

    def _note(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if not self.received:
            try:
                sys.stderr.write(f"\n[launch] {name} received: the job has already ended; writing its summary\n")
            except RuntimeError:  # the signal came in the middle of a write to stderr (a reentrant call)
                pass
        self.received.append(name)

    def end(self) -> None:
        if self.previous and not _program():
            for s, handler in self.previous.items():
                signal.signal(s, handler)
        self.previous = {}

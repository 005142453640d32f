"""`python -m launch`: the entry point; dispatch only.

    python -m launch RECIPE [run options] [-- training args]     (the run form: validate, plan, run, judge)
    python -m launch COMMAND [options]                            (each a module of `launch.commands`)
    python -m launch help [COMMAND]                               (= --help: the commands, one line each)
    python path/to/checkout/launch ...                            (the same, from any folder, nothing installed)
"""

from __future__ import annotations

import sys

if not __package__:  # run as `python path/to/launch`: Python put launch/ itself on the path, not the checkout
    from pathlib import Path

    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from launch.run import interrupt  # noqa: E402 (small: the standard library only)
from launch.rank import upstream_imports  # noqa: E402 (the standard library only)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with upstream_imports.kept_out():
            # imported here, inside the handler: importing the commands takes a second or more (torch, transformers),
            # and an in-process caller's Ctrl-C then is one line too (the program's: launch.run.interrupt, until it
            # writes)
            from launch.commands import COMMAND_NAMES, guarded, lookup

            if argv and argv[0] in COMMAND_NAMES:  # only that command's module is imported
                found = lookup(argv[0])
                command, rest, reads_first = found.main, argv[1:], found.reads_first
            else:  # the run form: its first word is a recipe; it hands over itself, before it claims the output folder
                from launch.commands import run

                command, rest, reads_first = guarded(run.main), argv, True
            if not reads_first:  # a command that writes from its start: a Ctrl-C raises, so that it cleans up
                interrupt.writing()
            return command(rest)
    except KeyboardInterrupt:  # Ctrl-C once the command writes (while the ranks run, supervise forwards it)
        print(f"\n{interrupt.LINE}", file=sys.stderr)
        return interrupt.STATUS


if __name__ == "__main__":
    # before main's imports, which take seconds: until the command writes, a Ctrl-C is one line
    interrupt.exit_at_once()
    status = main()
    # The interpreter's teardown without the garbage collector's passes over the ~500,000 objects torch, transformers
    # and TRL created (about 1 s of CPU per command): everything the launcher writes is closed by now
    # (launch/cpu/fast_exit.py does the same in the CPU ranks, and says what is skipped)
    import gc

    gc.freeze()
    sys.exit(status)

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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # imported here, inside the handler: importing the commands takes a second or more (torch, transformers),
        # and a Ctrl-C then is one line too, not a KeyboardInterrupt traceback
        from launch.commands import guarded, registered, run

        commands = registered()
        if argv and argv[0] in commands:
            command, rest = commands[argv[0]].main, argv[1:]
        else:  # the run form: its first word is a recipe
            command, rest = guarded(run.main), argv
        return command(rest)
    except KeyboardInterrupt:  # Ctrl-C before or after the ranks ran (while they run, supervise forwards it)
        print("\n[launch] interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

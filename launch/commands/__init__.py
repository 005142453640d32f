"""The subcommands of `python -m launch`, one module each. A module registers its command with `@command(NAME, HELP)`
on its `main(argv) -> int`; `launch.__main__` dispatches from `registered()`, which imports every module of this
package, so a new command is one new module (TRL's `trl/cli` registers its commands the same way).

Every command has one error convention, applied by `command` itself (so also when a test calls a module's `main`):
a problem is a `LaunchError` (usage errors too, through `launch.config.options.Parser`), printed as `error: PARAGRAPH`
on stderr, exit status 2.

A Ctrl-C in a command that only reads ends it at once with one line (`launch.run.interrupt`); a command that writes says
so: `@command(NAME, HELP)` gets Python's KeyboardInterrupt (and so its own cleanup) from its start, `@command(NAME,
HELP, reads_first=True)` only once it calls `launch.run.interrupt.writing()` (if it ever writes).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
from dataclasses import dataclass
from typing import Callable

from launch.errors import LaunchError
from launch.recipe.discovery import COMMAND_NAMES, command_sources


@dataclass(frozen=True)
class Command:
    name: str  # `python -m launch NAME ...`
    help: str  # one line, for `python -m launch --help`
    main: Callable[[list[str]], int]  # argv after NAME -> exit status
    reads_first: bool = False  # only reads until it calls launch.run.interrupt.writing(), if it writes at all


_REGISTRY: dict[str, Command] = {}


def guarded(main: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """`main` under the one error convention: a LaunchError is printed as one paragraph and exits 2; argparse's
    `--help` (which prints, then raises SystemExit(0)) returns 0, so that `help COMMAND` and in-process callers get
    a status instead of an exception."""

    @functools.wraps(main)
    def run(argv: list[str]) -> int:
        try:
            return main(argv)
        except LaunchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except SystemExit as e:
            if e.code not in (0, None):
                raise
            return 0

    return run


def command(name: str, help: str, reads_first: bool = False):
    """Register the decorated `main(argv) -> int` as `python -m launch NAME`, under the error convention.
    `reads_first`: the command writes nothing before it calls `launch.run.interrupt.writing()`, so that until then a
    Ctrl-C may end it at once (launch.run.interrupt); without it, a Ctrl-C raises KeyboardInterrupt from its start."""
    if name not in COMMAND_NAMES:  # a developer's mistake: found at import, by every test
        raise RuntimeError(f"command `{name}`: launch.recipe.discovery.command_names() did not find it in "
                           "launch/commands/; "
                           "register it as `@command(\"NAME\", HELP)` on a module-level function, with NAME a literal "
                           "string, so that no recipe folder can be named like it")

    def register(main):
        if name in _REGISTRY and _REGISTRY[name].main.__wrapped__ is not main:
            raise RuntimeError(f"two commands are named `{name}`")
        _REGISTRY[name] = Command(name, help, guarded(main), reads_first)
        return _REGISTRY[name].main

    return register


def registered() -> dict[str, Command]:
    """Every command, by name (sorted), after importing each module of this package."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return dict(sorted(_REGISTRY.items()))


def lookup(name: str) -> Command:
    """One command, importing only its own module (`python -m launch plan` need not import what `bench` or a run
    imports: seconds of torch, PEFT and DeepSpeed's modules)."""
    module, _help = command_sources()[name]
    importlib.import_module(f"{__name__}.{module}")
    return _REGISTRY[name]


def overview() -> str:
    """The commands, one line each (the epilog of `python -m launch --help`), read from their modules' source."""
    commands = {name: help_text for name, (_module, help_text) in command_sources().items()}
    width = max(map(len, commands)) + 2
    lines = [f"  {name:<{width}}{help_text}" for name, help_text in commands.items()]
    return "\n".join(["commands (python -m launch COMMAND ...; `python -m launch help COMMAND` shows its options):",
                      *lines, "", "Training arguments after `--` are passed to the recipe's train.py unchanged."])

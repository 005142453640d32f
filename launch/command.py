"""The `accelerate launch` command line for a resolved setup."""

from __future__ import annotations

import shlex
import sys

from launch import REPO_ROOT
from launch.profiles import as_argv


def build_command(setup) -> list[str]:
    """argv: `python -m accelerate.commands.launch` (= `accelerate launch`) with the recipe's Accelerate config
    and the overrides, then train.py with `--config config.yaml` and the training arguments, by source: the
    profile's, the recorded smoke invocation's, the user's after `--` (verbatim), the launcher's."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", _rel(setup.recipe.accelerate_config_path)]
    cmd += as_argv(setup.accelerate_overrides)
    return cmd + [_rel(setup.recipe.train_script), "--config", _rel(setup.recipe.config_path), *setup.training_argv]


def _rel(path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def display(cmd: list[str]) -> str:
    """The command as a user would type it."""
    shown = list(cmd)
    if shown[:3] == [sys.executable, "-m", "accelerate.commands.launch"]:
        shown = ["accelerate launch"] + shown[3:]
    return " \\\n    ".join(_groups(shown))


def _groups(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        tok = argv[i] if i == 0 else shlex.quote(argv[i])
        if argv[i].startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            tok += " " + shlex.quote(argv[i + 1])
            i += 1
        out.append(tok)
        i += 1
    return out

"""The `accelerate launch` command line for a resolved setup."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from launch import REPO_ROOT
from launch.config.profiles import as_argv


def build_command(setup) -> list[str]:
    """argv: `python -m accelerate.commands.launch` (= `accelerate launch`) with the recipe's Accelerate config
    and the overrides, then train.py with `--config config.yaml` and the training arguments, by source: the
    profile's, the recorded smoke invocation's, the user's after `--` (verbatim), the launcher's."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch",
           "--config_file", _rel(setup.recipe.accelerate_config_path)]
    cmd += as_argv(setup.accelerate_overrides)
    return cmd + [_rel(setup.recipe.train_script), "--config", _rel(setup.recipe.config_path), *setup.training_argv]


def _rel(path) -> str:
    """A path as the command names it: relative to the working directory the job starts in (the launcher's) when it
    lies below it, as a user types it from the repository root; else absolute, so that the launcher runs from any
    folder."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def code_env(env: dict) -> dict:
    """`env` with this checkout first on PYTHONPATH: the processes the launcher starts (the ranks, which import
    `launch.rank` and `launch.cpu`; a launcher started by `bench`) import the same `launch` as the launcher itself,
    whether or not the checkout is pip-installed, from any working directory, also when another checkout is installed
    (an editable install's finder comes after PYTHONPATH). Without it, a checkout that is not installed starts ranks
    that die on `import launch` (Accelerate's DeepSpeed launcher alone puts the working directory on the path)."""
    paths = [str(REPO_ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO_ROOT))]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def display(cmd: list[str]) -> str:
    """The command as a user would type it. From another folder than the checkout's root (its paths are then
    absolute) it starts with the PYTHONPATH the ranks get (`code_env`): train.py imports `launch.cpu`,
    `launch.rank.synthetic` and `launch.rank.monitor` from this checkout, which a plain `accelerate launch` started
    there would not find unless the checkout is installed (and would take from another checkout if that one is)."""
    shown = list(cmd)
    if shown[:3] == [sys.executable, "-m", "accelerate.commands.launch"]:
        shown = ["accelerate launch"] + shown[3:]
    lines = _groups(shown)
    if Path.cwd().resolve() != REPO_ROOT.resolve():
        lines[0] = f"PYTHONPATH={shlex.quote(str(REPO_ROOT))} {lines[0]}"
    return " \\\n    ".join(lines)


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

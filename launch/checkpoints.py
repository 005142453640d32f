"""Finding the checkpoint to resume from.

The Trainer writes a checkpoint folder piece by piece (weights, optimizer and scheduler, RNG states) and writes
trainer_state.json last, after every rank has saved its part; so a checkpoint-N folder without
trainer_state.json is one whose run died while saving it, and it is never picked.
"""

from __future__ import annotations

import re
from pathlib import Path

from launch.recipes import LaunchError

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def complete(folder: Path) -> bool:
    return (folder / "trainer_state.json").is_file()


def checkpoints(output_dir: Path) -> list[Path]:
    """checkpoint-N folders, oldest first."""
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found)]


def newest_complete(output_dir: Path) -> Path | None:
    for folder in reversed(checkpoints(output_dir)):
        if complete(folder):
            return folder
    return None


def resolve_resume(output_dir: Path, resume: str) -> Path:
    """`--resume` (newest complete checkpoint in the output folder) or `--resume PATH` (that one)."""
    if resume != "latest":
        path = Path(resume)
        if not path.is_dir() or not complete(path):
            raise LaunchError(f"--resume {resume}: not a complete checkpoint folder (it needs trainer_state.json).")
        return path
    found = newest_complete(output_dir)
    if found is None:
        raise LaunchError(
            f"--resume: no complete checkpoint under {output_dir}. Checkpoints are saved every --save-steps steps "
            "(or per the recipe's save_strategy/save_steps)."
        )
    return found

"""`python -m launch sync-scripts`: templates/train.py -> every marked recipe copy, and the generated README blocks."""

from __future__ import annotations

from launch import readme_blocks


def main(argv: list[str]) -> int:
    if argv:
        print(f"usage: python -m launch sync-scripts (no arguments; got {' '.join(argv)})")
        return 2
    return readme_blocks.sync()

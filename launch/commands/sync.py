"""`python -m launch sync-scripts`: templates/train.py -> every marked recipe copy, and the generated README blocks."""

from __future__ import annotations

from pathlib import Path

from launch.catalog import blocks as readme_blocks
from launch.recipe import copies
from launch.commands import command
from launch.errors import LaunchError
from launch.config.options import Parser


@command("sync-scripts", "copy templates/train.py into every marked recipe and regenerate the README blocks")
def main(argv: list[str]) -> int:
    parser = Parser(prog="python -m launch sync-scripts", description="templates/train.py -> every recipe's train.py "
                    "marked as a copy, with the optional sections its configs turn on, and the generated blocks of the "
                    "recipes' READMEs and of the repository's pages.")
    parser.add_argument("folders", nargs="*", metavar="RECIPE_FOLDER", help="only the train.py of these recipe "
                        "folders (e.g. one outside recipes/); no README block is touched")
    ns = parser.parse_args(argv)
    if not ns.folders:
        return readme_blocks.sync()
    for folder in map(Path, ns.folders):
        if not (folder / "train.py").is_file() or not (folder / "config.yaml").is_file():
            raise LaunchError(f"{folder} is not a recipe folder (it needs a train.py and a config.yaml).")
    for folder in map(Path, ns.folders):
        copies.sync_script(folder / "train.py")
    return 0

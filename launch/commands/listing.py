"""`python -m launch list`: the recipe table, read from the recipe folders themselves."""

from __future__ import annotations

from launch.catalog.table import recipe_rows
from launch.commands import command
from launch.errors import LaunchError
from launch.config.options import Parser
from launch.recipe.discovery import refusal, refused_dirs


@command("list", "the recipes: strategy, processes, purpose, CPU-verified, train.py copy/fork",
         reads_first=True)
def main(argv: list[str]) -> int:
    Parser(prog="python -m launch list", description="The recipe table, read from the recipe folders themselves. "
           "Takes no arguments.").parse_args(argv)
    rows = recipe_rows()
    print(f"{'recipe':<20} {'strategy':<52} {'procs':>5}  {'CPU':<4} {'train.py':<8} purpose")
    for r in rows:
        cpu = "yes" if r["cpu_verified"] else "no"
        print(f"{r['name']:<20} {r['strategy']:<52} {r['processes']:>5}  {cpu:<4} {r['train_script']:<8} "
              f"{r['purpose']}")
    print("\nCPU: the smoke profile runs on CPU (gloo) and meets its recorded expected metrics in CI.")
    print("train.py: `copy` = templates/train.py with the sections its config turns on, kept equal by sync-scripts; "
          "`fork` = changed on purpose (see its README).")
    if refused := refused_dirs():  # listed above without them; each named here, the listing then exits 2
        raise LaunchError(" ".join(refusal(folder) for folder in refused))
    return 0

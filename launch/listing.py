"""`python -m launch list` (the recipe table) and `sync-scripts` (copies of the canonical train script)."""

from __future__ import annotations

import shutil

from launch.plan import make_plan
from launch.recipes import RECIPES_DIR, find_recipe, recipe_names

CANONICAL_TRAIN = RECIPES_DIR / "ddp" / "train.py"


def recipe_rows() -> list[dict]:
    rows = []
    for name in recipe_names():
        recipe = find_recipe(name)
        plan = make_plan(recipe.accelerate, recipe.config)
        profiles = recipe.expected_metrics().get("profiles", {})
        rows.append({
            "name": name,
            "strategy": plan.strategy,
            "processes": plan.world_size,
            "purpose": recipe.description,
            "cpu_verified": "smoke-cpu" in profiles,
        })
    return rows


def print_list() -> int:
    rows = recipe_rows()
    print(f"{'recipe':<20} {'strategy':<52} {'procs':>5}  {'CPU':<4} purpose")
    for r in rows:
        cpu = "yes" if r["cpu_verified"] else "no"
        print(f"{r['name']:<20} {r['strategy']:<52} {r['processes']:>5}  {cpu:<4} {r['purpose']}")
    print("\nCPU: the smoke profile runs on CPU (gloo) and meets its recorded expected metrics in CI.")
    return 0


def train_script_copies() -> list:
    return [RECIPES_DIR / n / "train.py" for n in recipe_names() if n != "ddp"]


def sync_scripts() -> int:
    for path in train_script_copies():
        if path.read_bytes() != CANONICAL_TRAIN.read_bytes():
            shutil.copyfile(CANONICAL_TRAIN, path)
            print(f"updated {path}")
    return 0

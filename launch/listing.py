"""`python -m launch list`: the recipe table, read from the recipe folders themselves."""

from __future__ import annotations

from launch.copies import is_marked
from launch.plan import make_plan
from launch.recipes import find_recipe, recipe_names


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
            "train_script": "copy" if is_marked(recipe.train_script) else "fork",
        })
    return rows


def print_list() -> int:
    rows = recipe_rows()
    print(f"{'recipe':<20} {'strategy':<52} {'procs':>5}  {'CPU':<4} {'train.py':<8} purpose")
    for r in rows:
        cpu = "yes" if r["cpu_verified"] else "no"
        print(f"{r['name']:<20} {r['strategy']:<52} {r['processes']:>5}  {cpu:<4} {r['train_script']:<8} {r['purpose']}")
    print("\nCPU: the smoke profile runs on CPU (gloo) and meets its recorded expected metrics in CI.")
    print("train.py: `copy` = kept equal to templates/train.py (sync-scripts); `fork` = changed on purpose (see README).")
    return 0

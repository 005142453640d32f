"""`python -m launch list`: the recipe table, read from the recipe folders themselves."""

from __future__ import annotations

from launch.copies import is_marked
from launch.expected import read_expected
from launch.layout import Layout
from launch.recipes import find_recipe, recipe_names


def recipe_rows() -> list[dict]:
    rows = []
    for name in recipe_names():
        recipe = find_recipe(name)
        layout = Layout.from_configs(recipe.accelerate, recipe.config)
        profiles = read_expected(recipe.expected_metrics_path).get("profiles", {})
        rows.append({
            "name": name,
            "strategy": layout.strategy,
            "processes": layout.world_size,
            "purpose": recipe.description,
            "cpu_verified": "steps" in profiles.get("smoke-cpu", {}),
            "train_script": "copy" if is_marked(recipe.train_script) else "fork",
        })
    return rows


def main(argv: list[str]) -> int:
    rows = recipe_rows()
    print(f"{'recipe':<20} {'strategy':<52} {'procs':>5}  {'CPU':<4} {'train.py':<8} purpose")
    for r in rows:
        cpu = "yes" if r["cpu_verified"] else "no"
        print(f"{r['name']:<20} {r['strategy']:<52} {r['processes']:>5}  {cpu:<4} {r['train_script']:<8} {r['purpose']}")
    print("\nCPU: the smoke profile runs on CPU (gloo) and meets its recorded expected metrics in CI.")
    print("train.py: `copy` = kept equal to templates/train.py (sync-scripts); `fork` = changed on purpose (see README).")
    return 0

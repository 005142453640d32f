"""The recipe catalogue: one row of facts per recipe folder, read from the folder itself (its two configs, its
README's first sentence, its expected metrics, its train.py), for `python -m launch list` and README.md's recipe
table (a generated block, `launch.readme_blocks`)."""

from __future__ import annotations

from launch.copies import is_marked
from launch.results.expected import profile_entry
from launch.layout import Layout
from launch.recipes import find_recipe, recipe_names


def recipe_row(name: str) -> dict:
    recipe = find_recipe(name)
    layout = Layout.from_configs(recipe.accelerate, recipe.config)
    smoke_cpu = profile_entry(recipe, "smoke-cpu")
    return {
        "name": name,
        "strategy": layout.strategy,
        "processes": layout.world_size,
        "purpose": recipe.description,
        "model": str(recipe.config.get("model_name_or_path", "")),
        "dataset": str(recipe.config.get("dataset_name", "")),
        "max_length": recipe.config.get("max_length"),
        "cpu_verified": "steps" in smoke_cpu,
        "cpu_processes": smoke_cpu.get("invocation", {}).get("num_processes"),
        "train_script": "copy" if is_marked(recipe.train_script) else "fork",
    }


def recipe_rows(names: list[str] | None = None) -> list[dict]:
    """Every recipe folder's row (or those of `names`), in folder order."""
    return [recipe_row(name) for name in (recipe_names() if names is None else names)]

"""The recipe catalogue: one row of facts per recipe folder, read from the folder itself (its two configs, its
README's first sentence, its expected metrics, its train.py), for `python -m launch list` and README.md's recipe
table (a generated block, `launch.catalog.blocks`)."""

from __future__ import annotations

from launch.recipe.copies import is_marked
from launch.results.expected import profile_entry
from launch.config.layout import Layout
from launch.memory import RunShape
from launch.recipe.discovery import find_recipe, recipe_names
from launch.speed import fastest
from launch.config.training_args import checkpointing


def speed_settings(config: dict, accelerate: dict) -> str:
    """The speed settings of a recipe's GPU defaults, in a few words (`launch.speed.fastest.label`, short; "(FSDP)"
    where FSDP's own checkpointing is on): the settings `python -m launch plan RECIPE --fastest` chooses among."""
    settings = fastest.Settings.of_run(RunShape.from_configs(accelerate, config))
    return settings.label(by="FSDP" if checkpointing(config, accelerate).fsdp else None, short=True)


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
        "speed": speed_settings(recipe.config, recipe.accelerate),
        "cpu_verified": "steps" in smoke_cpu,
        "cpu_processes": smoke_cpu.get("invocation", {}).get("num_processes"),
        "train_script": "copy" if is_marked(recipe.train_script) else "fork",
    }


def recipe_rows(names: list[str] | None = None) -> list[dict]:
    """Every recipe folder's row (or those of `names`), in folder order."""
    return [recipe_row(name) for name in (recipe_names() if names is None else names)]

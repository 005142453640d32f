"""The recipe catalogue: one row of facts per recipe folder, read from the folder itself (its two configs, its
README's first sentence, its expected metrics, its train.py), for `python -m launch list` and README.md's recipe
table (a generated block, `launch.catalog.blocks`)."""

from __future__ import annotations

from launch.recipe.copies import is_marked
from launch.results.expected import profile_entry
from launch.config.layout import Layout
from launch.recipe.discovery import find_recipe, recipe_names
from launch.switches import is_on
from launch.config.profiles import checkpointer
from launch.config.training_args import checkpointing


def speed_settings(config: dict, accelerate: dict, layout: Layout) -> str:
    """The speed settings of a recipe's GPU defaults, in a few words: activation checkpointing (off, on, on with its
    checkpoints offloaded; by FSDP when the Accelerate config does it), Liger's kernels, micro-batch x accumulation.
    The settings `python -m launch plan RECIPE --fastest` chooses among (launch/speed/fastest.py)."""
    fsdp = accelerate.get("fsdp_config") or {}
    ckpt = checkpointing(config)
    if checkpointer(config, accelerate) == "FSDP" and is_on(fsdp.get("fsdp_activation_checkpointing", False)):
        mode = "on (FSDP)" + (" + offload" if is_on(fsdp.get("fsdp_activation_checkpointing_offload", False)) else "")
    elif ckpt.enabled:
        mode = "on" + (" + offload" if ckpt.offload else "")
    else:
        mode = "off"
    liger = "on" if is_on(config.get("use_liger_kernel", False)) else "off"
    return (f"checkpointing {mode}, Liger {liger}, {layout.per_device_train_batch_size} x "
            f"{layout.gradient_accumulation_steps}")


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
        "speed": speed_settings(recipe.config, recipe.accelerate, layout),
        "cpu_verified": "steps" in smoke_cpu,
        "cpu_processes": smoke_cpu.get("invocation", {}).get("num_processes"),
        "train_script": "copy" if is_marked(recipe.train_script) else "fork",
    }


def recipe_rows(names: list[str] | None = None) -> list[dict]:
    """Every recipe folder's row (or those of `names`), in folder order."""
    return [recipe_row(name) for name in (recipe_names() if names is None else names)]

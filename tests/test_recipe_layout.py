"""Every recipe folder is complete, its configs load in Accelerate and TRL unchanged, and the train script
copies do not drift from the canonical one."""

from __future__ import annotations

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig

from launch.listing import CANONICAL_TRAIN, recipe_rows, train_script_copies
from launch.recipes import RECIPE_FILES, RECIPES_DIR, find_recipe, recipe_names

RECIPES = recipe_names()
ACCELERATE_CONFIGS = sorted((RECIPES_DIR.parent / "accelerate_configs").glob("*.yaml"))


def test_recipes_exist():
    assert {"ddp", "zero1", "zero2", "zero3", "zero3-offload"} <= set(RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_folder_has_its_four_files(name):
    for f in RECIPE_FILES:
        assert (RECIPES_DIR / name / f).is_file(), f"recipes/{name}/{f} is missing"


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_config_loads_in_accelerate(path):
    ClusterConfig.from_yaml_file(str(path))  # raises on unknown keys


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_config_loads_in_trl(name):
    """The recipe's own parser (TRL's TrlParser) reads config.yaml as-is. bf16 is switched off only because
    transformers refuses bf16 on a machine without a GPU."""
    recipe = find_recipe(name)
    parser = recipe.load_train_module().make_parser()
    script_args, training_args, model_args, recipe_args = parser.parse_args_and_config(
        ["--config", str(recipe.config_path), "--use_cpu", "true", "--bf16", "false"]
    )
    assert model_args.model_name_or_path == recipe.config["model_name_or_path"]
    assert recipe_args.accelerate_config == recipe.config["accelerate_config"]
    assert recipe.accelerate_config_path.is_file()
    ClusterConfig.from_yaml_file(str(recipe.accelerate_config_path))


@pytest.mark.parametrize("path", train_script_copies(), ids=lambda p: p.parent.name)
def test_train_script_copies_match_the_canonical_one(path):
    assert path.read_bytes() == CANONICAL_TRAIN.read_bytes(), (
        f"{path} differs from {CANONICAL_TRAIN}: edit the canonical copy, then `python -m launch sync-scripts`"
    )


def test_list_shows_every_recipe_with_strategy_and_purpose():
    rows = {r["name"]: r for r in recipe_rows()}
    assert set(rows) == set(RECIPES)
    assert rows["zero3"]["strategy"] == "DeepSpeed ZeRO-3"
    assert rows["ddp"]["strategy"] == "DDP"
    for r in rows.values():
        assert r["purpose"], f"recipes/{r['name']}/README.md needs a first paragraph saying what it is for"


def test_yaml_configs_are_plain_yaml():
    for path in ACCELERATE_CONFIGS + [RECIPES_DIR / n / "config.yaml" for n in RECIPES]:
        assert isinstance(yaml.safe_load(path.read_text()), dict), path


@pytest.mark.parametrize("name", RECIPES)
def test_expected_metrics_are_as_the_record_command_writes_them(name):
    """expected_metrics.json changes only through `python -m launch record`: every profile carries the environment
    and invocation it was recorded with, and bounds derived from its own losses (a hand-edited loss list would
    no longer match its bounds)."""
    from launch.metrics import METRICS, TOLERANCE, bounds_for

    data = find_recipe(name).expected_metrics()
    assert data.get("tolerance") == TOLERANCE
    for profile, entry in data.get("profiles", {}).items():
        assert profile in ("smoke-cpu", "smoke-gpu"), profile
        env = entry["environment"]
        assert env["recorded_at"] and env["versions"]["torch"] and env["world_size"] >= 1
        assert set(entry["invocation"]) >= {"num_processes", "mesh", "training_args"}
        steps = entry["steps"]
        assert all(len(steps[m]) == len(steps["loss"]) > 0 for m in METRICS)
        assert entry["bounds"] == bounds_for(steps["loss"])

"""Every recipe folder is complete, its configs load in Accelerate and TRL unchanged, the train script copies do
not drift from templates/train.py (forks are allowed and left alone), and the README blocks generated from the code
are current."""

from __future__ import annotations

import shutil

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig

from helpers.launcher import explain, launch_in_process
from launch.expected import read_expected
from launch import copies, readme_blocks
from launch.commands.listing import recipe_rows
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


def test_train_script_copies_match_the_template_and_readme_blocks_are_current():
    problems = readme_blocks.check()
    assert problems == [], ("\n".join(problems) + "\nRun `python -m launch sync-scripts` (it rewrites the marked train.py "
                            "copies from templates/train.py and every generated README block from the code); to change "
                            "one recipe's train.py on purpose, delete its `# Copied from` line (a fork) and say why in "
                            "its README.")


def test_every_shipped_recipe_is_a_marked_copy():
    assert [c.path for c in copies.train_scripts(RECIPES_DIR) if not c.marked] == []


def test_drift_names_the_file_and_the_first_differing_line(tmp_path):
    folder = tmp_path / "recipes" / "mine"
    folder.mkdir(parents=True)
    text = copies.copy_text().splitlines(keepends=True)
    text[20] = "# an edit\n"
    (folder / "train.py").write_text("".join(text))
    [problem] = copies.check_copies(tmp_path / "recipes")
    assert problem.startswith(f"{folder / 'train.py'}:21: has '# an edit'")


def test_a_fork_runs_passes_the_layout_checks_and_sync_leaves_it_alone(tmp_path):
    """A copied recipe whose marker line is deleted and whose train.py is changed: runs (dry run: its own script
    and parser), passes the consistency check, and `sync-scripts` does not touch it."""
    recipes = tmp_path / "recipes"
    fork = recipes / "my-fork"
    shutil.copytree(RECIPES_DIR / "zero3", fork)
    script = fork / "train.py"
    lines = script.read_text().splitlines(keepends=True)[1:]  # the marker line deleted: a fork
    lines.insert(0, "# Fork: prints a greeting (README says why).\n")
    script.write_text("".join(lines).replace("def main(script_args", "GREETING = 'hello'\n\n\ndef main(script_args"))
    (fork / "README.md").write_text((fork / "README.md").read_text() + "\nForked train.py: it greets.\n")
    shutil.copytree(RECIPES_DIR / "ddp", recipes / "ddp")
    assert readme_blocks.check(recipes) == []  # a copied folder's generated blocks follow the folder they are in
    before = script.read_text()
    messages = []
    readme_blocks.sync(recipes, out=messages.append)  # leaves the fork alone
    assert script.read_text() == before and f"left alone (forked: no `{copies.MARKER_PREFIX}` line): {script}" in messages
    # a changed config makes the "fits on" block stale; the check's advice is the command that fixes it
    (fork / "config.yaml").write_text((fork / "config.yaml").read_text().replace("max_length: 2048", "max_length: 1024"))
    [stale] = readme_blocks.check(recipes)
    assert "fits-on" in stale and "run `python -m launch sync-scripts`" in stale
    readme_blocks.sync(recipes, out=messages.append)
    assert readme_blocks.check(recipes) == []
    proc = launch_in_process(fork, "--smoke", "--cpu", "--dry-run")
    assert proc.returncode == 0, explain(proc)
    assert f"{script}" in proc.stdout


def test_list_shows_every_recipe_with_strategy_and_purpose():
    rows = {r["name"]: r for r in recipe_rows()}
    assert set(rows) == set(RECIPES)
    assert rows["zero3"]["strategy"] == "DeepSpeed ZeRO-3"
    assert rows["ddp"]["strategy"] == "DDP"
    for r in rows.values():
        assert r["purpose"], f"recipes/{r['name']}/README.md needs a first paragraph saying what it is for"
        assert r["train_script"] == "copy"


def test_yaml_configs_are_plain_yaml():
    for path in ACCELERATE_CONFIGS + [RECIPES_DIR / n / "config.yaml" for n in RECIPES]:
        assert isinstance(yaml.safe_load(path.read_text()), dict), path


@pytest.mark.parametrize("name", RECIPES)
def test_expected_metrics_are_as_the_record_command_writes_them(name):
    """expected_metrics.json's per-step metrics change only through `python -m launch record`: every smoke profile
    carries the environment and invocation it was recorded with, and bounds derived from its own losses (a
    hand-edited loss list would no longer match its bounds). A GPU profile may hold only a first-loss band, which
    says where it comes from (launch.sentinel)."""
    from launch.expected import TOLERANCE, bounds_for
    from launch.sentinel import band_problems
    from launch.stepdiff import METRICS

    data = read_expected(find_recipe(name).expected_metrics_path)
    assert data.get("tolerance") == TOLERANCE
    for profile, entry in data.get("profiles", {}).items():
        if profile == "full-gpu":
            assert set(entry) == {"first_loss_band"} and band_problems(entry) == [], entry
            continue
        assert profile in ("smoke-cpu", "smoke-gpu"), profile
        env = entry["environment"]
        assert env["recorded_at"] and env["versions"]["torch"] and env["world_size"] >= 1
        assert set(entry["invocation"]) >= {"num_processes", "mesh", "training_args"}
        steps = entry["steps"]
        assert all(len(steps[m]) == len(steps["loss"]) > 0 for m in METRICS)
        assert entry["bounds"] == bounds_for(steps["loss"])

"""Every recipe folder is complete, its configs load in Accelerate and TRL unchanged, the train script copies do
not drift from templates/train.py and hold the template's optional sections their configs turn on (forks are allowed
and left alone), and the README blocks generated from the code are current."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig

from helpers.launcher import explain, launch_in_process, shows
from helpers.rule_checks import facts, make_recipe
from launch.results.expected import read_expected
from launch.catalog import blocks as readme_blocks
from launch.checks import rules
from launch.recipe import copies, sections, template as train_template
from launch.catalog.table import recipe_rows
from launch.config.options import Options
from launch.recipe.discovery import RECIPE_FILES, RECIPES_DIR, find_recipe, recipe_names
from launch.run.resolve import resolve

RECIPES = recipe_names()
ACCELERATE_CONFIGS = sorted((RECIPES_DIR.parent / "accelerate_configs").glob("*.yaml"))
# The recipes this repository ships, each kept a marked copy of templates/train.py. Any other folder under recipes/
# is yours: a copy, or a fork (its `# Copied from` line deleted), which these tests accept as they accept ours.
SHIPPED = ("alst-ulysses-4gpu", "alst-ulysses-8gpu", "ddp", "fsdp2", "fsdp2-70b", "lora", "qlora-fsdp",
           "ring-cp-2gpu", "ring-cp-4gpu", "ring-cp-8gpu", "zero1", "zero2", "zero3", "zero3-offload")


def test_recipes_exist():
    assert set(SHIPPED) <= set(RECIPES)


def folder_problems(folder: Path) -> list[str]:
    """What the layout tests require of any recipe folder, shipped, copied or forked: its four files, and its
    config.yaml read unchanged by its own train.py's parser (TRL's TrlParser), naming an Accelerate config that
    Accelerate loads. bf16 is switched off only because transformers refuses bf16 on a machine without a GPU."""
    missing = [f"{folder}/{f} is missing" for f in RECIPE_FILES if not (folder / f).is_file()]
    if missing:
        return missing
    recipe = find_recipe(str(folder))
    parser = recipe.load_train_module().make_parser()
    parsed = parser.parse_args_and_config(["--config", str(recipe.config_path), "--use_cpu", "true", "--bf16", "false"])
    values = {k: v for args in parsed for k, v in vars(args).items()}
    problems = [f"{folder}: `{key}` parsed as {values.get(key)!r}, config.yaml has {recipe.config[key]!r}"
                for key in ("model_name_or_path", "accelerate_config") if values.get(key) != recipe.config[key]]
    ClusterConfig.from_yaml_file(str(recipe.accelerate_config_path))  # raises on unknown keys
    return problems


def unmarked_shipped(recipes_dir: Path) -> list[Path]:
    return [c.path for c in copies.train_scripts(recipes_dir) if not c.marked and c.path.parent.name in SHIPPED]


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_folder_has_its_four_files(name):
    assert [p for p in folder_problems(RECIPES_DIR / name) if p.endswith("is missing")] == []


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_config_loads_in_accelerate(path):
    ClusterConfig.from_yaml_file(str(path))  # raises on unknown keys


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_config_loads_in_trl(name):
    """The recipe's own parser (TRL's TrlParser) reads config.yaml as-is."""
    assert folder_problems(RECIPES_DIR / name) == []


def test_the_parser_holds_trls_sft_classes_and_the_recipes_own():
    """The classes of TRL's trl/scripts/sft.py (a `datasets:` mixture is DatasetMixtureConfig's), then
    RecipeArguments; the launcher merges the training arguments with this same parser (launch.config.training_args)."""
    from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, SFTConfig
    from trl.scripts.sft import make_parser as trl_make_parser

    ours = find_recipe("zero3").load_train_module().make_parser().dataclass_types
    assert list(ours[:4]) == list(trl_make_parser().dataclass_types)
    assert list(ours[:4]) == [ScriptArguments, SFTConfig, ModelConfig, DatasetMixtureConfig]
    assert [t.__name__ for t in ours[4:]] == ["RecipeArguments"]


def test_train_script_copies_match_the_template_and_readme_blocks_are_current():
    problems = readme_blocks.check()
    assert problems == [], ("\n".join(problems) + "\nRun `python -m launch sync-scripts` (it rewrites the marked "
                            "train.py "
                            "copies from templates/train.py and every generated README block from the code); to change "
                            "one recipe's train.py on purpose, delete its `# Copied from` line (a fork) and say why in "
                            "its README.")


def test_every_shipped_recipe_is_a_marked_copy():
    assert unmarked_shipped(RECIPES_DIR) == []


def test_a_fork_beside_the_shipped_recipes_passes_the_layout_tests(tmp_path):
    """The README's way to fork, in a temporary copy of recipes/: `cp -r recipes/zero3 recipes/mine`, delete the
    `# Copied from` line, change the script. The layout tests' checks accept it beside the shipped recipes."""
    recipes = tmp_path / "recipes"
    shutil.copytree(RECIPES_DIR, recipes, ignore=shutil.ignore_patterns("__pycache__"))
    fork = recipes / "layout-test-fork"
    shutil.copytree(RECIPES_DIR / "zero3", fork)
    script = fork / "train.py"
    script.write_text("".join(script.read_text().splitlines(keepends=True)[1:]).replace(
        "def main(script_args", "GREETING = 'hello'\n\n\ndef main(script_args"))
    assert not copies.is_marked(script)
    assert unmarked_shipped(recipes) == []
    assert readme_blocks.check(recipes) == []
    assert folder_problems(fork) == []
    # the shipped recipes' own checks still bite in the same copy: a shipped recipe unmarked is named
    zero3 = recipes / "zero3" / "train.py"
    zero3.write_text("".join(zero3.read_text().splitlines(keepends=True)[1:]))
    assert unmarked_shipped(recipes) == [zero3]


def test_drift_names_the_file_and_the_first_differing_line(tmp_path):
    folder = tmp_path / "recipes" / "mine"
    shutil.copytree(RECIPES_DIR / "zero3", folder)
    text = (folder / "train.py").read_text().splitlines(keepends=True)
    text[20] = "# an edit\n"
    (folder / "train.py").write_text("".join(text))
    [problem] = copies.check_copies(tmp_path / "recipes")
    assert problem.startswith(f"{folder / 'train.py'}:21: has '# an edit'")


# ---- the template's optional sections ------------------------------------------------------------------------------
def test_each_section_of_the_template_is_turned_on_by_a_config():
    """launch.recipe.sections says what turns on every section the template marks, and marks no other."""
    parts = train_template.parts()
    assert parts.names == sections.SECTION_NAMES
    assert all(parts.functions[name] for name in parts.names)  # how a fork's sections are found


def test_a_copy_holds_only_the_sections_its_configs_turn_on():
    """The copies hold the code their configs use: zero3's script has no tiled MLP, Ulysses or document joining
    (and is shorter than TRL's own sft.py); the ALST and CP recipes hold theirs. No copy holds a section line."""
    import trl.scripts.sft

    expected = {"zero3": (), "ddp": (), "alst-ulysses-4gpu": ("ulysses-resume",),
                "alst-ulysses-8gpu": ("tiled-mlp", "ulysses-resume"),
                "ring-cp-2gpu": ("join-documents", "sharded-final-save"), "fsdp2": ("sharded-final-save",)}
    parts = train_template.parts()
    for name, held in expected.items():
        text = (RECIPES_DIR / name / "train.py").read_text()
        assert sections.marked_sections(RECIPES_DIR / name / "train.py") == held, name
        defined = set(re.findall(r"^def (\w+)\(", text, re.M))
        assert defined == {"main", "make_parser"} | {f for s in held for f in parts.functions[s]}, name
        fields = set(re.findall(r"^    (\w+): [^=]+= field\(", text, re.M))
        assert all(key in fields for s in held for key in parts.keys[s]), name
        assert not any(key in fields for s in set(parts.names) - set(held) for key in parts.keys[s]), name
        assert not re.search(r"^\s*# (begin|end) section ", text, re.M), name
    assert len((RECIPES_DIR / "zero3" / "train.py").read_text().splitlines()) < len(
        Path(trl.scripts.sft.__file__).read_text().splitlines())


def test_rendering_only_leaves_out_sections():
    """With every section kept, the template rendered is the template without its section lines; a left-out
    section leaves no run of more than two blank lines."""
    lines = [line for line in train_template.lines() if not line.boundary]
    assert train_template.render(sections.SECTION_NAMES) == "".join(line.text for line in lines)
    for kept in ((), ("tiled-mlp",), ("join-documents",), ("ulysses-resume",)):
        assert "\n\n\n\n" not in train_template.render(kept), kept


def test_a_copy_whose_config_turns_on_a_section_is_stale_until_synced(tmp_path):
    folder = make_recipe(tmp_path / "recipes", config={"tiled_mlp": True})
    [stale] = copies.check_copies(tmp_path / "recipes")
    assert stale == (f"{folder / 'train.py'}:1: holds the sections [none], but its configs turn on [tiled-mlp]")
    messages = []
    copies.sync_copies(tmp_path / "recipes", out=messages.append)
    assert messages == [f"updated {folder / 'train.py'} [sections: tiled-mlp]"]
    assert copies.check_copies(tmp_path / "recipes") == []
    assert "def tile_mlps(" in (folder / "train.py").read_text()


@shows(rules.script_holds_its_sections)
def test_a_run_needing_a_section_its_script_lacks_is_refused_with_the_command_that_fixes_it(tmp_path):
    """Copied zero3 folders: one given Ulysses SP in its Accelerate config (a section without fields, so the rule,
    not the parser, finds it), one turning tiled MLP on in config.yaml, and a fork of the latter."""
    sp = make_recipe(tmp_path, name="sp", accelerate={"parallelism_config": {
        "parallelism_config_dp_shard_size": 4, "parallelism_config_sp_size": 2,
        "parallelism_config_sp_backend": "deepspeed"}})
    msg = rules.script_holds_its_sections(resolve(Options(recipe=str(sp))), facts())
    assert msg.startswith(f"{sp / 'train.py'} lacks the optional section(s) of templates/train.py that this run needs: "
                          "ulysses-resume (needed for `parallelism_config_sp_size` above 1 in the Accelerate config)")
    assert f"`python -m launch sync-scripts {sp}` rewrites it" in msg
    copies.sync_script(sp / "train.py", out=lambda *_: None)
    assert rules.script_holds_its_sections(resolve(Options(recipe=str(sp))), facts()) is None

    tiled = make_recipe(tmp_path, name="tiled", config={"tiled_mlp": True})
    msg = rules.script_holds_its_sections(resolve(Options(recipe=str(tiled))), facts())
    assert "tiled-mlp (needed for `tiled_mlp: true` in config.yaml)" in msg and "It is a copy" in msg
    script = tiled / "train.py"
    script.write_text("".join(script.read_text().splitlines(keepends=True)[1:]))  # a fork
    msg = rules.script_holds_its_sections(resolve(Options(recipe=str(tiled))), facts())
    assert "It is a fork" in msg and "between `# begin section NAME` and `# end section NAME`" in msg
    script.write_text(train_template.render(("tiled-mlp",)))  # the fork copies the section in
    assert rules.script_holds_its_sections(resolve(Options(recipe=str(tiled))), facts()) is None


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
    assert script.read_text() == before
    assert f"left alone (forked: no `{copies.MARKER_PREFIX}` line): {script}" in messages
    # a changed config makes the "fits on" block stale; the check's advice is the command that fixes it
    config = fork / "config.yaml"
    config.write_text(config.read_text().replace("max_length: 2048", "max_length: 1024"))
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
        assert r["train_script"] == "copy" or r["name"] not in SHIPPED


def test_yaml_configs_are_plain_yaml():
    for path in ACCELERATE_CONFIGS + [RECIPES_DIR / n / "config.yaml" for n in RECIPES]:
        assert isinstance(yaml.safe_load(path.read_text()), dict), path


@pytest.mark.parametrize("name", RECIPES)
def test_expected_metrics_are_as_the_record_command_writes_them(name):
    """expected_metrics.json's per-step metrics change only through `python -m launch record`: every smoke profile
    carries the environment and invocation it was recorded with, and bounds derived from its own losses (a
    hand-edited loss list would no longer match its bounds). A GPU profile may hold only a first-loss band, which
    says where it comes from (launch.results.sentinel)."""
    from launch.results.expected import TOLERANCE, bounds_for
    from launch.results.sentinel import band_problems
    from launch.results.stepdiff import METRICS

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

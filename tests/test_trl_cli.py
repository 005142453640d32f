"""TRL's own CLI runs the recipes' configs: `trl sft --config recipes/NAME/config.yaml` turns the config's
`accelerate_config:` key into `accelerate launch --config_file` and runs TRL's trl/scripts/sft.py (no launcher
checks, no tiled_mlp or other RecipeArguments). On CPU, with the smoke profile's arguments (built from
launch.config.profiles, the launcher's own source of them) and two processes, its per-step losses must equal our
launcher's run of the same recipe. TRL's sft.py keeps no trainer_state.json at the end, so the losses are read back
from the trackio store the config reports to. The other way round, our train.py parses what sft.py parses, a `datasets:`
mixture (TRL's DatasetMixtureConfig) included.

On CPU, TRL's script lacks our CPU enablement: launch/cpu/site on PYTHONPATH adds the gloo exit pause (without it
about 1 DeepSpeed CPU run in 4 aborts at exit after training) and keeps DeepSpeed from compiling its shm op."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launcher import REPO, explain, free_port, test_env
from launch.config import profiles
from launch.recipe.discovery import find_recipe

pytestmark = [pytest.mark.slow, pytest.mark.long]


def _trackio_losses(store: Path, project: str, run: str) -> dict[int, float]:
    trackio = Path(sys.executable).parent / "trackio"

    def values(metric):
        out = subprocess.run([str(trackio), "get", "metric", "--project", project, "--run", run, "--metric", metric,
                              "--json"], capture_output=True, text=True, timeout=120,
                             env=test_env({"TRACKIO_DIR": str(store)}))
        assert out.returncode == 0, out.stderr
        return {v["step"]: v["value"] for v in json.loads(out.stdout)["values"]}

    global_step, loss = values("train/global_step"), values("train/loss")
    return {int(global_step[i]): value for i, value in loss.items()}


@pytest.mark.parametrize("recipe", ["ddp", "zero3"])
def test_trl_sft_runs_the_recipe_config_like_the_launcher(recipe, tmp_path, smoke_runs):
    config = find_recipe(recipe).config
    overrides = profiles.training_overrides(config, smoke_run=True, cpu=True, progress=lambda *_: None)
    overrides.update(output_dir=str(tmp_path / "out"), run_name="trl-cli")
    cmd = [str(Path(sys.executable).parent / "trl"), "sft", "--config", f"recipes/{recipe}/config.yaml",
           "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()),
           *profiles.as_argv(overrides)]
    store = tmp_path / "trackio"
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=test_env({"TRACKIO_DIR": str(store),
                                        "PYTHONPATH": str(REPO / "launch" / "cpu" / "site")}))
    assert proc.returncode == 0, explain(proc)
    # launch/cpu/site kept DeepSpeed from building (or loading) its inference-only shm op (35 s on a fresh machine)
    assert "deepspeed_shm_comm" not in proc.stdout + proc.stderr
    trl = _trackio_losses(store, config["project"], "trl-cli")
    proc, ours = smoke_runs.run(recipe)
    assert proc.returncode == 0, explain(proc)
    assert sorted(trl) == ours["observed"]["step"]
    # measured: identical (0.0) for both recipes: the same SFTTrainer path as our train.py, on the same data
    assert max(abs(trl[s] - loss) for s, loss in zip(ours["observed"]["step"], ours["observed"]["loss"])) < 1e-6


def test_a_datasets_mixture_in_a_copied_recipe_runs_on_cpu(tmp_path, smoke_runs):
    """TRL's documented way to mix datasets, a `datasets:` list in the config (DatasetMixtureConfig), is parsed by the
    recipe's train.py as by TRL's sft.py, and wins over dataset_name (here the smoke profile's). The mixture is the
    smoke data's two halves in swapped order, so the rows differ from the recorded run's and so do the losses."""
    import shutil

    import yaml

    from helpers.launcher import launch_in_process
    from launch.config import smoke

    folder = tmp_path / "mixed"
    shutil.copytree(REPO / "recipes" / "ddp", folder)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    del config["dataset_name"]
    data = smoke.ensure_smoke_assets(progress=lambda *_: None)["data"]
    config["datasets"] = [{"path": data, "split": "train[50%:]"}, {"path": data, "split": "train[:50%]"}]
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    proc = launch_in_process(folder, "--smoke", "--cpu", "--max-steps", "3", "--output-dir", tmp_path / "out")
    assert proc.returncode == 0, explain(proc)
    log = (tmp_path / "out" / "launch.log").read_text()
    assert "The `datasets` argument will be used to load the dataset" in proc.stdout + proc.stderr + log
    mixed = json.loads((tmp_path / "out" / "run_summary.json").read_text())["observed"]
    proc, recorded = smoke_runs.run("ddp")
    assert proc.returncode == 0, explain(proc)
    assert mixed["step"] == [1, 2, 3] and mixed["loss"][0] != recorded["observed"]["loss"][0]

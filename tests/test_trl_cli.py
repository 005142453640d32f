"""TRL's own CLI runs the recipes' configs: `trl sft --config recipes/NAME/config.yaml` turns the config's
`accelerate_config:` key into `accelerate launch --config_file` and runs TRL's trl/scripts/sft.py (no launcher
checks, no tiled_mlp or other RecipeArguments). On CPU, with the smoke profile's arguments (built from
launch.profiles, the launcher's own source of them) and two processes, its per-step losses must equal our launcher's
run of the same recipe. TRL's sft.py keeps no trainer_state.json at the end, so the losses are read back from the
trackio store the config reports to.

On CPU, TRL's script lacks our CPU enablement: launch/cpu/site on PYTHONPATH adds the gloo exit pause (without it
about 1 DeepSpeed CPU run in 4 aborts at exit after training)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launcher import REPO, explain, free_port, test_env
from launch import profiles
from launch.recipes import find_recipe

pytestmark = pytest.mark.slow


def _trackio_losses(store: Path, project: str, run: str) -> dict[int, float]:
    trackio = Path(sys.executable).parent / "trackio"

    def values(metric):
        out = subprocess.run([str(trackio), "get", "metric", "--project", project, "--run", run, "--metric", metric,
                              "--json"], capture_output=True, text=True, timeout=120, env=test_env({"TRACKIO_DIR": str(store)}))
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
                          env=test_env({"TRACKIO_DIR": str(store), "PYTHONPATH": str(REPO / "launch" / "cpu" / "site")}))
    assert proc.returncode == 0, explain(proc)
    trl = _trackio_losses(store, config["project"], "trl-cli")
    proc, ours = smoke_runs.run(recipe)
    assert proc.returncode == 0, explain(proc)
    assert sorted(trl) == ours["observed"]["step"]
    # measured: identical (0.0) for both recipes: the same SFTTrainer path as our train.py, on the same data
    assert max(abs(trl[s] - loss) for s, loss in zip(ours["observed"]["step"], ours["observed"]["loss"])) < 1e-6

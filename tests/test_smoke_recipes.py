"""Each recipe's smoke profile runs on CPU through `python -m launch` and meets its expected metrics."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import explain, launch_cli
from launch.recipes import RECIPES_DIR, find_recipe, recipe_names

pytestmark = pytest.mark.slow

CPU_VERIFIED = [n for n in recipe_names() if "smoke-cpu" in find_recipe(n).expected_metrics().get("profiles", {})]


def test_every_recipe_is_verified_on_cpu():
    """No recipe silently lacks a CPU smoke profile (a recipe that cannot run on CPU must be named here, with why)."""
    assert set(CPU_VERIFIED) == set(recipe_names())


@pytest.mark.parametrize("name", CPU_VERIFIED)
def test_smoke_profile_meets_expected_metrics_on_cpu(name, smoke_runs):
    proc, summary = smoke_runs.run(name)
    assert proc.returncode == 0, explain(proc)
    assert "expected metrics: PASSED" in proc.stdout
    assert summary["verdict"]["passed"] is True
    recorded = find_recipe(name).expected_metrics()["profiles"]["smoke-cpu"]
    assert summary["invocation"] == recorded["invocation"]
    # run_summary.json holds what a user needs to trust (or reproduce) the run
    for key in ("recipe", "profile", "command", "versions", "world_size", "effective_batch", "wall_time_s",
                "tokens_per_second"):
        assert summary.get(key) is not None, key
    # a loss and a grad_norm at every step
    assert len(summary["observed"]["loss"]) == len(summary["observed"]["grad_norm"]) == len(recorded["steps"]["loss"])


def test_a_copied_recipe_folder_runs_without_edits(tmp_path):
    copy = tmp_path / "my-zero3"
    shutil.copytree(RECIPES_DIR / "zero3", copy)
    proc = launch_cli(copy, "--smoke", "--cpu", "--output-dir", tmp_path / "out")
    assert proc.returncode == 0, explain(proc)
    assert "expected metrics: PASSED" in proc.stdout
    assert json.loads((tmp_path / "out" / "run_summary.json").read_text())["recipe"] == "my-zero3"


def test_a_miss_is_reported_and_exits_nonzero(tmp_path):
    """The judge can fail: a recipe whose recorded losses are off by 1% is a miss."""
    copy = tmp_path / "ddp-off"
    shutil.copytree(RECIPES_DIR / "ddp", copy)
    data = json.loads((copy / "expected_metrics.json").read_text())
    steps = data["profiles"]["smoke-cpu"]["steps"]
    steps["loss"] = [x * 1.01 for x in steps["loss"]]
    (copy / "expected_metrics.json").write_text(json.dumps(data))
    proc = launch_cli(copy, "--smoke", "--cpu", "--output-dir", tmp_path / "out")
    assert proc.returncode == 1, explain(proc)
    assert "MISS  loss max |diff|" in proc.stdout and "expected metrics: FAILED" in proc.stdout


@pytest.mark.parametrize("name", ["ring-cp-2gpu", "ring-cp-4gpu"])
def test_cp_smoke_runs_the_real_cp_path_and_matches_no_cp(name, smoke_runs):
    """The CP smoke profile runs Accelerate's CP path (FSDP2 + torch context_parallel), not a silent single-device
    fallback, and trains like the same model without CP on the same 4 sequences per step."""
    proc, cp = smoke_runs.run(name)
    assert proc.returncode == 0, explain(proc)
    assert "[launch.cpu] context parallelism on CPU: FSDP2 over the device mesh, cp_size=" in proc.stdout
    proc, base = smoke_runs.run("ring-cp-2gpu", "--num-processes", "1", "--cp-size", "1")
    assert proc.returncode == 0, explain(proc)
    assert "[launch.cpu] context parallelism" not in proc.stdout
    # transformers' CP test allows rtol=atol=2e-2; measured here (fp32): loss 9.5e-7, grad_norm 1.5e-5 (cp4), the
    # grad_norm being float32 reduction order (the no-CP run alone moves 5.5e-6 between pad-to-4 and pad-to-8)
    diff = lambda m: max(abs(a - b) for a, b in zip(cp["observed"][m], base["observed"][m]))  # noqa: E731
    assert diff("loss") < 1e-5
    assert diff("grad_norm") < 1e-4

"""GPU smoke tests (`pytest -m gpu`, `docker compose run test`): each recipe's smoke profile on the real GPU
path (NCCL, bf16, the recipe's attention kernel), judged against its recorded `smoke-gpu` expected metrics.

Without GPUs, or with fewer than a recipe needs, each test is skipped and says why. A GPU runner records the
expected metrics once, deliberately: `python -m launch record RECIPE --smoke` (stores GPU model, driver and
versions with them).
"""

from __future__ import annotations

import json

import pytest

from helpers.launcher import REPO, explain, launch_cli
from launch.results.expected import read_expected
from launch.machine import gpu_info
from launch.recipes import find_recipe, recipe_names
from launch.options import Options
from launch.resolve import resolve

pytestmark = pytest.mark.gpu

GPUS = gpu_info()[0]


@pytest.mark.parametrize("name", recipe_names())
def test_gpu_smoke_profile_meets_expected_metrics(name):
    if GPUS == 0:
        pytest.skip(f"{name}: no NVIDIA GPU visible (torch.cuda.is_available() is False); the CPU path is tested "
                    "by tests/test_smoke_recipes.py")
    setup = resolve(Options(recipe=name, smoke=True))
    needed = setup.layout.processes_per_machine
    if GPUS < needed:
        pytest.skip(f"{name}: needs {needed} GPUs, {GPUS} visible")
    expected = read_expected(find_recipe(name).expected_metrics_path).get("profiles", {}).get("smoke-gpu")
    assert expected, (f"{name} has no smoke-gpu expected metrics; record them on this runner with "
                      f"`python -m launch record {name} --smoke` and commit them with the reason")
    out = REPO / "outputs" / "gpu-smoke" / name
    proc = launch_cli(name, "--smoke", "--output-dir", out, timeout=1800)
    assert proc.returncode == 0, explain(proc)
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["verdict"]["passed"] is True, summary["verdict"]

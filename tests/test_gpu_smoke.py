"""GPU smoke tests (`pytest -m gpu`, `docker compose run test`): each recipe's GPU smoke profile on the real GPU
path (NCCL, bf16, the recipe's attention kernel), judged against its recorded `smoke-gpu` expected metrics.

The GPU smoke profile (`launch.results.expected.smoke_gpu`) is one process on one GPU for every recipe whose layout
means something there (ddp, zero1/2/3, zero3-offload, fsdp2 and qlora-fsdp as a shard group of one, lora):
`pytest -m gpu` on one GPU runs those eight, each a small run (a 2-layer model, 12 steps). The recipes whose Accelerate
config fixes a mesh of several processes (ring-attention CP, Ulysses SP, fsdp2-70b) run their CPU smoke layout and need
2 or 4 GPUs; with fewer the test is skipped and says how many.

No `smoke-gpu` metrics are recorded yet (no GPU was available where this was written). A GPU runner records them
once, deliberately, with the command the test prints (`python -m launch record RECIPE --smoke --num-processes 1`:
the GPU, driver and versions are stored with them) and commits them in a commit of their own. Until then the GPU
test runs the smoke profile (proving it trains) and then FAILS with that command: a GPU runner with nothing to judge
against says what to run; it does not pass. The tests without the gpu mark check, on CPU, what decides which test
runs where: the layouts, the skip reasons for any GPU count, the record command and that each one-GPU smoke run
resolves.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from helpers.launcher import REPO, explain, launch_cli, launch_in_process
from launch.config import profiles
from launch.facts.machine import gpu_info
from launch.config.options import Options
from launch.recipe.discovery import find_recipe, recipe_names
from launch.run.resolve import resolve
from launch.results.expected import profile_entry, smoke_gpu
from launch.results.judge import NO_REFERENCE, record_command

GPUS = gpu_info()[0]
GPU_PROFILE = profiles.profile_name(True, False)  # smoke-gpu
# The recipes whose layout means something on one GPU: the GPU smoke runs one process for each.
ONE_GPU = {"ddp", "zero1", "zero2", "zero3", "zero3-offload", "fsdp2", "lora", "qlora-fsdp"}


def gpu_smoke_plan(name: str, gpus: int) -> tuple[list[str], str | None]:
    """(the launcher arguments of the recipe's GPU smoke run after `--smoke`, why it is skipped with `gpus` GPUs or
    None). Once smoke-gpu metrics are recorded, the run inherits their layout (no arguments: passing the recorded
    training arguments again would make it another run); before, it gets the GPU smoke profile's layout."""
    recipe = find_recipe(name)
    layout = smoke_gpu(recipe)
    recorded = profile_entry(recipe, GPU_PROFILE).get("invocation")
    needed = int(recorded["num_processes"]) if recorded else layout.num_processes
    args = [] if recorded else layout.argv()
    if gpus == 0:
        return args, (f"{name}: no NVIDIA GPU visible (torch.cuda.is_available() is False); the CPU path is tested by "
                      "tests/test_smoke_recipes.py")
    if gpus < needed:
        return args, f"{name}: needs {needed} GPUs, {gpus} visible" + (f"; {layout.needs_more}" if layout.needs_more
                                                                         else "")
    return args, None


@pytest.mark.gpu
@pytest.mark.parametrize("name", recipe_names())
def test_gpu_smoke_profile_meets_expected_metrics(name):
    args, skip = gpu_smoke_plan(name, GPUS)
    if skip:
        pytest.skip(skip)
    out = REPO / "outputs" / "gpu-smoke" / name
    proc = launch_cli(name, "--smoke", "--output-dir", out, "--overwrite", *args, timeout=1800)
    if proc.returncode == NO_REFERENCE:
        setup = resolve(Options(recipe=name, smoke=True), progress=lambda *_: None)
        pytest.fail(f"{name}: the GPU smoke run trained, but {find_recipe(name).expected_metrics_path.name} has no "
                    f"{GPU_PROFILE} metrics to judge it against. Record them on this runner with "
                    f"`{record_command(setup)}` and commit them in a commit of their own (the GPU, driver and versions "
                    "are stored with them).")
    assert proc.returncode == 0, explain(proc)
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["verdict"]["passed"] is True, summary["verdict"]


# ---- on CPU: which GPU smoke runs where, and what they run ----------------------------------------------------------

def test_one_gpu_smoke_layouts_and_skip_reasons():
    """One process for the eight recipes whose layout means something on one GPU; the CP/SP/multi-node recipes run
    their CPU smoke layout and say how many GPUs they need (fake GPU counts: this machine has none)."""
    layouts = {name: smoke_gpu(find_recipe(name)) for name in recipe_names()}
    assert {name for name, layout in layouts.items() if layout.num_processes == 1} == ONE_GPU
    for name in ONE_GPU:
        assert layouts[name].argv() == ["--num-processes", "1"] and layouts[name].needs_more is None
        assert gpu_smoke_plan(name, 1) == (["--num-processes", "1"], None)
        assert "no NVIDIA GPU visible" in gpu_smoke_plan(name, 0)[1]
    # a sequence split over GPUs (CP, SP) or a model sharded over machines: their CPU smoke layout, on that many GPUs
    assert layouts["ring-cp-2gpu"].argv() == ["--num-processes", "2"]
    assert gpu_smoke_plan("ring-cp-2gpu", 1)[1] == (
        "ring-cp-2gpu: needs 2 GPUs, 1 visible; its Accelerate config fixes a mesh of 2 processes (cp=2): its GPU "
        "smoke profile is its CPU smoke layout, 2 processes on 2 GPUs")
    assert gpu_smoke_plan("ring-cp-2gpu", 2)[1] is None
    assert layouts["alst-ulysses-8gpu"].argv() == ["--num-processes", "4", "--sp-size", "4", "--",
                                                   "--tiled_mlp_shards", "4", "--pad_to_multiple_of", "128"]
    assert "needs 4 GPUs, 2 visible; its Accelerate config fixes a mesh of 8 processes (sp=8)" in \
        gpu_smoke_plan("alst-ulysses-8gpu", 2)[1]
    for name in set(recipe_names()) - ONE_GPU:
        needed = layouts[name].num_processes
        assert needed >= 2 and layouts[name].needs_more
        assert gpu_smoke_plan(name, needed - 1)[1] and gpu_smoke_plan(name, needed)[1] is None
        cpu = profile_entry(find_recipe(name), "smoke-cpu")["invocation"]
        assert (needed, layouts[name].mesh) == (cpu["num_processes"], cpu["mesh"])


def test_the_record_command_records_the_invocation_the_gpu_test_runs():
    """The command the GPU test prints records exactly the invocation its run has (so that, once recorded, the run is
    judged, not 'layout differs'), for every one-GPU recipe."""
    for name in sorted(ONE_GPU):
        args, _ = gpu_smoke_plan(name, 1)
        run = resolve(Options(recipe=name, smoke=True, num_processes=1), progress=lambda *_: None)
        record = resolve(Options(recipe=name, smoke=True, num_processes=1, record=True), progress=lambda *_: None)
        assert run.profile == record.profile == GPU_PROFILE
        assert run.invocation == record.invocation == {"num_processes": 1, "mesh": {}, "training_args": []}
        assert record_command(run) == f"python -m launch record {name} --smoke --num-processes 1"
    cpu = resolve(Options(recipe="ddp", smoke=True, cpu=True), progress=lambda *_: None)
    assert record_command(cpu) == "python -m launch record ddp --smoke --cpu"


@pytest.mark.parametrize("name", sorted(ONE_GPU))
def test_each_one_gpu_smoke_run_resolves(name, tmp_path):
    """`python -m launch RECIPE --smoke --num-processes 1 --dry-run` (in process): the one-process layout passes every
    check a GPU run makes before it starts. This machine has no GPU, which the dry run reports, and the GPU smoke run
    keeps the recipe's Liger kernels (the GPU path as users run it), so where liger-kernel is not installed (it is in
    the image's lock, not the CPU lock) the dry run says that too; nothing else."""
    args, _ = gpu_smoke_plan(name, 1)
    proc = launch_in_process(name, "--smoke", "--output-dir", tmp_path / "out", "--dry-run", *args)
    assert proc.returncode == 0, explain(proc)
    assert "--num_processes 1" in proc.stdout
    problems = proc.stdout.split("the plan is valid, but this machine could not run it:", 1)[-1].strip().split("\n\n")
    assert problems[0].startswith("The recipe asks for 1 GPU(s) on this machine but no GPU is visible."), \
        proc.stdout[-2000:]
    liger_missing = importlib.util.find_spec("liger_kernel") is None
    assert len(problems) == 1 + liger_missing, problems
    assert all(p.startswith("`use_liger_kernel: true`") and "needs liger-kernel" in p for p in problems[1:]), problems

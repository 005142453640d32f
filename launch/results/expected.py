"""A recipe's expected_metrics.json: its format, reading it (checked before any training) and what a recording
writes into it.

Per profile (`smoke-cpu`, `smoke-gpu`, ...): the invocation it was recorded with, the environment, the per-step
loss and grad_norm, and two-sided bounds. A profile's entry may also hold a `first_loss_band`
(`launch.results.sentinel`,
validated here), and a GPU profile's entry (`full-gpu`) may hold only that. Judging follows two upstream models:
- TRL's invariant tests: per-step loss and grad_norm against reference values, with a maximum absolute
  difference *and* a mean (signed) drift (`TOLERANCE` below holds TRL's numbers);
- axolotl's e2e checks: two-sided bounds, i.e. the loss must fall, and the first and last loss must lie in a
  range (rtol 0.05 around the recorded values).
The file is written only by `python -m launch record ...` (`launch.results.judge.record`). `smoke_gpu` is the layout
the `smoke-gpu` profile is recorded and run with.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from launch.errors import LaunchError
from launch.config.layout import mesh_from  # the mesh sizes, as Accelerate's ParallelismConfig reads them
from launch.results.sentinel import band_problems
from launch.results.stepdiff import METRICS

# TRL tests/invariant: loss max |diff| 1e-3 and mean diff 1e-5; grad_norm 1e-1 and 1e-3 (fp32, seed 42).
TOLERANCE = {
    "loss": {"max_abs": 1e-3, "mean": 1e-5},
    "grad_norm": {"max_abs": 1e-1, "mean": 1e-3},
}
BOUNDS_RTOL = 0.05  # axolotl: first and last loss within 5% of the recorded values
DROP_FRACTION = 0.5  # the loss must fall by at least half of the recorded relative drop


def read_expected(path: Path) -> dict:
    """A recipe's expected_metrics.json ({} when absent), checked before any training: a truncated or hand-broken
    file is named, with the key, now rather than after the run."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise LaunchError(f"{path} cannot be read ({e}). Restore it from git (`git checkout -- {path}`) or re-record "
                          "it with `python -m launch record`.") from None
    except json.JSONDecodeError as e:
        raise LaunchError(f"{path} is not valid JSON ({e.msg}, line {e.lineno} column {e.colno}). Restore it from git "
                          f"(`git checkout -- {path}`) or re-record it with `python -m launch record`.") from None
    problems = expected_problems(data)
    if problems:
        raise LaunchError(f"{path} is malformed: " + "; ".join(problems) + ". Restore it from git or re-record it with "
                          "`python -m launch record`.")
    return data


def profile_entry(source, profile: str) -> dict:
    """The entry of `profile` (`smoke-cpu`, ...) in a recipe's expected_metrics.json, {} when the file or the profile
    has none. `source`: the recipe (anything with an `expected_metrics_path`), the file's path, or its content as
    `read_expected` returned it."""
    data = source if isinstance(source, dict) else read_expected(getattr(source, "expected_metrics_path", source))
    return (data.get("profiles") or {}).get(profile) or {}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def expected_problems(data) -> list[str]:
    if not isinstance(data, dict):
        return ["the top level is not an object"]
    out = []
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        return ["`profiles` is not an object"]
    for name, entry in profiles.items():
        where = f"profiles.{name}"
        if not isinstance(entry, dict):
            out.append(f"`{where}` is not an object")
            continue
        out += [f"`{where}`: {problem}" for problem in band_problems(entry)]
        if "steps" not in entry and "invocation" not in entry:
            # a profile entry without recorded steps: only a first-loss band (launch.results.sentinel) for a GPU run
            continue
        if not isinstance(entry.get("invocation"), dict):
            out.append(f"`{where}.invocation` is missing or not an object")
        steps = entry.get("steps")
        if not isinstance(steps, dict):
            out.append(f"`{where}.steps` is missing or not an object")
            continue
        for metric in METRICS:
            values = steps.get(metric)
            if not isinstance(values, list) or not all(isinstance(v, (int, float)) for v in values):
                out.append(f"`{where}.steps.{metric}` is missing or not a list of numbers")
            elif not all(_number(v) for v in values):
                out.append(f"`{where}.steps.{metric}` holds NaN or infinity (a reference must be finite)")
        bounds = entry.get("bounds")
        if bounds is not None:
            if not (isinstance(bounds, dict) and {"first_loss", "last_loss", "min_relative_drop"} <= set(bounds)):
                out.append(f"`{where}.bounds` lacks first_loss, last_loss or min_relative_drop")
            elif not (all(isinstance(bounds[k], list) and len(bounds[k]) == 2 and all(map(_number, bounds[k]))
                          for k in ("first_loss", "last_loss")) and _number(bounds["min_relative_drop"])):
                out.append(f"`{where}.bounds` holds a value that is not a finite number (or a range that is not "
                           "[low, high])")
    tolerance = data.get("tolerance")
    if tolerance is not None and not all(isinstance(tolerance.get(m), dict) and {"max_abs", "mean"} <= set(tolerance[m])
                                         for m in METRICS):
        out.append("`tolerance` needs max_abs and mean for " + " and ".join(METRICS))
    elif tolerance is not None and not all(_number(tolerance[m][k]) for m in METRICS for k in ("max_abs", "mean")):
        out.append("`tolerance` holds a value that is not a finite number")
    return out


def bounds_for(losses: list[float]) -> dict:
    first, last = losses[0], losses[-1]
    drop = (first - last) / first if first else 0.0
    return {
        "first_loss": [round(first * (1 - BOUNDS_RTOL), 6), round(first * (1 + BOUNDS_RTOL), 6)],
        "last_loss": [round(last * (1 - BOUNDS_RTOL), 6), round(last * (1 + BOUNDS_RTOL), 6)],
        "min_relative_drop": round(drop * DROP_FRACTION, 6),
    }


# ---- the GPU smoke profile's layout (`smoke-gpu`) -------------------------------------------------------------------
# One process on one GPU wherever the recipe's layout means something there: DDP, ZeRO-1/2/3 (and offload), FSDP2 and
# FSDP1 as a shard group of one, LoRA and QLoRA. The GPU runners that exist have one GPU, and NCCL refuses two ranks on
# one GPU, so a smoke profile of several processes could not run on them. A recipe whose Accelerate config fixes a mesh
# of several processes (ring-attention CP, Ulysses SP: a sequence split over GPUs; FSDP2 over machines) keeps the
# layout its CPU smoke profile was recorded with, and needs that many GPUs.
SMOKE_GPU_PROCESSES = 1


@dataclass(frozen=True)
class SmokeGpu:
    """The layout of a recipe's GPU smoke run: what `python -m launch RECIPE --smoke` and `record` are given."""

    num_processes: int
    mesh: dict = field(default_factory=dict)
    training_args: tuple = ()
    needs_more: str | None = None  # why the recipe needs more than one GPU; None: one GPU

    def options(self) -> list[str]:
        """The launcher options (before `--`)."""
        out = ["--num-processes", str(self.num_processes)]
        for key, size in self.mesh.items():
            out += [f"--{key.replace('_', '-')}-size", str(size)]
        return out

    def argv(self) -> list[str]:
        return self.options() + (["--", *self.training_args] if self.training_args else [])


def smoke_gpu(recipe) -> SmokeGpu:
    """The GPU smoke layout of `recipe` (a launch.recipe.discovery.Recipe): one process, unless its Accelerate config
    fixes a mesh of several (then its recorded smoke-cpu layout: processes, mesh sizes and training arguments)."""
    accelerate = recipe.accelerate
    if not accelerate.get("parallelism_config"):
        return SmokeGpu(SMOKE_GPU_PROCESSES)
    sizes = {k: v for k, v in mesh_from(accelerate, int(accelerate.get("num_processes", 1) or 1)).items() if v > 1}
    total = math.prod(sizes.values())
    if total == 1:
        return SmokeGpu(SMOKE_GPU_PROCESSES)
    cpu = profile_entry(recipe, "smoke-cpu").get("invocation") or {}
    processes = int(cpu.get("num_processes") or total)
    mesh = ", ".join(f"{k}={v}" for k, v in sizes.items())
    why = (f"its Accelerate config fixes a mesh of {total} processes ({mesh}): "
           f"its GPU smoke profile is its CPU smoke layout, {processes} processes on {processes} GPUs")
    return SmokeGpu(processes, dict(cpu.get("mesh") or {}), tuple(cpu.get("training_args") or ()), why)

"""`python -m launch plan RECIPE`: will the recipe fit a target machine, and how long can its sequences be?

Plans for a *target* machine (GPUs per node, nodes, GPU and host memory), not this one: it runs on a laptop without
GPUs, reads only the model's config.json (`launch.hub`: a local folder, the hub cache, or the hub when reachable),
never weights, and feeds the resolved run (the same `resolve()` as a real run, so the same merged training
arguments) to the memory model (`launch.memory`). The preflight of a real run, `--dry-run` and the README "fits on"
lines call the same functions.

Exit status: 0 fits, 1 does not fit, 2 invalid input (or the model's config.json cannot be read).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, replace

from launch import hub, memory
from launch.recipes import LaunchError
from launch.training_args import effective

# What an "80 GB" H100 or A100 reports (torch.cuda.get_device_properties(0).total_memory, in GiB): the default target.
GPU_MEMORY_GIB = memory.H100_80GB_GIB


@dataclass
class Target:
    gpus_per_node: int
    nodes: int = 1
    gpu_memory_gib: float = GPU_MEMORY_GIB
    host_memory_gib: float | None = None  # per node; None: host checks are reported, not judged

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def run_shape(setup) -> memory.RunShape:
    """The memory model's view of a resolved run (its merged training arguments, mesh and process count)."""
    t = dict(setup.training)
    # transformers' current names win over their deprecated aliases (launch.training_args.effective)
    t["gradient_checkpointing"] = effective(t, "activation_checkpointing")
    t["gradient_checkpointing_kwargs"] = effective(t, "activation_checkpointing_kwargs")
    return memory.RunShape.from_configs(setup.accelerate, t, mesh=setup.plan.mesh, world_size=setup.plan.world_size,
                                        num_machines=setup.plan.num_machines,
                                        device="cpu" if setup.options.cpu else "gpu")


def layout_multiple(setup) -> int:
    """The multiple every global length must be: the recipe's pad_to_multiple_of, 2 x cp under CP, sp under SP."""
    m = int(setup.training.get("pad_to_multiple_of") or 1)
    mesh = setup.plan.mesh
    if mesh.get("cp", 1) > 1:
        m = math.lcm(m, 2 * mesh["cp"])
    if mesh.get("sp", 1) > 1:
        m = math.lcm(m, mesh["sp"])
    return m


def architecture(model: hub.ModelConfig, name: str | None) -> memory.Architecture:
    if model.config is None:
        raise LaunchError(f"The planner needs the model's config.json and could not read it: {model.problem}.")
    return memory.Architecture.from_config(model.config)


@dataclass
class Plan:
    estimate: memory.Estimate
    run: memory.RunShape
    target: Target
    max_length: int
    longest: int | None  # with --max-length auto (or asked for)
    multiple: int

    @property
    def fits(self) -> bool:
        return memory.fits(self.estimate, self.target.gpu_memory_gib, self.target.host_memory_gib)

    def as_json(self) -> dict:
        est = self.estimate
        return {
            "fits": self.fits,
            "gpu_peak_gib": round(est.gpu_peak_gib, 3),
            "gpu_allocated_peak_gib": round(est.allocated_peak_gib, 3),
            "host_peak_gib": round(est.host_per_node_gib, 3),
            "host_per_process_gib": round(est.host_per_process_gib, 3),
            "max_length": self.longest if self.longest is not None else self.max_length,
            "per_rank_length": est.per_rank_length,
            "length_multiple": self.multiple,
            "breakdown": {t.name: round(t.gib, 3) for t in est.gpu_terms if t.counted},
            "host_breakdown": {t.name: round(t.gib, 3) for t in est.host_terms},
            "target": {"gpus_per_node": self.target.gpus_per_node, "nodes": self.target.nodes,
                       "gpu_memory_gib": self.target.gpu_memory_gib, "host_memory_gib": self.target.host_memory_gib},
            "largest_term": est.largest_gpu_term().name,
            "advice": est.advice(),
            "notes": est.notes,
        }


def make(setup, arch: memory.Architecture, target: Target, auto: bool = False) -> Plan:
    run = run_shape(setup)
    multiple = layout_multiple(setup)
    longest = None
    if auto:
        longest = memory.longest_length(arch, run, target.gpu_memory_gib, target.host_memory_gib, multiple)
        run = replace(run, max_length=longest or multiple)
    return Plan(memory.estimate(arch, run), run, target, run.max_length, longest, multiple)


def describe(plan: Plan) -> str:
    t = plan.target
    lines = [f"Target: {t.nodes} node(s) x {t.gpus_per_node} GPU(s) of {t.gpu_memory_gib:g} GiB, host memory "
             + (f"{t.host_memory_gib:g} GiB per node" if t.host_memory_gib is not None else "unknown (not judged)")]
    if plan.longest is not None:
        lines.append(f"Longest global max_length that fits: {plan.longest:,} tokens (a multiple of {plan.multiple}); "
                     "the table is for that length.")
    lines.append(memory.format_table(plan.estimate, t.gpu_memory_gib, t.host_memory_gib))
    lines.append("Predicted by the memory model (launch/memory.py), not measured; `--bench` on a run measures it.")
    return "\n".join(lines)


# ---- the command -------------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m launch plan", description=(
        "Plan a recipe for a target machine: mesh, per-rank sequence length, memory per GPU and per node, verdict. "
        "Exit status 0 fits, 1 does not fit, 2 invalid input."))
    p.add_argument("recipe")
    p.add_argument("--gpus", type=int, help="GPUs per node (default: the recipe's process count / --nodes)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpu-memory", type=float, default=GPU_MEMORY_GIB, metavar="GIB",
                   help=f"memory per GPU in GiB as torch reports it (default {GPU_MEMORY_GIB}: an 80 GB H100/A100)")
    p.add_argument("--host-memory", type=float, metavar="GIB", help="host memory per node in GiB (default: unknown)")
    p.add_argument("--max-length", metavar="L|auto", help="plan this global sequence length, or find the longest")
    p.add_argument("--model", metavar="NAME_OR_DIR", help="a hub id or a folder with the model's config.json")
    for dim in ("dp-replicate", "dp-shard", "cp", "sp"):
        p.add_argument(f"--{dim}-size", type=int)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv: list[str]) -> int:
    from launch.__main__ import split_extra
    from launch.resolve import Options, resolve

    own, extra = split_extra(argv)
    ns = parser().parse_args(own)
    auto = ns.max_length == "auto"
    if ns.max_length and not auto:
        try:
            extra = [*extra, "--max_length", str(int(ns.max_length))]
        except ValueError:
            raise LaunchError(f"--max-length {ns.max_length}: give a number of tokens or `auto`.") from None
    if ns.model:
        extra = [*extra, "--model_name_or_path", ns.model]
    if (ns.gpus is not None and ns.gpus < 1) or ns.nodes < 1 or ns.gpu_memory <= 0 or (
            ns.host_memory is not None and ns.host_memory <= 0):
        raise LaunchError("--gpus, --nodes, --gpu-memory and --host-memory must be positive.")
    mesh = {k: v for k, v in (("dp_replicate", ns.dp_replicate_size), ("dp_shard", ns.dp_shard_size),
                              ("cp", ns.cp_size), ("sp", ns.sp_size)) if v is not None}
    options = Options(recipe=ns.recipe, mesh=mesh, extra=extra, num_machines=ns.nodes if ns.nodes > 1 else None,
                      num_processes=ns.gpus * ns.nodes if ns.gpus else None)
    setup = resolve(options, progress=lambda *_: None)
    gpus_per_node = ns.gpus or setup.plan.processes_per_machine
    target = Target(gpus_per_node, ns.nodes, ns.gpu_memory, ns.host_memory)
    model = hub.read_model_config(setup.training.get("model_name_or_path"))
    plan = make(setup, architecture(model, setup.training.get("model_name_or_path")), target, auto=auto)
    if ns.json:
        print(json.dumps(plan.as_json(), indent=2))
    else:
        print(setup.plan.describe())
        print(describe(plan))
    return 0 if plan.fits else 1

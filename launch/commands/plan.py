"""`python -m launch plan RECIPE`: will the recipe fit a target machine, and how long can its sequences be?

Plans for a *target* machine (GPUs per node, nodes, GPU and host memory), not this one: it runs on a laptop without
GPUs, resolves the run as a real run would (`launch.run.resolve`) and asks `launch.memory.plan` for its memory.

Exit status: 0 fits, 1 does not fit, 2 invalid input (or the model's config.json cannot be read).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

from launch.speed import fastest
from launch.commands import command
from launch.errors import LaunchError
from launch.facts.hub import model_problem
from launch.memory.plan import GPU_MEMORY_GIB, Target, describe, plan_memory, trace_plan
from launch.config.options import Options, Parser, add_options, split_extra, values_from
from launch.run.resolve import resolve

# the run's own options that a plan takes too (launch.config.options declares them)
RUN_OPTIONS = ("recipe", "model", "mesh")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m launch plan", description=(
        "Plan a recipe for a target machine: mesh, per-rank sequence length, memory per GPU and per node, verdict. "
        "Exit status 0 fits, 1 does not fit, 2 invalid input."))
    add_options(p, ("recipe",))
    p.add_argument("--gpus", type=int, help="GPUs per node (default: the recipe's process count / --nodes)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpu-memory", type=float, default=GPU_MEMORY_GIB, metavar="GIB",
                   help=f"memory per GPU in GiB as torch reports it (default {GPU_MEMORY_GIB}: an 80 GB H100/A100)")
    p.add_argument("--host-memory", type=float, metavar="GIB", help="host memory per node in GiB (default: unknown)")
    p.add_argument("--max-length", metavar="L|auto", help="plan this global sequence length, or find the longest")
    add_options(p, ("model", "mesh", "fastest"))  # a plan reads only the model's config.json
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", action="store_true",
                   help="also trace one training step of the real model under fake tensors (CPU, no memory used; "
                        "about a minute for an 8B model) and print its peak beside the plan's (docs/planning.md)")
    return p


@command("plan", "will RECIPE fit a target machine, and how long can its sequences be (no GPU needed)",
         reads_first=True)
def main(argv: list[str]) -> int:
    own, extra = split_extra(argv)
    ns = parser().parse_args(own)
    auto = ns.max_length == "auto"
    if ns.max_length and not auto:
        try:
            length = int(ns.max_length)
        except ValueError:
            raise LaunchError(f"--max-length {ns.max_length}: give a number of tokens or `auto`.") from None
        if length < 1:  # the run refuses it too (rules.numbers_positive); 0 used to be planned at the config's length
            raise LaunchError(f"--max-length {ns.max_length}: give a positive number of tokens, or `auto`.")
        extra = [*extra, "--max_length", str(length)]
    memories = [ns.gpu_memory] + ([ns.host_memory] if ns.host_memory is not None else [])
    # `not 0 < m < inf` also refuses NaN, which every comparison would let through
    if (ns.gpus is not None and ns.gpus < 1) or ns.nodes < 1 or any(not 0 < m < math.inf for m in memories):
        raise LaunchError(f"--gpus, --nodes, --gpu-memory and --host-memory must be positive finite numbers (given: "
                          f"--gpus {ns.gpus}, --nodes {ns.nodes}, --gpu-memory {ns.gpu_memory:g}, --host-memory "
                          f"{ns.host_memory if ns.host_memory is None else format(ns.host_memory, 'g')}).")
    options = Options(**values_from(ns, RUN_OPTIONS), extra=extra,
                      num_machines=ns.nodes if ns.nodes > 1 else None,
                      num_processes=ns.gpus * ns.nodes if ns.gpus else None)
    setup = resolve(options, progress=lambda *_: None)
    target = Target(ns.gpus or setup.layout.processes_per_machine, ns.nodes, ns.gpu_memory, ns.host_memory)
    # what the run's preflight refuses in the model's config (a plan reads no weights: as a synthetic run)
    if problem := model_problem(setup.training.get("model_name_or_path"), synthetic=True):
        raise LaunchError(problem)
    plan = plan_memory(setup, target, auto=auto)
    if auto and not plan.longest and not ns.json:  # (--json: "fits": false, "max_length": 0)
        print(f"Nothing fits: even {plan.multiple:,} tokens (the shortest length this layout takes) need more than "
              f"{ns.gpu_memory:g} GiB per GPU" + (f" or {ns.host_memory:g} GiB of host memory per node"
                                                  if ns.host_memory is not None else "") + ". Use more GPUs or "
              "nodes, a larger --gpu-memory, or a recipe that shards more (the table is for that shortest length):")
        print(describe(dataclasses.replace(plan, longest=None)))  # not "the longest length that fits: 0 tokens"
        return 1
    traced = trace_plan(plan, setup) if ns.trace else None
    # --fastest: the speed settings searched on the target (a GPU machine set up from the image's lock)
    found = fastest.search(setup, plan, liger_installed=fastest.liger_in_image_lock()) if ns.fastest else None
    if ns.json:
        print(json.dumps({**plan.as_json(), **({"trace": traced[1]} if traced else {}),
                          **(found.as_json() if found else {})}, indent=2))
        return 0 if plan.fits and (plan.longest or not auto) else 1
    print(plan.layout.describe())  # the run's layout at the planned length (with auto: the length found)
    print(plan.run.precision.describe())  # what the bytes per parameter come from (launch.config.precision)
    print(describe(plan))
    if traced:
        print(traced[0])
    if found:
        print(fastest.describe(found))
    return 0 if plan.fits else 1

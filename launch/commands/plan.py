"""`python -m launch plan RECIPE`: will the recipe fit a target machine, and how long can its sequences be?

Plans for a *target* machine (GPUs per node, nodes, GPU and host memory), not this one: it runs on a laptop without
GPUs, resolves the run as a real run would (`launch.resolve`) and asks `launch.memory_plan` for its memory.

Exit status: 0 fits, 1 does not fit, 2 invalid input (or the model's config.json cannot be read).
"""

from __future__ import annotations

import argparse
import json

from launch.commands import command
from launch.errors import LaunchError
from launch.memory_plan import GPU_MEMORY_GIB, Target, describe, plan_memory
from launch.options import Options, Parser, add_options, split_extra, values_from
from launch.resolve import resolve

RUN_OPTIONS = ("recipe", "mesh")  # the run's own options that a plan takes too (launch.options declares them)


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
    p.add_argument("--model", metavar="NAME_OR_DIR", help="a hub id or a folder with the model's config.json")
    add_options(p, ("mesh",))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


@command("plan", "will RECIPE fit a target machine, and how long can its sequences be (no GPU needed)")
def main(argv: list[str]) -> int:
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
    options = Options(**values_from(ns, RUN_OPTIONS), extra=extra,
                      num_machines=ns.nodes if ns.nodes > 1 else None,
                      num_processes=ns.gpus * ns.nodes if ns.gpus else None)
    setup = resolve(options, progress=lambda *_: None)
    target = Target(ns.gpus or setup.layout.processes_per_machine, ns.nodes, ns.gpu_memory, ns.host_memory)
    plan = plan_memory(setup, target, auto=auto)
    if ns.json:
        print(json.dumps(plan.as_json(), indent=2))
    else:
        print(plan.layout.describe())  # the run's layout at the planned length (with auto: the length found)
        print(describe(plan))
    return 0 if plan.fits else 1

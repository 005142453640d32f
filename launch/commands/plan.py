"""`python -m launch plan RECIPE`: will the recipe fit a target machine, and how long can its sequences be?

Plans for a *target* machine (GPUs per node, nodes, GPU and host memory), not this one: it runs on a laptop without
GPUs, resolves the run as a real run would (`launch.run.resolve`) and asks `launch.memory.plan` for its memory.

Before planning it refuses (exit 2) what the run itself would refuse on the target: a mesh the target's GPUs cannot
hold (`launch.config.layout.processes_problem`, the run's own check) and settings the run's rules refuse
(`PLANNED_RULES`: every rule about the run's settings, not about the machine it starts on).

Exit status: 0 fits (with `--fastest`: the fastest search found a setting that fits, which a run with `--fastest`
would apply), 1 does not fit, 2 invalid input (or the model's config.json cannot be read).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

from launch.speed import communication, error_band, fastest, training_time
from launch.speed import model as throughput_model
from launch.checks import rules
from launch.commands import command
from launch.config.layout import Layout, processes_problem
from launch.errors import LaunchError
from launch.facts.hub import model_problem
from launch.facts import dataset, gpus
from launch.memory.plan import DEFAULT_GPU, GPU_MEMORY_GIB, Target, describe, plan_memory, trace_plan
from launch.config.options import Options, Parser, add_options, split_extra, values_from
from launch.run.resolve import resolve

# the run's own options that a plan takes too (launch.config.options declares them)
RUN_OPTIONS = ("recipe", "model", "mesh")
GPU_NAMES = tuple(gpu.name for gpu in gpus.GPUS)
# The run's rules a plan does not check: where and how the processes start (the rendezvous of a multi-node launch),
# which a plan, made for a target machine, does not know. Every other rule about the run (not `machine=True`) is
# checked before planning: a plan of a run the preflight refuses would answer for a run that cannot start.
NOT_PLANNED = (rules.rendezvous_port, rules.multinode_rendezvous)


def planned_rule(r: rules.Rule) -> bool:
    return not r.machine and r.fn not in NOT_PLANNED


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m launch plan", description=(
        "Plan a recipe for a target machine: mesh, per-rank sequence length, memory per GPU and per node, verdict. "
        "Exit status 0 fits, 1 does not fit, 2 invalid input."))
    add_options(p, ("recipe",))
    p.add_argument("--gpus", type=int, help="GPUs per node (default: the recipe's process count / --nodes)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpu", metavar="NAME",
                   help=f"the target GPU model, a row of launch/facts/gpus.py (case-insensitive: "
                        f"{', '.join(GPU_NAMES)}): its memory and its peak and rates for the throughput model "
                        f"(default {DEFAULT_GPU.name})")
    p.add_argument("--gpu-memory", type=float, metavar="GIB",
                   help=f"memory per GPU in GiB as torch reports it (default: the --gpu's; {GPU_MEMORY_GIB} for an "
                        f"{DEFAULT_GPU.name})")
    p.add_argument("--host-memory", type=float, metavar="GIB", help="host memory per node in GiB (default: unknown)")
    p.add_argument("--max-length", metavar="L|auto", help="plan this global sequence length, or find the longest")
    add_options(p, ("model", "mesh", "fastest"))  # a plan reads only the model's config.json
    p.add_argument("--network-gbps", type=float, metavar="GBPS", default=communication.DEFAULT_NETWORK_GBPS,
                   help=f"the network between nodes, Gb/s per GPU, for the communication the predicted step waits "
                        f"for (default {communication.DEFAULT_NETWORK_GBPS:g}: one 400G NIC per GPU)")
    p.add_argument("--tokens", type=float, metavar="N",
                   help="also the time, GPU-hours (and with --gpu-hour-cost the money) to train N tokens at the "
                        "predicted speed, with the throughput model's error band")
    p.add_argument("--epochs", type=float, metavar="E",
                   help="as --tokens, for E passes over the dataset: needs --dataset-tokens (a plan reads no data)")
    p.add_argument("--dataset-tokens", type=float, metavar="N",
                   help="the dataset's tokens per epoch, for --epochs (e.g. num_tokens in run_summary.json of a run "
                        "over one epoch)")
    p.add_argument("--gpu-hour-cost", type=float, metavar="USD", help="the price of one GPU-hour, for the money")
    p.add_argument("--target-hours", type=float, metavar="H",
                   help="the fewest GPUs that train --tokens / --epochs within H hours (data-parallel recipes)")
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
    try:  # refused before planning: NaN, infinite or non-positive
        communication.check_network_gbps(ns.network_gbps)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    wants_time = ns.tokens is not None or ns.epochs is not None
    if wants_time:  # refused before planning: --tokens, --epochs x --dataset-tokens, --gpu-hour-cost, --target-hours
        training_time.check(ns.tokens, ns.epochs, ns.dataset_tokens, ns.gpu_hour_cost, ns.target_hours)
    elif given := [f for f in ("--dataset-tokens", "--gpu-hour-cost", "--target-hours")
                   if getattr(ns, f[2:].replace("-", "_")) is not None]:
        raise LaunchError(f"{', '.join(given)}: give --tokens N or --epochs E (with --dataset-tokens) too.")
    try:  # refused before planning: a misspelt GPU would otherwise plan an H100
        gpu = gpus.lookup(ns.gpu) if ns.gpu else DEFAULT_GPU
    except ValueError as e:
        raise LaunchError(str(e)) from None
    if ns.gpu_memory is None:  # --gpu-memory overrides the GPU's own
        ns.gpu_memory = gpu.memory_gib
    memories = [ns.gpu_memory] + ([ns.host_memory] if ns.host_memory is not None else [])
    # `not 0 < m < inf` also refuses NaN, which every comparison would let through
    if (ns.gpus is not None and ns.gpus < 1) or ns.nodes < 1 or any(not 0 < m < math.inf for m in memories):
        raise LaunchError(f"--gpus, --nodes, --gpu-memory and --host-memory must be positive finite numbers (given: "
                          f"--gpus {ns.gpus}, --nodes {ns.nodes}, --gpu-memory {ns.gpu_memory:g}, --host-memory "
                          f"{ns.host_memory if ns.host_memory is None else format(ns.host_memory, 'g')}).")
    # --gpus: the target's machines are --nodes of them (1 unless given), as `--num-processes --num-machines` for a run
    options = Options(**values_from(ns, RUN_OPTIONS), extra=extra,
                      num_machines=ns.nodes if ns.nodes > 1 or ns.gpus else None,
                      num_processes=ns.gpus * ns.nodes if ns.gpus else None)
    setup = resolve(options, progress=lambda *_: None)
    if found := processes_problem(setup.layout, setup.accelerate):
        raise LaunchError(layout_refused(setup, found, ns))
    # the run's rules about its settings (the model's own are skipped: the planner reads its config.json below)
    if problems := rules.check(setup, rules.Facts(), only=planned_rule).problems:
        raise LaunchError("A run of this plan would be refused before it starts, so nothing is planned:\n\n"
                          + "\n\n".join(problems))
    target = Target(ns.gpus or setup.layout.processes_per_machine, ns.nodes, ns.gpu_memory, ns.host_memory, gpu)
    # what the run's preflight refuses in the model's config (a plan reads no weights: as a synthetic run)
    if problem := model_problem(setup.training.get("model_name_or_path"), synthetic=True):
        raise LaunchError(problem)
    # the dataset's token lengths when it is reachable offline (measured once, cached): the row length the batches
    # peak at and their real-token share; else the plan's rows are full max_length ones
    data = dataset.profile(setup.training)
    measured = data if isinstance(data, dataset.Profile) else None
    plan = plan_memory(setup, target, auto=auto, data=measured)
    if auto and not plan.longest and not ns.json:  # (--json: "fits": false, "max_length": 0)
        print(f"Nothing fits: even {plan.multiple:,} tokens (the shortest length this layout takes) need more than "
              f"{ns.gpu_memory:g} GiB per GPU" + (f" or {ns.host_memory:g} GiB of host memory per node"
                                                  if ns.host_memory is not None else "") + ". Use more GPUs or "
              "nodes, a larger --gpu-memory, or a recipe that shards more (the table is for that shortest length):")
        print(describe(dataclasses.replace(plan, longest=None)))  # not "the longest length that fits: 0 tokens"
        return 1
    traced = trace_plan(plan, setup) if ns.trace else None
    # --fastest: the speed settings searched on the target (a GPU machine set up from the image's lock)
    search = fastest.search(setup, plan, liger_installed=fastest.liger_in_image_lock(),
                            network_gbps=ns.network_gbps) if ns.fastest else None
    # the recipe's own settings on the target: compute, the communication it waits for, the step
    cost = speed(plan, ns.network_gbps)
    band = error_band.calibrated() if cost or search else None  # stored: the refits take seconds
    when, count = time_to_train(ns, setup, plan, search, band) if wants_time else (None, None)
    # --fastest: the status a run with --fastest would have, which applies the fastest setting that fits
    status = (0 if search.chosen else 1) if search else (0 if plan.fits and (plan.longest or not auto) else 1)
    if ns.json:
        print(json.dumps({**plan.as_json(), "dataset": data.as_json(), **({"trace": traced[1]} if traced else {}),
                          **(speed_json(cost) if cost else {}),
                          **({"error_band": error_band.summary_json(band)} if band else {}),
                          **({"training_time": when.as_json()} if when else {}),
                          **({"target_hours": count.as_json()} if count else {}),
                          **(search.as_json() if search else {})}, indent=2))
        return status
    print(data.describe())
    print(plan.layout.describe())  # the run's layout at the planned length (with auto: the length found)
    print(plan.run.precision.describe())  # what the bytes per parameter come from (launch.config.precision)
    print(describe(plan))
    if traced:
        print(traced[0])
    if cost:
        print(communication.describe(cost.compute_s, cost.communication, plan.run.layout.world_size,
                                     plan.run.layout.num_machines, cost.tokens_per_step_per_gpu))
    if search:
        print(fastest.describe(search))
        if search.chosen and search.chosen.cost.communication:
            chosen = search.chosen.cost
            print(f"Its step: compute {chosen.compute_s:.3f} s + exposed communication "
                  f"{chosen.exposed_communication_s:.3f} s = {chosen.step_s:.3f} s"
                  + (" (communication-bound)" if chosen.communication_bound else "") + ".")
        if search.chosen and not plan.fits:
            print("Exit status 0: the recipe's own settings do not fit, the fastest setting that fits does (a run "
                  "with --fastest applies it).")
        elif not search.chosen and plan.fits:
            print("Exit status 1: the recipe's own settings fit, but only within the launcher's spare; no setting "
                  "--fastest may choose fits (a run with --fastest keeps the recipe's own).")
    if cost:  # (--fastest: its choice's speed is in the table's last line)
        print(f"Predicted: {error_band.format_speed(cost.tokens_per_s_per_gpu, band)} per GPU for the recipe's own "
              "settings (the true speed may lie that far either side: the leave-one-out errors of the measured rows, "
              "launch/speed/error_band.py)")
        if cost.useful_tokens_per_s_per_gpu is not None:
            print(f"  of which non-pad: {cost.useful_tokens_per_s_per_gpu:,.0f} tokens/s per GPU (x "
                  f"{cost.real_token_share:.1%} real tokens per planned row: the dataset's "
                  f"{'packing fill' if measured.packing else 'padding'})")
    if when:
        print(f"Time to train ({'the --fastest choice' if search and search.chosen else 'the recipe'}'s speed): "
              + when.describe())
    if count:
        print(count.describe())
    return status


def time_to_train(ns, setup, plan, search, band):
    """--tokens / --epochs (--gpu-hour-cost, --target-hours): the time and cost to train at the predicted speed (the
    --fastest choice's, else the recipe's own), and the fewest GPUs for a target time (None without
    --target-hours)."""
    chosen = search.chosen.cost if search and search.chosen else speed(plan, ns.network_gbps)
    if chosen is None:
        raise LaunchError("--tokens / --epochs need a predicted speed, which this plan has none of (a CPU run, or no "
                          "length that fits).")
    layout = plan.run.layout
    when = training_time.plan(ns.tokens, epochs=ns.epochs, dataset_tokens=ns.dataset_tokens,
                              tokens_per_s_per_gpu=chosen.tokens_per_s_per_gpu,
                              gpus=layout.processes_per_machine, nodes=layout.num_machines, band=band,
                              gpu_hour_cost=ns.gpu_hour_cost)
    if ns.target_hours is None:
        return when, None
    run = search.chosen.plan.run if search and search.chosen else plan.run

    def per_gpu_speed(per_node: int, nodes: int) -> float | None:
        accelerate = {**setup.accelerate, "num_processes": per_node * nodes, "num_machines": nodes}
        at = Layout.from_configs(accelerate, setup.training)
        if processes_problem(at, accelerate):
            return None
        at = dataclasses.replace(at, per_device_train_batch_size=run.layout.per_device_train_batch_size,
                                 gradient_accumulation_steps=run.layout.gradient_accumulation_steps,
                                 max_length=run.layout.max_length)
        return throughput_model.predict(plan.arch, dataclasses.replace(run, layout=at), gpu=plan.target.gpu,
                                        network_gbps=ns.network_gbps).tokens_per_s_per_gpu

    # whole nodes of the target's GPUs per node, 8 at least (--gpus 1 plans one GPU, not a node of one)
    return when, training_time.gpus_for(ns.target_hours, when.tokens, per_gpu_speed, layout,
                                        gpus_per_node=max(plan.target.gpus_per_node, 8), band=band)


def speed(plan, network_gbps: float):
    """The throughput model's prediction of the planned run on its target (None for a shape it does not know, or a
    length nothing fits at)."""
    if plan.run.device != "gpu" or not plan.run.layout.max_length:
        return None
    try:
        return throughput_model.predict(plan.arch, plan.run, gpu=plan.target.gpu, network_gbps=network_gbps)
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def speed_json(cost) -> dict:
    """`plan --json`'s "communication" (per collective: bytes, time and exposed seconds per step), "step_s"
    (compute, exposed communication, step), "communication_bound" and the predicted tokens/s per GPU."""
    return {"communication": cost.communication.as_json() if cost.communication else [],
            "step_s": cost.step_json(), "communication_bound": cost.communication_bound,
            "predicted_tokens_per_s_per_gpu": round(cost.tokens_per_s_per_gpu, 1),
            **({"predicted_useful_tokens_per_s_per_gpu": round(cost.useful_tokens_per_s_per_gpu, 1)}
               if cost.useful_tokens_per_s_per_gpu is not None else {})}


def layout_refused(setup, found: tuple[str, str], ns) -> str:
    """The one paragraph `plan` refuses a mesh the target's GPUs cannot hold with: the run's own check
    (`processes_problem`) and the sizes that would work, in plan's flags."""
    layout = setup.layout
    what, problem = found
    need = layout.mesh_size if what == "mesh" else layout.world_size
    recipe_machines = int(setup.recipe.accelerate.get("num_machines", 1) or 1)
    nodes_tried = [nodes for nodes in dict.fromkeys((recipe_machines, ns.nodes)) if need % nodes == 0] or [1]
    sizes = [f"--gpus {need // nodes}" + (f" --nodes {nodes}" if nodes > 1 else "") for nodes in nodes_tried]
    if what == "mesh" and (mesh := layout.mesh_for(layout.world_size)):
        sizes.append(" ".join(f"--{name.replace('_', '-')}-size {size}" for name, size in mesh.items())
                     + f" on these {layout.world_size} GPU(s)")
    target = f"{layout.num_machines} node(s) x {layout.processes_per_machine} GPU(s)" if what == "mesh" \
        else f"{layout.world_size} GPU(s) over {layout.num_machines} node(s)"
    return (f"{problem.rstrip('.')}; a run on {target} refuses this layout before it starts (the rule "
            f"processes_fit_layout), so nothing is planned. Sizes that would work: {'; or '.join(sizes)}.")

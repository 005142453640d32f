"""What the user asked for on the command line, shared by every command that runs or plans a recipe: the `Options`
of a run, the run parser (`python -m launch RECIPE ...`, also used by `record` and `bench`), and the split at `--`.

One floor below the commands (`launch.commands`), as TRL's `trl/cli` keeps its shared command context below the
commands that use it.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field

from launch.envvars import optional_int
from launch.errors import LaunchError

MESH_OPTIONS = ("dp_replicate", "dp_shard", "cp", "sp")  # the mesh dimensions a run may override (`--X-size`)


@dataclass
class Options:
    """What the user asked for on the command line."""

    recipe: str
    smoke: bool = False
    cpu: bool = False
    num_processes: int | None = None
    mesh: dict = field(default_factory=dict)  # e.g. {"sp": 4, "dp_shard": 2}
    output_dir: str | None = None
    max_steps: int | None = None
    save_steps: int | None = None
    resume: str | None = None  # "latest" or a checkpoint folder
    overwrite: bool = False  # delete an earlier run's files in the output folder first
    force: bool = False  # start even when the planner predicts that the run does not fit this machine's memory
    bench: bool = False  # measure step time, tokens/s, MFU and memory (launch.bench)
    bench_warmup: int = 2  # steps excluded from the measurement
    bench_steps: int | None = None  # measured steps (the run stops after warm-up + these)
    synthetic: bool = False  # the model's architecture from config.json, random weights and tokens (launch.synthetic)
    model: str | None = None  # --model: model_name_or_path (a folder with config.json, or a hub id)
    loss_sentinel: bool = True  # the first-steps loss sentinel, where the recipe records a band (launch.sentinel)
    record: bool = False  # `record`: the invocation is exactly what the command line says, nothing inherited
    extra: list[str] = field(default_factory=list)  # training arguments after `--`, passed on verbatim
    # Multi-node: total machines, this machine's rank, and the rendezvous address of machine rank 0.
    num_machines: int | None = None
    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    main_process_port_source: str = "--main-process-port"  # or "MASTER_PORT" when the environment gave it
    hang_timeout: float | None = None  # seconds; None: the profile's default; math.inf: the watchdog is off
    rendezvous_timeout: float = 300.0


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a LaunchError: one paragraph naming the option and value, exit status 2, and
    the same path as every other refusal (also when the launcher runs in-process)."""

    def error(self, message):
        raise LaunchError(f"{message}. See `{self.prog} --help`.")


def hang_timeout(value: str) -> float:
    """--hang-timeout: a positive number of seconds, or `off`. 0 and negative values are refused: -1 would make the
    watchdog stop every healthy run at its first heartbeat, and 0 used to mean the default without a word."""
    if value.strip().lower() == "off":
        return math.inf
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds (or `off`)") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value} seconds: give a positive number of seconds, or `off` to turn the "
                                         "hang watchdog off")
    return seconds


def run_parser(prog: str) -> argparse.ArgumentParser:
    p = Parser(prog=prog, description="Validate, plan, run and judge a recipe.")
    p.add_argument("recipe", help="a folder name under recipes/ (see `python -m launch list`) or a path")
    p.add_argument("--smoke", action="store_true", help="tiny offline model and data, few steps, judged against expected metrics")
    p.add_argument("--cpu", action="store_true", help="run the processes on CPU over gloo, in fp32")
    p.add_argument("--num-processes", type=int, help="total processes (GPUs); default: the Accelerate config's")
    for dim in MESH_OPTIONS:
        p.add_argument(f"--{dim.replace('_', '-')}-size", type=int, help=f"override parallelism_config_{dim}_size")
    p.add_argument("--output-dir", help="where checkpoints, trainer_state.json and run_summary.json go")
    p.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    p.add_argument("--save-steps", type=int, help="save a checkpoint every N steps (kept: the last 2)")
    p.add_argument("--resume", nargs="?", const="latest", metavar="CHECKPOINT",
                   help="continue from the newest complete checkpoint in the output folder, or from CHECKPOINT")
    p.add_argument("--overwrite", action="store_true",
                   help="delete an earlier run's files in the output folder (it says which) and start again")
    p.add_argument("--hang-timeout", type=hang_timeout, metavar="SECONDS|off",
                   help="stop the job when no rank made progress for this long (default: 60 for --smoke, 900 "
                        "otherwise; at least 5 x the slowest step seen); `off` turns the watchdog off")
    p.add_argument("--force", action="store_true",
                   help="start even when the planner predicts the run does not fit this machine's GPU or host memory")
    p.add_argument("--bench", action="store_true",
                   help="measure step time, tokens/s per GPU, MFU and peak memory (after warm-up) into run_summary.json")
    p.add_argument("--bench-steps", type=int, metavar="N", help="with --bench: stop after warm-up + N steps")
    p.add_argument("--bench-warmup", type=int, default=2, metavar="N", help="with --bench: steps not measured (2)")
    p.add_argument("--synthetic", action="store_true",
                   help="the model's architecture from its config.json with random weights, random token rows of "
                        "max_length: no weights, tokenizer or dataset needed (throughput and memory)")
    p.add_argument("--model", metavar="DIR_OR_ID", help="model_name_or_path for this run (with --synthetic: a folder "
                   "holding only config.json is enough)")
    p.add_argument("--no-loss-sentinel", dest="loss_sentinel", action="store_false",
                   help="do not stop the run when its first logged losses leave the recipe's recorded band")
    p.add_argument("--dry-run", action="store_true", help="print the command and the effective setup, run nothing")
    m = p.add_argument_group("multi-node (defaults from SLURM_NNODES, SLURM_NODEID, MASTER_ADDR, MASTER_PORT)")
    m.add_argument("--num-machines", type=int, default=optional_int("SLURM_NNODES"))
    m.add_argument("--machine-rank", type=int, default=optional_int("SLURM_NODEID"))
    m.add_argument("--main-process-ip", default=os.environ.get("MASTER_ADDR"))
    m.add_argument("--main-process-port", type=int)
    m.add_argument("--rendezvous-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="machine ranks > 0: how long to wait for machine rank 0 before giving up (300)")
    return p


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    """Our options, and the training arguments after `--` (passed on unchanged)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def mesh_overrides(ns) -> dict:
    return {dim: getattr(ns, f"{dim}_size") for dim in MESH_OPTIONS if getattr(ns, f"{dim}_size", None) is not None}


def options_from(ns, extra) -> Options:
    port, port_source = ns.main_process_port, "--main-process-port"
    if port is None and (port := optional_int("MASTER_PORT")) is not None:
        port_source = "the environment variable MASTER_PORT"
    return Options(recipe=ns.recipe, smoke=ns.smoke, cpu=ns.cpu, num_processes=ns.num_processes, mesh=mesh_overrides(ns),
                   output_dir=ns.output_dir, max_steps=ns.max_steps, save_steps=ns.save_steps, resume=ns.resume,
                   overwrite=ns.overwrite, force=ns.force, bench=ns.bench, bench_steps=ns.bench_steps,
                   bench_warmup=ns.bench_warmup, synthetic=ns.synthetic, model=ns.model,
                   loss_sentinel=ns.loss_sentinel, extra=extra, num_machines=ns.num_machines,
                   machine_rank=ns.machine_rank, main_process_ip=ns.main_process_ip,
                   main_process_port=port, main_process_port_source=port_source, hang_timeout=ns.hang_timeout,
                   rendezvous_timeout=ns.rendezvous_timeout)

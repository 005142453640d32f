"""`python -m launch`: the command-line interface.

    python -m launch list
    python -m launch doctor [RECIPE] [--cpu]
    python -m launch RECIPE [--smoke] [--cpu] [--num-processes N] [--sp-size N] ... [--dry-run] [-- training args]
    python -m launch record RECIPE --smoke [--cpu] [...]     (re-records expected_metrics.json; deliberate)
    python -m launch plan RECIPE [--gpus N] [--nodes M] [--gpu-memory GIB] [--host-memory GIB] [--max-length L|auto] ...
    python -m launch bench RECIPE --max-length auto [run options]  (GPU host: the longest length that trains)
    python -m launch compare RUN_DIR RUN_DIR... [--out FILE.png]
    python -m launch sync-scripts                              (templates/train.py -> every marked recipe copy)
"""

from __future__ import annotations

import argparse
import os
import sys

from launch.recipes import LaunchError

def run_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Validate, plan, run and judge a recipe.")
    p.add_argument("recipe", help="a folder name under recipes/ (see `python -m launch list`) or a path")
    p.add_argument("--smoke", action="store_true", help="tiny offline model and data, few steps, judged against expected metrics")
    p.add_argument("--cpu", action="store_true", help="run the processes on CPU over gloo, in fp32")
    p.add_argument("--num-processes", type=int, help="total processes (GPUs); default: the Accelerate config's")
    p.add_argument("--dp-replicate-size", type=int, help="override parallelism_config_dp_replicate_size")
    p.add_argument("--dp-shard-size", type=int, help="override parallelism_config_dp_shard_size")
    p.add_argument("--cp-size", type=int, help="override parallelism_config_cp_size (context parallelism)")
    p.add_argument("--sp-size", type=int, help="override parallelism_config_sp_size (sequence parallelism)")
    p.add_argument("--output-dir", help="where checkpoints, trainer_state.json and run_summary.json go")
    p.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    p.add_argument("--save-steps", type=int, help="save a checkpoint every N steps (kept: the last 2)")
    p.add_argument("--resume", nargs="?", const="latest", metavar="CHECKPOINT",
                   help="continue from the newest complete checkpoint in the output folder, or from CHECKPOINT")
    p.add_argument("--overwrite", action="store_true",
                   help="delete an earlier run's files in the output folder (it says which) and start again")
    p.add_argument("--hang-timeout", type=float, metavar="SECONDS",
                   help="stop the job when no rank made progress for this long (default: 60 for --smoke, 900 "
                        "otherwise; at least 5 x the slowest step seen)")
    p.add_argument("--force", action="store_true",
                   help="start even when the planner predicts the run does not fit this machine's GPU or host memory")
    p.add_argument("--bench", action="store_true",
                   help="measure step time, tokens/s per GPU, MFU and peak memory (after warm-up) into run_summary.json")
    p.add_argument("--bench-steps", type=int, metavar="N", help="with --bench: stop after warm-up + N steps")
    p.add_argument("--bench-warmup", type=int, default=2, metavar="N", help="with --bench: steps not measured (2)")
    p.add_argument("--dry-run", action="store_true", help="print the command and the effective setup, run nothing")
    m = p.add_argument_group("multi-node (defaults from SLURM_NNODES, SLURM_NODEID, MASTER_ADDR, MASTER_PORT)")
    m.add_argument("--num-machines", type=int, default=_env_int("SLURM_NNODES"))
    m.add_argument("--machine-rank", type=int, default=_env_int("SLURM_NODEID"))
    m.add_argument("--main-process-ip", default=os.environ.get("MASTER_ADDR"))
    m.add_argument("--main-process-port", type=int, default=_env_int("MASTER_PORT"))
    m.add_argument("--rendezvous-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="machine ranks > 0: how long to wait for machine rank 0 before giving up (300)")
    return p


def _env_int(name: str) -> int | None:
    from launch.envvars import optional_int

    return optional_int(name)


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def options_from(ns, extra):
    from launch.resolve import Options

    mesh = {k: v for k, v in (("dp_replicate", ns.dp_replicate_size), ("dp_shard", ns.dp_shard_size),
                              ("cp", ns.cp_size), ("sp", ns.sp_size)) if v is not None}
    return Options(recipe=ns.recipe, smoke=ns.smoke, cpu=ns.cpu, num_processes=ns.num_processes, mesh=mesh,
                   output_dir=ns.output_dir, max_steps=ns.max_steps, save_steps=ns.save_steps, resume=ns.resume,
                   overwrite=ns.overwrite, force=ns.force, bench=ns.bench, bench_steps=ns.bench_steps,
                   bench_warmup=ns.bench_warmup, extra=extra, num_machines=ns.num_machines,
                   machine_rank=ns.machine_rank, main_process_ip=ns.main_process_ip,
                   main_process_port=ns.main_process_port)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "list":
            from launch.listing import print_list

            return print_list()
        if argv and argv[0] == "sync-scripts":
            from launch.docs import sync

            return sync()
        if argv and argv[0] == "plan":
            from launch.planner import main as plan

            return plan(argv[1:])
        if argv and argv[0] == "bench":
            from launch.bench_search import main as bench

            return bench(argv[1:])
        if argv and argv[0] == "compare":
            from launch.compare import main as compare

            return compare(argv[1:])
        if argv and argv[0] == "doctor":
            return cmd_doctor(argv[1:])
        if argv and argv[0] == "record":
            return cmd_run(argv[1:], record=True)
        return cmd_run(argv)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before or after the ranks ran (while they run, supervise forwards it)
        print("\n[launch] interrupted (Ctrl-C)", file=sys.stderr)
        return 130


def cmd_doctor(argv: list[str]) -> int:
    from launch.doctor import run_doctor
    from launch.resolve import Options, resolve

    p = argparse.ArgumentParser(prog="python -m launch doctor", description="Check versions, floors and GPUs.")
    p.add_argument("recipe", nargs="?")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--strict", action="store_true", help="GPU-only packages must be installed too (the image)")
    ns = p.parse_args(argv)
    setup = resolve(Options(recipe=ns.recipe, cpu=ns.cpu, num_processes=ns.num_processes)) if ns.recipe else None
    strict = ns.strict or os.environ.get("LAUNCH_DOCTOR_AT_START") == "1"
    return 1 if run_doctor(setup, strict=strict) else 0


def cmd_run(argv: list[str], record: bool = False) -> int:
    from launch import runner

    own, extra = split_extra(argv)
    prog = "python -m launch record" if record else "python -m launch"
    ns = run_parser(prog).parse_args(own)
    if record and not ns.smoke:
        raise LaunchError("`record` writes the expected metrics of a smoke profile: add --smoke (and --cpu on CPU).")
    if (ns.bench_steps is not None and ns.bench_steps < 1) or ns.bench_warmup < 0:
        raise LaunchError("--bench-steps must be at least 1 and --bench-warmup at least 0.")
    if ns.bench_steps is not None and not ns.bench:
        raise LaunchError("--bench-steps needs --bench.")
    options = options_from(ns, extra)
    options.record = record
    return runner.launch(options, dry_run=ns.dry_run, record=record, hang_timeout=ns.hang_timeout,
                         rendezvous_timeout=ns.rendezvous_timeout)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m launch RECIPE [options] [-- training args]` and `python -m launch record RECIPE --smoke ...`: one
run from start to verdict (`launch.run.runner`); `record` writes its per-step metrics as the expected ones."""

from __future__ import annotations

import dataclasses
import math

from launch.config import profiles
from launch.run import runner
from launch.commands import command, overview
from launch.errors import LaunchError
from launch.config.options import parse_run
from launch.recipe.discovery import find_recipe
from launch.results.expected import profile_entry


def main(argv: list[str], record: bool = False) -> int:
    """The run form, `python -m launch RECIPE ...`: not a registered command, what `launch.__main__` runs when the
    first word names none (its --help lists the commands)."""
    if record:
        options = parse_run(argv, "python -m launch record", record=True)
    else:
        options = parse_run(argv, "python -m launch", epilog=overview())
    if record and not options.smoke:
        raise LaunchError("`record` writes the expected metrics of a smoke profile: add --smoke (and --cpu on CPU).")
    if (options.bench_steps is not None and options.bench_steps < 1) or options.bench_warmup < 0:
        raise LaunchError("--bench-steps must be at least 1 and --bench-warmup at least 0.")
    if options.bench_steps is not None and not options.bench:
        raise LaunchError("--bench-steps needs --bench.")
    check_options(options)
    if record:
        options = recorded_layout(options)
    return runner.launch(options, dry_run=options.dry_run)


def check_options(options) -> None:
    """The run options that are wrong whatever the recipe (each was once accepted, and lost data or time)."""
    if options.resume and options.overwrite:
        # --overwrite deletes the earlier run's checkpoints, the one --resume was about to continue from included
        raise LaunchError("--resume and --overwrite contradict each other: --overwrite deletes the earlier run's "
                          "checkpoints, including the one --resume would continue from. Pass --resume to continue "
                          "the run, or --overwrite (without --resume) to delete it and start again.")
    if options.output_dir is not None and not options.output_dir.strip():
        raise LaunchError("--output-dir is empty: give the folder the run writes to, or leave the option out for "
                          "the default (outputs/RECIPE/PROFILE).")
    if not (math.isfinite(options.rendezvous_timeout) and options.rendezvous_timeout > 0):
        raise LaunchError(f"--rendezvous-timeout {options.rendezvous_timeout:g}: give a positive number of seconds "
                          "(how long machine ranks > 0 wait for machine rank 0).")
    if options.record and options.synthetic:
        raise LaunchError("`record` writes the expected metrics a smoke run is judged against, and a synthetic run "
                          "(random weights and tokens) has none: drop --synthetic.")


def recorded_layout(options):
    """`record` keeps the layout the profile was recorded with (as a smoke run does) unless --num-processes or a
    mesh size is given: a re-record on another layout would silently change what every later smoke run starts."""
    if options.num_processes is not None or options.mesh:
        return options
    recipe = find_recipe(options.recipe, optional=("expected_metrics.json",))
    if not recipe.expected_metrics_path.is_file():
        return options
    recorded = profile_entry(recipe, profiles.profile_name(options.smoke, options.cpu)).get("invocation") or {}
    if not recorded.get("num_processes"):
        return options
    return dataclasses.replace(options, num_processes=recorded["num_processes"], mesh=dict(recorded.get("mesh") or {}))


@command("record", "run RECIPE's smoke profile and write its per-step metrics as the expected ones (deliberate)",
         reads_first=True)
def record_main(argv: list[str]) -> int:
    return main(argv, record=True)

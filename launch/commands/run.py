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
    given = dict(profiles.argument_pairs(options.extra))
    if options.synthetic and "save_final" in given and profiles.flag_on(given["save_final"]):
        # train.py never saves a synthetic run's random weights, whatever save_final says
        raise LaunchError("`-- --save_final true` with --synthetic would save nothing: a synthetic run trains random "
                          "weights, which train.py never saves as final weights. Drop `--save_final true` (the run "
                          "measures throughput and memory), or drop --synthetic to train the real model and save "
                          "it.")
    if options.bench and options.bench_steps is None:
        steps, source = _planned_steps(options, given)
        if steps is not None and 0 < steps <= options.bench_warmup:
            raise LaunchError(
                f"--bench measures the steps after its {options.bench_warmup} warm-up step(s) (--bench-warmup), and "
                f"this run takes {steps} ({source}): it would measure 0 steps. Give --bench-steps N (the run then "
                f"takes {options.bench_warmup} + N steps and measures N), or a --bench-warmup below {steps}.")


def _planned_steps(options, given: dict) -> tuple[int | None, str]:
    """(the run's max_steps as far as the command line and the recipe say it before anything is resolved, where it
    comes from); (None, "") when the run counts epochs instead (max_steps unset or -1)."""
    if options.max_steps is not None:
        return options.max_steps, f"--max-steps {options.max_steps}"
    if "max_steps" in given and profiles.argument_values(given["max_steps"]):
        try:
            steps = int(profiles.argument_values(given["max_steps"])[-1])
        except ValueError:
            return None, ""  # TRL's parser names the bad value
        return steps, f"`--max_steps {steps}` after `--`"
    if options.smoke:
        return profiles.SMOKE_TRAINING["max_steps"], "the smoke profile's max_steps"
    config_steps = find_recipe(options.recipe).config.get("max_steps")
    if isinstance(config_steps, int) and not isinstance(config_steps, bool):
        return config_steps, "max_steps in config.yaml"
    return None, ""


# Training arguments after `--` that change the batch or the sequences a smoke run trains on. `record` refuses one
# that differs from what the recorded profile runs with: every later smoke run inherits what `record` records.
BATCH_ARGUMENTS = ("per_device_train_batch_size", "gradient_accumulation_steps", "max_length", "max_steps",
                   "num_train_epochs", "packing", "padding_free", "pad_to_multiple_of")


def recorded_layout(options):
    """`record` runs the layout the profile was recorded with, as a smoke run does: its process count and mesh
    unless --num-processes or a mesh size is given (a deliberate new layout, which every later smoke run then
    inherits), and its training arguments after `--`, the run's own replacing those of the same key. Refused before
    start (`record_changes`): what a plain smoke run would not repeat (it would then never be judged) and, when the
    profile was recorded already, another batch."""
    recipe = find_recipe(options.recipe, optional=("expected_metrics.json",))
    entry = profile_entry(recipe, profiles.profile_name(options.smoke, options.cpu)) \
        if recipe.expected_metrics_path.is_file() else {}
    recorded = entry.get("invocation") or {}
    record_changes(options, recipe, recorded, entry_exists=bool(entry))
    own = {key for key, _ in profiles.argument_pairs(options.extra)}
    kept = [t for key, tokens in profiles.argument_pairs(list(recorded.get("training_args") or [])) if key not in own
            for t in tokens]
    options = dataclasses.replace(options, extra=kept + list(options.extra))
    if options.num_processes is not None or options.mesh or not recorded.get("num_processes"):
        return options
    return dataclasses.replace(options, num_processes=recorded["num_processes"], mesh=dict(recorded.get("mesh") or {}))


def record_changes(options, recipe, recorded: dict, entry_exists: bool) -> None:
    """Refuse a `record` that would write expected metrics the plain smoke run (`python -m launch RECIPE --smoke
    [--cpu]`, CI's and the docs') is then never judged against, naming each option: what enters the recorded
    invocation but is never inherited by a smoke run (launch.run.resolve: --fastest, --max-steps, --bench-steps,
    --model, several machines), and a batch argument after `--` other than the recorded profile's."""
    found = []
    if options.fastest:
        found.append("--fastest (the speed settings it chooses would be recorded with the layout, and a smoke run, "
                     "which does not apply them, would never be judged again)")
    if options.max_steps is not None:
        found.append(f"--max-steps {options.max_steps} (a smoke run takes the profile's "
                     f"{profiles.SMOKE_TRAINING['max_steps']} steps and would never be judged against "
                     f"{options.max_steps})")
    if options.bench and options.bench_steps is not None:
        found.append(f"--bench-steps {options.bench_steps} (the run would stop after {options.bench_warmup} + "
                     f"{options.bench_steps} steps, which a smoke run does not repeat)")
    if options.model:
        found.append(f"--model {options.model} (a smoke run trains the smoke model)")
    if options.num_machines is not None and options.num_machines > 1:
        found.append(f"--num-machines {options.num_machines} (a smoke run is one machine's)")
    if entry_exists:
        recorded_args = profiles.argument_pairs(list(recorded.get("training_args") or []))
        before = {key: profiles.argument_values(tokens) for key, tokens in recorded_args}
        for key, tokens in profiles.argument_pairs(options.extra):
            if key not in BATCH_ARGUMENTS:
                continue
            if key in before:
                old, where = before[key], "the recorded training arguments"
            elif key in profiles.SMOKE_TRAINING:
                old, where = [profiles.SMOKE_TRAINING[key]], "the smoke profile"
            elif recipe.config.get(key) is not None:
                old, where = [recipe.config[key]], "config.yaml"
            else:
                old, where = [], "TRL's default"
            if not old or not profiles.same_values(profiles.argument_values(tokens) or ["true"], old):
                shown = f"{' '.join(map(profiles.shown, old))}, from {where}" if old else where
                found.append(f"`{' '.join(tokens)}` after `--` (it changes the batch every later smoke run "
                             f"inherits; recorded: {shown})")
    if not found:
        return
    plain = f"python -m launch {options.recipe} --smoke" + (" --cpu" if options.cpu else "")
    args = " ".join(recorded.get("training_args") or [])
    layout = (f"{recorded['num_processes']} process(es), mesh {recorded.get('mesh') or 'as in the config'}, "
              + (f"training arguments `{args}` after `--`" if args else "no training arguments after `--`")
              if recorded.get("num_processes") else "the smoke profile's")
    raise LaunchError(
        f"`record` writes the expected metrics that every later `{plain}` (the smoke run CI and the docs use) is "
        f"judged against, so it records that run's layout ({layout}), and this command changes it: "
        + "; ".join(found) + f". Drop {'it' if len(found) == 1 else 'them'}: `python -m launch record "
        f"{options.recipe} --smoke{' --cpu' if options.cpu else ''}` "
        f"{'re-records the recorded layout' if recorded else 'records the smoke profile'}. A deliberate new "
        "process count or mesh is given with --num-processes and the mesh sizes (--dp-shard-size, --sp-size, "
        "--cp-size ...): later smoke runs inherit them.")


@command("record", "run RECIPE's smoke profile and write its per-step metrics as the expected ones (deliberate)",
         reads_first=True)
def record_main(argv: list[str]) -> int:
    return main(argv, record=True)

"""Resolving a run: the recipe, its two configs, the profile and the command-line overrides, merged into one
`Setup` that the rules validate, the plan describes and the command builder turns into `accelerate launch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launch import REPO_ROOT, checkpoints, profiles
from launch.plan import MESH_KEYS, Plan, make_plan, parse_cli_overrides
from launch.recipes import LaunchError, Recipe, find_recipe


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
    extra: list[str] = field(default_factory=list)  # training arguments after `--`
    # Multi-node: total machines, this machine's rank, and the rendezvous address of machine rank 0.
    num_machines: int | None = None
    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None


@dataclass
class Setup:
    recipe: Recipe
    options: Options
    profile: str
    invocation: dict  # the layout-defining choices, matched against recorded expected metrics
    accelerate: dict  # the Accelerate config with overrides applied
    accelerate_overrides: dict  # {accelerate launch flag name: value}
    training: dict  # effective training values: config.yaml < profile < command line
    training_overrides: dict  # what is passed after `--config`
    plan: Plan
    output_dir: Path


def _default_invocation(recipe: Recipe, profile: str) -> dict:
    recorded = recipe.expected_metrics().get("profiles", {}).get(profile) or {}
    return dict(recorded.get("invocation") or {})


def resolve(options: Options, progress=print) -> Setup:
    recipe = find_recipe(options.recipe)
    profile = profiles.profile_name(options.smoke, options.cpu)
    accelerate = dict(recipe.accelerate)
    config = dict(recipe.config)

    # A smoke run without explicit layout choices reuses the layout its expected metrics were recorded with.
    invocation = {}
    if options.smoke and options.num_processes is None and not options.mesh and not options.extra:
        invocation = _default_invocation(recipe, profile)
    num_processes = options.num_processes or invocation.get("num_processes")
    mesh = dict(options.mesh or invocation.get("mesh") or {})
    extra = list(options.extra or invocation.get("training_args") or [])
    invocation = {"num_processes": num_processes or int(accelerate.get("num_processes", 1)), "mesh": mesh,
                  "training_args": extra}

    accel_overrides: dict = {}
    if num_processes:
        accel_overrides["num_processes"] = int(num_processes)
    for key in ("num_machines", "machine_rank", "main_process_ip", "main_process_port"):
        if getattr(options, key) is not None:
            accel_overrides[key] = getattr(options, key)
    if options.num_machines and options.num_machines > 1:
        invocation["num_machines"] = options.num_machines
    if options.max_steps is not None:  # a shorter or longer run is not judged against the recorded steps
        invocation["max_steps"] = options.max_steps
    for name, size in mesh.items():
        accel_overrides[MESH_KEYS[name]] = int(size)
    if options.cpu:
        accel_overrides.update(profiles.cpu_accelerate(accelerate))
    for key, value in accel_overrides.items():
        if key.startswith("parallelism_config_"):
            accelerate["parallelism_config"] = {**(accelerate.get("parallelism_config") or {}), key: value}
        else:
            accelerate[key] = value

    try:
        cli = parse_cli_overrides(extra)
    except ValueError as e:
        raise LaunchError(f"Training arguments after `--`: {e}.") from None
    training_overrides = profiles.training_overrides(config, options.smoke, options.cpu, progress=progress)
    if options.max_steps is not None:
        training_overrides["max_steps"] = options.max_steps
    if options.save_steps:
        training_overrides.update(save_strategy="steps", save_steps=options.save_steps, save_total_limit=2)
    output_dir = Path(options.output_dir or cli.get("output_dir") or _default_output_dir(recipe, config, profile))
    training_overrides["output_dir"] = str(output_dir)
    if options.resume:
        training_overrides["resume_from_checkpoint"] = str(checkpoints.resolve_resume(output_dir, options.resume))
    training_overrides.update(cli)
    training = {**config, **training_overrides}

    return Setup(
        recipe=recipe,
        options=options,
        profile=profile,
        invocation=invocation,
        accelerate=accelerate,
        accelerate_overrides=accel_overrides,
        training=training,
        training_overrides=training_overrides,
        plan=make_plan(accelerate, training),
        output_dir=output_dir,
    )


def _default_output_dir(recipe: Recipe, config: dict, profile: str) -> Path:
    if profile == "full-gpu" and config.get("output_dir"):
        return Path(config["output_dir"])
    return REPO_ROOT / "outputs" / recipe.name / profile

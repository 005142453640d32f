"""Resolving a run: the recipe, its two configs, the profile and the command-line overrides, merged into one
`Setup` that the rules validate, the plan describes and the command builder turns into `accelerate launch`.

Nothing here starts a process or writes a file. The training arguments are merged and typed by the recipe's own
TrlParser (`launch.training_args`) from the same argv the ranks will get, so the plan shows the values the run uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launch import REPO_ROOT, accelerate_config, checkpoints, outdir, profiles, tracking
from launch.constants import MESH_KEYS
from launch.errors import LaunchError
from launch.expected import read_expected
from launch.layout import Layout
from launch.options import Options
from launch.recipes import Recipe, find_recipe
from launch.training_args import AFTER_DASHES, Checkpointing, Layer, checkpointing, explicit_keys, merge


@dataclass
class Setup:
    recipe: Recipe
    options: Options
    profile: str
    invocation: dict  # the layout-defining choices, matched against recorded expected metrics
    accelerate: dict  # the Accelerate config with overrides applied
    accelerate_overrides: dict  # {accelerate launch flag name: value}
    training: dict  # every training field as the ranks will parse it: config.yaml < profile < overrides
    layers: list[Layer]  # the argv after `--config config.yaml`, by source
    layout: Layout  # strategy, ZeRO stage, mesh, batch: built once here, read by the rules, the plan and the memory model
    checkpointing: Checkpointing  # activation checkpointing as the ranks get it (its two names resolved once)
    explicit: dict  # training key -> where it was given (config.yaml or a layer); the rest are defaults
    output_dir: Path
    notes: list[str] = field(default_factory=list)  # said before starting

    @property
    def training_argv(self) -> list[str]:
        return [token for layer in self.layers for token in layer.argv]


def _check_numbers(options: Options) -> None:
    """Sizes that would break the plan itself (a negative mesh size gives a negative per-rank length)."""
    bad = [f"--{k.replace('_', '-')}-size {v}" for k, v in (options.mesh or {}).items() if v is not None and v < 1]
    if options.num_processes is not None and options.num_processes < 1:
        bad.insert(0, f"--num-processes {options.num_processes}")
    if options.num_machines is not None and options.num_machines < 1:
        bad.append(f"--num-machines {options.num_machines}")
    if bad:
        raise LaunchError(f"{', '.join(bad)}: process counts and mesh sizes must be at least 1.")


def resolve(options: Options, progress=print) -> Setup:
    _check_numbers(options)
    # `record` writes expected_metrics.json: a recipe without one yet is what it is for
    recipe = find_recipe(options.recipe, optional=("expected_metrics.json",) if options.record else ())
    notes: list[str] = []
    if options.record and not recipe.expected_metrics_path.is_file():
        notes.append(f"{recipe.expected_metrics_path} does not exist yet: this run's metrics will create it")
    profile = profiles.profile_name(options.smoke, options.cpu)
    # The recipe's own Accelerate config is checked as written, even where this run overrides a value of it.
    accelerate_config.check(recipe.accelerate_config_path, recipe.accelerate)
    accelerate = dict(recipe.accelerate)
    config = dict(recipe.config)

    # A smoke run keeps the layout its expected metrics were recorded with, unless the user changes the layout.
    recorded = dict(read_expected(recipe.expected_metrics_path).get("profiles", {}).get(profile, {}).get("invocation")
                    or {}) if options.smoke and not options.record else {}
    # A layout given on the command line that equals the recorded one (e.g. the recipe's own --num-processes) is
    # not a change: the run is judged.
    layout_given = (options.num_processes is not None and options.num_processes != recorded.get("num_processes")) \
        or (bool(options.mesh) and {**dict(recorded.get("mesh") or {}), **options.mesh} != dict(recorded.get("mesh") or {}))
    if layout_given or not recorded:
        num_processes, mesh = options.num_processes, dict(options.mesh or {})
    else:
        num_processes, mesh = recorded.get("num_processes"), dict(recorded.get("mesh") or {})
    recorded_args = list(recorded.get("training_args") or [])
    invocation = {"num_processes": num_processes or int(accelerate.get("num_processes", 1)), "mesh": mesh,
                  "training_args": recorded_args + _without_output_dir(options.extra)}
    if layout_given and recorded:
        notes.append(f"smoke layout changed to {invocation['num_processes']} process(es), mesh {mesh or 'as in the config'} "
                     f"(recorded: {recorded.get('num_processes')} process(es), mesh {recorded.get('mesh') or 'as in the config'}); "
                     "this run is not judged against the expected metrics")

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
    if options.bench and options.bench_steps is not None:
        invocation["max_steps"] = options.bench_warmup + options.bench_steps
    if options.synthetic:  # random weights and tokens: never judged as the recorded run
        invocation["synthetic"] = True
    if options.model:
        invocation["model"] = options.model
    for name, size in mesh.items():
        accel_overrides[MESH_KEYS[name]] = int(size)
    if options.cpu:
        accel_overrides.update(profiles.cpu_accelerate(accelerate))
    for key, value in accel_overrides.items():
        if key.startswith("parallelism_config_"):
            accelerate["parallelism_config"] = {**(accelerate.get("parallelism_config") or {}), key: value}
        else:
            accelerate[key] = value

    # The training argv after `--config config.yaml`, by source; later layers win, as in the ranks' parser.
    make_parser = recipe.load_train_module().make_parser
    user = Layer(AFTER_DASHES, list(options.extra))
    # The recipe's own values are checked as written, even where the smoke profile replaces them.
    own = merge(make_parser, recipe.config_path, config, [user])
    output_dir = _output_dir(options, own, recipe, config, profile)
    launcher: dict = {}
    if options.max_steps is not None:
        launcher["max_steps"] = options.max_steps
    if options.bench and options.bench_steps is not None:
        launcher["max_steps"] = options.bench_warmup + options.bench_steps
    if options.save_steps is not None:
        launcher.update(save_strategy="steps", save_steps=options.save_steps, save_total_limit=2)
    if options.model:
        launcher["model_name_or_path"] = options.model
    if options.synthetic:
        launcher["synthetic"] = True
    if options.resume:
        launcher["resume_from_checkpoint"] = str(checkpoints.resolve_resume(output_dir, options.resume))
    launcher["output_dir"] = str(output_dir)
    launcher.update(tracking.launcher_args(recipe.name, output_dir, _keys(options.extra)))
    layers = [
        Layer("the smoke/CPU profile", profiles.as_argv(profiles.training_overrides(config, options.smoke, options.cpu,
                                                                                  progress=progress))),
        Layer(f"the recorded smoke invocation in {recipe.expected_metrics_path}", recorded_args),
        user,
        Layer("the launcher's options", profiles.as_argv(launcher)),
    ]
    layers = [layer for layer in layers if layer.argv]
    training = merge(make_parser, recipe.config_path, config, layers)

    return Setup(
        recipe=recipe,
        options=options,
        profile=profile,
        invocation=invocation,
        accelerate=accelerate,
        accelerate_overrides=accel_overrides,
        training=training,
        layers=layers,
        layout=Layout.from_configs(accelerate, training),
        checkpointing=checkpointing(training),
        explicit=explicit_keys(recipe.config_path, config, layers),
        output_dir=output_dir,
        notes=notes,
    )


def _output_dir(options: Options, own: dict, recipe: Recipe, config: dict, profile: str) -> Path:
    """The one output folder: --output-dir, or `-- --output_dir`, or the default; `~` expanded, absolute."""
    given = "output_dir" in _keys(options.extra)
    after_dashes = own.get("output_dir") if given else None
    if options.output_dir and after_dashes and outdir.expand(after_dashes) != outdir.expand(options.output_dir):
        raise LaunchError(
            f"Two output folders were given: --output-dir {options.output_dir} and, after `--`, --output_dir "
            f"{after_dashes}. The launcher writes its log and summary where the trainer writes its checkpoints: "
            "give one of them."
        )
    if options.output_dir or after_dashes:
        return outdir.expand(options.output_dir or after_dashes)
    if profile == "full-gpu" and config.get("output_dir"):
        return outdir.expand(REPO_ROOT / config["output_dir"]) if not Path(config["output_dir"]).is_absolute() \
            else outdir.expand(config["output_dir"])
    return REPO_ROOT / "outputs" / recipe.name / profile


def _without_output_dir(argv: list[str]) -> list[str]:
    """The training arguments that can change a run's metrics: all but the output folder."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in ("--output_dir", "--output-dir"):
            skip = True
        elif not token.startswith(("--output_dir=", "--output-dir=")):
            out.append(token)
    return out


def _keys(argv: list[str]) -> set[str]:
    return {t[2:].split("=", 1)[0].replace("-", "_") for t in argv if t.startswith("--")}

"""Resolving a run: the recipe, its two configs, the profile and the command-line overrides, merged into one
`Setup` that the rules validate, the plan describes and the command builder turns into `accelerate launch`.

Nothing here starts a process or writes a file. The training arguments are merged and typed by the recipe's own
TrlParser (`launch.config.training_args`) from the same argv the ranks will get, so the plan shows the values the run
uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from launch import REPO_ROOT
from launch.config import accelerate_config, profiles
from launch.results import outdir
from launch.run import checkpoints, tracking
from launch.config.adapter import Adapter
from launch.config.precision import Precision, mixed_precision
from launch.constants import MESH_KEYS
from launch.errors import LaunchError
from launch.results.expected import profile_entry
from launch.config.layout import Layout
from launch.config.options import Options
from launch.recipe.discovery import Recipe, find_recipe
from launch.switches import is_on
from launch.config.training_args import AFTER_DASHES, Checkpointing, Layer, checkpointing, explicit_keys, merge

FASTEST = "the --fastest choice"  # the layer of training arguments `--fastest` chose (launch.speed.fastest)


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
    # strategy, ZeRO stage, mesh, batch: built once here, read by the rules, the plan and the memory model
    layout: Layout
    # load dtype, mixed precision, where the fp32 masters live: resolved once here (launch.config.precision)
    precision: Precision
    checkpointing: Checkpointing  # activation checkpointing as the ranks get it (transformers' and FSDP's, once)
    explicit: dict  # training key -> where it was given (config.yaml or a layer); the rest are defaults
    output_dir: Path
    notes: list[str] = field(default_factory=list)  # said before starting
    sources: "Sources | None" = field(default=None, repr=False, compare=False)  # what resolve read, for with_fastest

    def with_fastest(self, fastest: tuple[list[str], dict]) -> "Setup":
        """This run with the settings `--fastest` chose (training argv, Accelerate launch overrides;
        `launch.speed.fastest.arguments`) as the layer of training arguments below the user's `--` ones: what
        `resolve` read, merged again with that layer (nothing read twice)."""
        return _assemble(self.sources, fastest)

    @property
    def training_argv(self) -> list[str]:
        return [token for layer in self.layers for token in layer.argv]

    @property
    def folder(self) -> outdir.RunFolder:
        """The output folder's files and checks."""
        return outdir.RunFolder(self.output_dir)

    @property
    def saves(self) -> str:
        """What the run keeps in its output folder besides its log, trainer_state.json and summary (`saves_of`)."""
        return saves_of(self.training)


def saves_of(training: dict) -> str:
    """What the ranks save, from their training arguments: checkpoints as transformers' `save_strategy` says (with
    `steps` it also saves at the last step, whatever save_steps), and train.py's final model (`save_final`; never for
    a synthetic run). "nothing" when neither."""
    kept = []
    strategy = str(training.get("save_strategy") or "no").lower().rsplit(".", 1)[-1]  # an enum's str: SaveStrategy.NO
    if strategy != "no":
        n = float(training.get("save_steps") or 0)
        steps = f"{n:.0%} of the run's steps" if 0 < n < 1 else f"{n:g} steps"  # below 1: a ratio (transformers)
        every = {"steps": f"every {steps} and at the last step", "epoch": "every epoch",
                 "best": "at each new best metric"}.get(strategy, strategy)
        limit = training.get("save_total_limit")
        kept.append(f"checkpoints {every} ({f'the last {limit} kept' if limit else 'all kept'})")
    if training.get("save_final", True) and not training.get("synthetic"):
        kept.append("the final model in final/")
    return "; ".join(kept) or "nothing"


def _check_numbers(options: Options) -> None:
    """Sizes that would break the plan itself (a negative mesh size gives a negative per-rank length)."""
    bad = [f"--{k.replace('_', '-')}-size {v}" for k, v in (options.mesh or {}).items() if v is not None and v < 1]
    if options.num_processes is not None and options.num_processes < 1:
        bad.insert(0, f"--num-processes {options.num_processes}")
    if options.num_machines is not None and options.num_machines < 1:
        bad.append(f"--num-machines {options.num_machines}")
    if bad:
        raise LaunchError(f"{', '.join(bad)}: process counts and mesh sizes must be at least 1.")


def resolve(options: Options, progress=print, fastest: tuple[list[str], dict] | None = None) -> Setup:
    """The run `options` ask for, in four steps: the layout a smoke run inherits from its recorded invocation, the
    Accelerate config with this run's overrides, the launcher's own training arguments, and the merge of every
    source of training arguments in the recipe's own parser. `fastest`: the settings `--fastest` chose (training
    argv, Accelerate launch overrides; `launch.speed.fastest.arguments`), below what the user gave after `--`
    (`Setup.with_fastest` adds them to a run resolved without them). Reads only; a refusal is a LaunchError."""
    return _assemble(_read(options, progress), fastest)


@dataclass(frozen=True)
class Sources:
    """What `resolve` reads of a run, once: the recipe, the profile, the layers of training arguments below and above
    the `--fastest` layer, the Accelerate overrides below and above it. `_assemble` merges them with that layer."""

    recipe: Recipe
    options: Options
    profile: str
    config: dict
    make_parser: Callable  # the recipe's train.py's, loaded once
    invocation: dict
    notes: list[str]
    bf16: bool
    smoke_accelerate: dict  # below the --fastest choice
    run_accelerate: dict  # above it
    output_dir: Path
    below: list[Layer]  # the training argv layers below the --fastest choice
    above: list[Layer]  # and above it


def _read(options: Options, progress) -> Sources:
    _check_numbers(options)
    # `record` writes expected_metrics.json: a recipe without one yet is what it is for
    recipe = find_recipe(options.recipe, optional=("expected_metrics.json",) if options.record else ())
    notes: list[str] = []
    if options.record and not recipe.expected_metrics_path.is_file():
        notes.append(f"{recipe.expected_metrics_path} does not exist yet: this run's metrics will create it")
    profile = profiles.profile_name(options.smoke, options.cpu)
    # The recipe's own Accelerate config is checked as written, even where this run overrides a value of it.
    accelerate_config.check(recipe.accelerate_config_path, recipe.accelerate)
    config = dict(recipe.config)

    recorded = _recorded_invocation(options, recipe, profile)
    num_processes, mesh, changed = _smoke_layout(options, recorded)
    invocation = _invocation(options, recipe.accelerate, recorded, num_processes, mesh)
    if changed:
        notes.append(_layout_change(invocation, recorded))
    make_parser = recipe.load_train_module().make_parser
    # The recipe's own values are checked as written, even where the smoke profile replaces them.
    own = merge(make_parser, recipe.config_path, config, [Layer(AFTER_DASHES, list(options.extra))])
    bf16 = _computes_in_bf16(options, recipe.accelerate, own)
    # The smoke profile checkpoints an adapter run with transformers' checkpointing (FSDP's would save the adapter
    # empty): it sees the adapter wherever it is turned on, config.yaml or after `--`.
    seen = {**config, "use_peft": True} if is_on(own.get("use_peft")) else config
    # later wins: the smoke profile's checkpointing, the --fastest choice, this run's own overrides
    smoke_accelerate = profiles.smoke_checkpointing(seen, recipe.accelerate)[1] if options.smoke else {}
    output_dir = _output_dir(options, own, recipe, config, profile)
    launcher = _launcher_arguments(options, recipe, output_dir)
    below, above = _training_layers(options, recipe, seen, recorded, launcher, progress, bf16)
    return Sources(recipe, options, profile, config, make_parser, invocation, notes, bf16, smoke_accelerate,
                   _accelerate_overrides(options, recipe.accelerate, num_processes, mesh, bf16), output_dir,
                   below, above)


def _assemble(read: Sources, fastest: tuple[list[str], dict] | None) -> Setup:
    """The Setup of what `_read` read, with the `--fastest` choice (training argv, Accelerate launch overrides) as
    the layers between the smoke profile's and the run's own: merged by the recipe's parser, laid out, resolved."""
    options, recipe, config = read.options, read.recipe, read.config
    invocation, notes = dict(read.invocation), list(read.notes)
    fastest_argv, fastest_accelerate = fastest or ([], {})
    if fastest_argv or fastest_accelerate:  # another run than the recorded one, if it changes anything
        invocation["fastest"] = {"training_args": list(fastest_argv), "accelerate": dict(fastest_accelerate)}
    accel_overrides = {**read.smoke_accelerate, **fastest_accelerate, **read.run_accelerate}
    accelerate = _with_overrides(recipe.accelerate, accel_overrides)
    layers = [layer for layer in [*read.below, Layer(FASTEST, list(fastest_argv)), *read.above] if layer.argv]
    training = merge(read.make_parser, recipe.config_path, config, layers)
    if options.cpu:
        notes += profiles.cpu_notes(config, training)
    if options.bench or options.synthetic:
        what = saves_of(training)
        notes.append(f"saves {what} (asked for)" if what != "nothing" else
                     "saves nothing: a --synthetic run keeps no checkpoint (--save-steps N keeps them) and never its "
                     "random weights" if options.synthetic else
                     "saves nothing: a --bench run keeps no checkpoint and no final weights "
                     "(--save-steps N keeps both)")
    layout = Layout.from_configs(accelerate, training)

    return Setup(
        recipe=recipe,
        options=options,
        profile=read.profile,
        invocation=invocation,
        accelerate=accelerate,
        accelerate_overrides=accel_overrides,
        training=training,
        layers=layers,
        layout=layout,
        precision=Precision.resolve(layout.kind, accelerate, training, Adapter.from_training(training),
                                    device="cpu" if options.cpu else "gpu", sp=layout.sp),
        checkpointing=checkpointing(training, accelerate),
        explicit=explicit_keys(recipe.config_path, config, layers),
        output_dir=read.output_dir,
        notes=notes,
        sources=read,
    )


# --- step 1: the layout a smoke run inherits --------------------------------------------------------------------------

def _recorded_invocation(options: Options, recipe: Recipe, profile: str) -> dict:
    """The invocation this recipe's smoke profile was recorded with ({} for other runs, and for `record`, whose
    invocation is exactly what its command line says)."""
    if not options.smoke or options.record:
        return {}
    return dict(profile_entry(recipe, profile).get("invocation") or {})


def _smoke_layout(options: Options, recorded: dict) -> tuple[int | None, dict, bool]:
    """(num_processes, mesh, changed): a smoke run keeps the layout its expected metrics were recorded with, unless
    the user changes it (`changed`: the run is then not judged). A layout given on the command line that equals the
    recorded one (e.g. the recipe's own --num-processes) is not a change."""
    recorded_mesh = dict(recorded.get("mesh") or {})
    changed = (options.num_processes is not None and options.num_processes != recorded.get("num_processes")) \
        or (bool(options.mesh) and {**recorded_mesh, **options.mesh} != recorded_mesh)
    if changed or not recorded:
        return options.num_processes, dict(options.mesh or {}), changed and bool(recorded)
    return recorded.get("num_processes"), recorded_mesh, False


def _layout_change(invocation: dict, recorded: dict) -> str:
    """The note said before a smoke run whose layout differs from the recorded one."""
    def shown(mesh) -> str:
        return str(mesh or "as in the config")

    return (f"smoke layout changed to {invocation['num_processes']} process(es), mesh {shown(invocation['mesh'])} "
            f"(recorded: {recorded.get('num_processes')} process(es), mesh {shown(recorded.get('mesh'))}); "
            "this run is not judged against the expected metrics")


# The launcher's options that set training arguments, and which of those make a run another run than the recorded
# one (a shorter or longer run, another model, random weights and tokens), under their names in an invocation.
INVOCATION_KEYS = {"max_steps": "max_steps", "synthetic": "synthetic", "model_name_or_path": "model"}


def _option_arguments(options: Options) -> dict:
    """{training argument: value} for the launcher's options that set one (in the order of the command line)."""
    values: dict = {}
    if options.max_steps is not None:
        values["max_steps"] = options.max_steps
    if options.bench and options.bench_steps is not None:  # warm-up, then the measured steps
        values["max_steps"] = options.bench_warmup + options.bench_steps
    if options.save_steps is not None:
        values.update(save_strategy="steps", save_steps=options.save_steps, save_total_limit=2)
    if options.model:
        values["model_name_or_path"] = options.model
    if options.synthetic:
        values["synthetic"] = True
    return values


def _invocation(options: Options, accelerate: dict, recorded: dict, num_processes: int | None, mesh: dict) -> dict:
    """What defines this run for judging (its layout, the training arguments given, and the launcher's options in
    INVOCATION_KEYS), matched against the recorded invocation before a smoke run is judged."""
    invocation = {"num_processes": num_processes or int(accelerate.get("num_processes", 1)), "mesh": mesh,
                  "training_args": list(recorded.get("training_args") or []) + _without_output_dir(options.extra)}
    if options.num_machines and options.num_machines > 1:
        invocation["num_machines"] = options.num_machines
    invocation.update({INVOCATION_KEYS[k]: v for k, v in _option_arguments(options).items() if k in INVOCATION_KEYS})
    return invocation


# --- step 2: the Accelerate config with this run's overrides ----------------------------------------------------------

def _computes_in_bf16(options: Options, accelerate: dict, own: dict) -> bool:
    """Whether the run computes in bf16: on a GPU as its config and the arguments after `--` say (SFTConfig's `bf16`
    defaults to true unless fp16); on CPU only when asked for after `--` (`-- --bf16 true`): the CPU profile trains
    in fp32 otherwise, whatever config.yaml says for the GPU."""
    if options.cpu:
        return "bf16" in _keys(options.extra) and is_on(own.get("bf16"))
    return mixed_precision(accelerate, own) == "bf16"


def _accelerate_overrides(options: Options, accelerate: dict, num_processes: int | None, mesh: dict,
                          bf16: bool = False) -> dict:
    """{accelerate launch flag name: value}: the process count, the machines, the mesh sizes and the CPU profile's."""
    overrides: dict = {}
    if num_processes:
        overrides["num_processes"] = int(num_processes)
    for key in ("num_machines", "machine_rank", "main_process_ip", "main_process_port"):
        if getattr(options, key) is not None:
            overrides[key] = getattr(options, key)
    if options.smoke and options.num_machines is None and int(accelerate.get("num_machines", 1) or 1) > 1:
        # A smoke run is one machine's unless --num-machines (or a scheduler) says otherwise: a multi-node recipe
        # (fsdp2-70b: num_machines 3) keeps its mesh, recorded for the processes of one machine.
        overrides["num_machines"] = 1
    if int(overrides.get("num_machines", accelerate.get("num_machines", 1)) or 1) > 1:
        # torchrun's static rendezvous on machine rank 0 waits for the other machines as long as its store's timeout
        # (torch's default 600 s): the run's --rendezvous-timeout bounds it, as it bounds the other machines' wait
        # (launch.run.runner.wait_for_rendezvous); a timeout the Accelerate config sets itself is kept
        conf = rendezvous_conf(accelerate)
        if "timeout" not in conf:
            conf["timeout"] = str(math.ceil(options.rendezvous_timeout))
            overrides["rdzv_conf"] = ",".join(f"{k}={v}" for k, v in conf.items())
    for name, size in mesh.items():
        overrides[MESH_KEYS[name]] = int(size)
    if options.cpu:
        overrides.update(profiles.cpu_accelerate(accelerate, bf16))
    return overrides


def rendezvous_conf(accelerate: dict) -> dict:
    """The Accelerate config's `rdzv_conf` (`key=value,key=value`, torchrun's --rdzv-conf) as a dict."""
    pairs = (item.split("=", 1) for item in str(accelerate.get("rdzv_conf") or "").split(",") if "=" in item)
    return {k.strip(): v.strip() for k, v in pairs}


def _with_overrides(accelerate: dict, overrides: dict) -> dict:
    """The Accelerate config as the run gets it: a mesh size goes into its `parallelism_config`, an `fsdp_*` flag into
    its `fsdp_config` (as `accelerate launch` reads them, commands/launch.py: `fsdp_config.x` is `--fsdp_x`), the rest
    on top."""
    out = dict(accelerate)
    for key, value in overrides.items():
        if key.startswith("parallelism_config_"):
            out["parallelism_config"] = {**(out.get("parallelism_config") or {}), key: value}
        elif key.startswith("fsdp_") and isinstance(out.get("fsdp_config"), dict):
            out["fsdp_config"] = {**out["fsdp_config"], key: value}
        else:
            out[key] = value
    return out


# --- step 3: the launcher's own training arguments --------------------------------------------------------------------

def _launcher_arguments(options: Options, recipe: Recipe, output_dir: Path) -> dict:
    """The training arguments the launcher adds last (they win): its options', the checkpoint to resume, the output
    folder, and the tracking project and run name (unless given after `--`)."""
    launcher = _option_arguments(options)
    if options.resume:
        launcher["resume_from_checkpoint"] = str(checkpoints.resolve_resume(output_dir, options.resume))
    launcher["output_dir"] = str(output_dir)
    launcher.update(tracking.launcher_args(recipe.name, output_dir, _keys(options.extra)))
    return launcher


# --- step 4: the merge ------------------------------------------------------------------------------------------------

def _training_layers(options: Options, recipe: Recipe, config: dict, recorded: dict, launcher: dict,
                     progress, bf16: bool = False) -> tuple[list[Layer], list[Layer]]:
    """The training argv after `--config config.yaml`, by source, for the recipe's parser to merge over config.yaml
    (later layers win, as in the ranks' parser), as (below, above) the `--fastest` choice's layer: below it the
    smoke/CPU profile's, a measurement's (--bench, --synthetic: nothing saved), the recorded smoke invocation's; above
    it the user's after `--`, the launcher's. Empty layers are left out when merged."""
    below = [
        Layer("the smoke/CPU profile", profiles.as_argv(profiles.training_overrides(
            config, options.smoke, options.cpu, progress=progress, accelerate=recipe.accelerate, bf16=bf16))),
        Layer("--bench/--synthetic (a measurement saves nothing)",
              profiles.as_argv(profiles.measure_only(options.bench, options.synthetic, options.save_steps))),
        Layer(f"the recorded smoke invocation in {recipe.expected_metrics_path}",
              list(recorded.get("training_args") or [])),
    ]
    above = [
        Layer(AFTER_DASHES, list(options.extra)),
        Layer("the launcher's options", profiles.as_argv(launcher)),
    ]
    return below, above


# --- the output folder ------------------------------------------------------------------------------------------------

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

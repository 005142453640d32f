"""What the user asked for on the command line, shared by every command that runs or plans a recipe: the `Options`
of a run, the run parser (`python -m launch RECIPE ...`, also used by `record` and `bench`), and the split at `--`.

Each run option is declared once, as a field of `Options` whose metadata carries its help, its command-line spelling
and where its default comes from; the parser is generated from the fields (as torchtitan's job config and
transformers' `HfArgumentParser` do), so a flag, its default and the value a run reads cannot drift apart.

One floor below the commands (`launch.commands`), as TRL's `trl/cli` keeps its shared command context below the
commands that use it.
"""

from __future__ import annotations

import argparse
import math
import typing
from dataclasses import MISSING, Field, dataclass, field, fields

from launch.errors import LaunchError
from launch.facts import gpus
from launch.rank.measure import DEFAULT_WARMUP

MESH_OPTIONS = ("dp_replicate", "dp_shard", "cp", "sp")  # the mesh dimensions a run may override (`--X-size`)
# the help group of the multi-node options; launch.config.envvars.rendezvous fills in what is not given
MULTI_NODE = ("multi-node (defaults from the scheduler's variables: SLURM, SkyPilot, a Kubeflow TrainJob, "
              "MASTER_ADDR/MASTER_PORT; docs/schedulers.md)")


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a LaunchError: one paragraph naming the option and value, exit status 2, and
    the same path as every other refusal (also when the launcher runs in-process)."""

    def error(self, message):
        raise LaunchError(f"{message}. See `{self.prog} --help`.")


def gpu_model(name: str) -> str:
    """--gpu NAME: a row of the GPU table (launch.facts.gpus.lookup), refused while parsing with the rows that come
    close: a misspelt GPU would otherwise be planned as the calibration H100."""
    try:
        gpus.lookup(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).rstrip(".")) from None
    return name


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


def option(help: str | None = None, *, default=None, default_factory=MISSING, flag: str | None = None,
           metavar: str | None = None, type=None, nargs: str | None = None, const=None,
           group: str | None = None, each: tuple[str, ...] | None = None) -> Field:
    """A run option: a dataclass field whose metadata says how the command line spells it.

    flag: `--field-name` unless given (no leading dash: a positional argument; a `bool` field defaulting to True
    needs its `--no-...` flag). The argparse type is the field's annotation unless `type` is given; a `bool` is a
    switch. `help` may name the default as argparse does (`%(default)s`). each: one option per key (`flag` and `help`
    formatted with it), collected into a dict of the keys given."""
    cli = dict(help=help, flag=flag, metavar=metavar, type=type, nargs=nargs, const=const, group=group,
               each=each)
    metadata = {"cli": {k: v for k, v in cli.items() if v is not None}}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Options:
    """What the user asked for on the command line (built once, never changed: `options_from` or a direct call)."""

    recipe: str = option("a folder name under recipes/ (see `python -m launch list`) or a path", default=MISSING,
                         flag="recipe")
    smoke: bool = option("tiny offline model and data, few steps, judged against expected metrics", default=False)
    cpu: bool = option("run the processes on CPU over gloo, in fp32", default=False)
    num_processes: int | None = option("total processes (GPUs); default: the Accelerate config's")
    mesh: dict = option("override parallelism_config_{}_size", default_factory=dict, flag="--{}-size", type=int,
                        each=MESH_OPTIONS)  # e.g. {"sp": 4, "dp_shard": 2}
    output_dir: str | None = option("where checkpoints, trainer_state.json and run_summary.json go")
    max_steps: int | None = option("stop after this many optimizer steps")
    save_steps: int | None = option("save a checkpoint every N steps (kept: the last 2)")
    resume: str | None = option("continue from the newest complete checkpoint in the output folder, or from "
                                "CHECKPOINT", nargs="?", const="latest", metavar="CHECKPOINT")
    overwrite: bool = option("delete an earlier run's files in the output folder (it says which) and start again",
                             default=False)
    # seconds; None: the profile's default; math.inf: the watchdog is off
    hang_timeout: float | None = option("stop the job when no rank made progress for this long (default: 60 for "
                                        "--smoke, 900 otherwise; at least 5 x the slowest step seen); `off` turns "
                                        "the watchdog off", type=hang_timeout, metavar="SECONDS|off")
    gpu: str | None = option("plan and rank (--fastest) for this GPU model, a row of launch/facts/gpus.py as in "
                             "`plan --gpu`; default: the GPU torch sees here (a CPU run: the calibration H100)",
                             type=gpu_model, metavar="NAME")
    force: bool = option("start even when the planner predicts the run does not fit this machine's GPU or host "
                         "memory", default=False)
    bench: bool = option("measure step time, tokens/s per GPU, MFU and peak memory (after warm-up) into "
                         "run_summary.json", default=False)  # launch.speed.measured
    bench_steps: int | None = option("with --bench: stop after warm-up + N steps", metavar="N")
    bench_warmup: int = option("with --bench: steps not measured (%(default)s)", default=DEFAULT_WARMUP, metavar="N")
    synthetic: bool = option("the model's architecture from its config.json with random weights, random token rows "
                             "of max_length: no weights, tokenizer or dataset needed (throughput and memory)",
                             default=False)  # launch.rank.synthetic
    model: str | None = option("model_name_or_path for this run: a hub id or a folder (for `plan` and --synthetic, "
                               "a folder holding only config.json is enough)", metavar="DIR_OR_ID")
    loss_sentinel: bool = option("do not stop the run when its first logged losses leave the recipe's recorded band",
                                 default=True, flag="--no-loss-sentinel")  # launch.results.sentinel
    fastest: bool = option("use the fastest speed settings that fit this machine (activation checkpointing, "
                           "micro-batch x accumulation at the same tokens per step, Liger): chosen by the planner "
                           "and the throughput model before start; settings given after `--` win",
                           default=False)  # launch.speed.fastest
    dry_run: bool = option("print the command and the effective setup, run nothing", default=False)
    pure_bf16: bool = option("train 16-bit weights without fp32 master copies on purpose, although Adam's updates "
                             "below half a 16-bit step round away (refused otherwise: launch/config/precision.py)",
                             default=False)  # launch.checks.rules.pure_16bit_update_rounds_away
    # Multi-node: total machines, this machine's rank, and the rendezvous address of machine rank 0.
    num_machines: int | None = option(group=MULTI_NODE)
    machine_rank: int | None = option(group=MULTI_NODE)
    main_process_ip: str | None = option(group=MULTI_NODE)
    main_process_port: int | None = option(group=MULTI_NODE)
    rendezvous_timeout: float = option("machine ranks > 0: how long to wait for machine rank 0 before giving up "
                                       "(%(default)g)", default=300.0, metavar="SECONDS", group=MULTI_NODE)
    # Not options of their own: set by the command that builds the Options.
    # fact -> the flag or scheduler variable(s) it came from (launch.config.envvars.rendezvous; empty: the flags)
    rendezvous_sources: dict = field(default_factory=dict)
    record: bool = False  # `record`: the invocation is exactly what the command line says, nothing inherited
    extra: list[str] = field(default_factory=list)  # training arguments after `--`, passed on verbatim


def _cli_fields(names=None) -> list[Field]:
    return [f for f in fields(Options) if "cli" in f.metadata and (names is None or f.name in names)]


def _kind(f: Field):
    """The field's annotation without `| None` (int, float, str, bool)."""
    hint = typing.get_type_hints(Options)[f.name]
    return next((a for a in typing.get_args(hint) if a is not type(None)), hint)


def _each(f: Field) -> list[tuple[str, str, str]]:
    """(key, flag, dest) of an `each` option."""
    cli = f.metadata["cli"]
    return [(key, flag := cli["flag"].format(key.replace("_", "-")), flag.lstrip("-").replace("-", "_"))
            for key in cli["each"]]


def _arguments(f: Field) -> list[tuple[str, dict]]:
    """The `add_argument` calls that declare one field."""
    cli = f.metadata["cli"]
    if "each" in cli:
        return [(flag, {"dest": dest, "type": cli["type"], "help": cli["help"].format(key)})
                for key, flag, dest in _each(f)]
    kwargs = {k: cli[k] for k in ("help", "metavar", "nargs", "const") if k in cli}
    flag = cli.get("flag", f"--{f.name.replace('_', '-')}")
    if not flag.startswith("-"):  # positional: argparse takes its dest from the name
        return [(flag, kwargs)]
    kwargs["dest"] = f.name
    if _kind(f) is bool:
        kwargs["action"] = "store_false" if f.default else "store_true"
    else:
        kwargs["type"] = cli.get("type", _kind(f))
        kwargs["default"] = f.default  # None for the multi-node options: launch.config.envvars.rendezvous fills them in
    return [(flag, kwargs)]


def add_options(parser: argparse.ArgumentParser, names=None) -> argparse.ArgumentParser:
    """Declare the run options `names` (all when None) on `parser`, in field order, grouped as declared."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    chosen = _cli_fields(names)
    for f in chosen:
        group = f.metadata["cli"].get("group")
        if group and group not in groups:
            groups[group] = parser.add_argument_group(group)
        target = groups[group] if group else parser
        for flag, kwargs in _arguments(f):
            target.add_argument(flag, **kwargs)
    return parser


def values_from(ns: argparse.Namespace, names=None) -> dict:
    """The parsed values of the run options `names` (all when None), keyed by field name."""
    values = {}
    for f in _cli_fields(names):
        if "each" in f.metadata["cli"]:
            values[f.name] = {key: v for key, _flag, dest in _each(f) if (v := getattr(ns, dest, None)) is not None}
        else:
            values[f.name] = getattr(ns, f.name)
    return values


def run_parser(prog: str, epilog: str | None = None) -> Parser:
    """The parser of `python -m launch RECIPE ...`, generated from the fields of `Options`; `epilog` is printed as
    written (the list of commands)."""
    formatter = argparse.RawDescriptionHelpFormatter if epilog else argparse.HelpFormatter
    return add_options(Parser(prog=prog, description="Validate, plan, run and judge a recipe.", epilog=epilog,
                              formatter_class=formatter))


def options_from(ns: argparse.Namespace, extra: list[str], *, record: bool = False) -> Options:
    """The Options of a parsed run command line. The multi-node options not given are filled in later from the
    scheduler's variables, in one place (`launch.config.envvars.rendezvous`, called by the runner)."""
    return Options(**values_from(ns), extra=list(extra), record=record)


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    """Our options, and the training arguments after `--` (passed on unchanged)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse_run(argv: list[str], prog: str, *, record: bool = False, epilog: str | None = None) -> Options:
    """`RECIPE [options] [-- training args]` -> Options."""
    own, extra = split_extra(argv)
    return options_from(run_parser(prog, epilog).parse_args(own), extra, record=record)

"""Validity rules, checked before any process starts. Each rule is written once, here, and used by the preflight
(`python -m launch`), by `doctor`, by the README tables (`launch.catalog.blocks`) and by the tests (tests/test_rules.py
shows every message).

A rule takes the resolved `Setup` and the `Facts` of this machine and returns None when satisfied, or one paragraph
saying what is wrong and how to fix it. Rules only cover what upstream does not check before start: the merge of
config.yaml and the command line (types, unknown keys) is TRL's parser (`launch.config.training_args`), the Accelerate
config is Accelerate's classes (`launch.config.accelerate_config`), mesh sizes are Accelerate's `ParallelismConfig`.

Two kinds: rules about the run itself (a broken one stops even `--dry-run`), and rules about *this machine*
(`machine=True`: GPUs present, installed versions, files and hub access), which `--dry-run` reports without
failing, since a plan is often made on a machine that will not run it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Callable

from accelerate.utils.constants import FSDP_STATE_DICT_TYPE
from packaging.version import Version

from launch.config import envvars
from launch.facts import hub, meta_model
from launch.recipe import sections, template as train_template
from launch.config.adapter import Adapter, quantization_on_cpu_supported
from launch.facts.machine import (bitsandbytes_cuda_problem, deepspeed_prebuilt_ops, installed_versions,
                                  jit_build_tools, kernels_route)
from launch.constants import CP_ATTENTION, SP_ATTENTION, SP_ATTENTION_KEY
from launch.config.precision import Precision, half_step
from launch.recipe.discovery import RECIPES_DIR
from launch.switches import is_on
from launch.config.training_args import alias_ignored

# Version floors per feature (upstream sources: Accelerate's FSDP2_PYTORCH_VERSION and its CP/SP checks, DeepSpeed's
# ALST requirement; also read by `launch doctor`).
FLOORS = {
    "deepspeed": {"deepspeed": "0.15.0"},
    "fsdp2": {"torch": "2.6.0", "accelerate": "1.7.0"},
    "context_parallel": {"torch": "2.6.0", "accelerate": "1.11.0"},
    "sequence_parallel": {"accelerate": "1.12.0", "deepspeed": "0.18.2", "transformers": "5.0.0"},
}
# Releases known to be broken for a feature, with why.
BROKEN = {
    "deepspeed": {("transformers", "5.1.0"): "transformers 5.1.0 is broken with DeepSpeed (TRL excludes it)"},
}
# Keys every recipe config must set (the GPU defaults a user runs).
REQUIRED_KEYS = ("accelerate_config", "model_name_or_path", "output_dir")


@dataclass
class Facts:
    """What this machine has, gathered once (tests pass their own)."""

    versions: dict = field(default_factory=dict)  # distribution name -> version string, or None if absent
    gpu_count: int = 0
    model: hub.ModelConfig = field(default_factory=lambda: hub.ModelConfig(None, "not read"))
    missing_inputs: list[str] = field(default_factory=list)  # model or dataset that cannot be found (launch.facts.hub)
    # launch.memory.plan.MemoryPlan for this machine (GPU and host memory), when computable
    memory: object | None = None

    @property
    def model_config(self):
        return self.model.config


@dataclass
class Rule:
    fn: Callable
    machine: bool  # about this machine (GPUs, versions, files), not about the run
    needs_model: bool  # reads the model's config; skipped (and said so) when it cannot be read
    doc: tuple[str, str] | None  # (what must hold, what happens otherwise) for the recipe README tables
    feature: str | None
    applies: Callable | None  # for needs_model rules: whether the rule concerns this setup at all

    @property
    def name(self) -> str:
        return self.fn.__name__


RULES: list[Rule] = []


def rule(machine=False, needs_model=False, feature=None, doc=None, applies=None):
    def register(fn):
        RULES.append(Rule(fn, machine, needs_model, doc, feature, applies))
        return fn

    return register


@dataclass
class Report:
    problems: list[str]  # about the run: it cannot work anywhere
    machine_problems: list[str]  # this machine could not run it
    skipped: list[str]  # rules not checked because the model's config could not be read

    @property
    def all(self) -> list[str]:
        return self.problems + self.machine_problems


def check(setup, facts: Facts) -> Report:
    """Every broken rule's message (empty lists when the setup is valid), split by kind."""
    report = Report([], [], [])
    for r in RULES:
        if r.applies is not None and not r.applies(setup):
            continue
        if r.needs_model and facts.model_config is None:
            report.skipped.append(r.name)
            continue
        if msg := r.fn(setup, facts):
            (report.machine_problems if r.machine else report.problems).append(msg)
    return report


def features(setup) -> list[str]:
    acc = setup.accelerate
    out = []
    if acc.get("distributed_type") == "DEEPSPEED":
        out.append("deepspeed")
    if _fsdp2(setup):
        out.append("fsdp2")
    if _cp(setup) > 1:
        out.append("context_parallel")
    if _sp(setup) > 1:
        out.append("sequence_parallel")
    return out


def _fsdp2(setup) -> bool:
    return setup.layout.kind == "fsdp2"


def _sp(setup) -> int:
    return setup.layout.sp


def _cp(setup) -> int:
    return setup.layout.cp


def _public(version: str) -> Version:
    return Version(Version(version).public)


def length_multiple_problem(setup, divisor: int, why: str) -> str | None:
    """The one divisibility check of CP and SP: every batch is padded to `pad_to_multiple_of`, which must be a
    multiple of `divisor`."""
    multiple = setup.training.get("pad_to_multiple_of")
    if multiple and int(multiple) % divisor == 0:
        return None
    return f"{why}; set pad_to_multiple_of to a multiple of {divisor} (it is {multiple})."


# ---- every run --------------------------------------------------------------------------------------------------
@rule()
def config_keys_required(setup, facts: Facts):
    missing = [k for k in REQUIRED_KEYS if setup.recipe.config.get(k) in (None, "")]
    if not (setup.training.get("dataset_name") or setup.training.get("datasets")):
        missing.append("dataset_name")
    if missing:
        return (
            f"{setup.recipe.config_path} is missing required key(s): {', '.join(missing)}. A recipe's config.yaml "
            "holds the GPU defaults a user runs: the Accelerate config, the model, the dataset and the output folder."
        )
    return None


@rule()
def script_holds_its_sections(setup, facts: Facts):
    # A recipe's train.py holds only the optional sections of templates/train.py that its configs turn on
    # (launch.recipe.sections); without the one a run needs, the ranks would refuse its keys or skip its code.
    recipe, script = setup.recipe, setup.recipe.train_script
    needed: dict[str, list[str]] = {}
    for name in sections.wanted_sections(recipe.config, recipe.accelerate):
        needed.setdefault(name, []).append(sections.section(name).turned_on_by)
    for key, (_, where) in setup.explicit.items():  # a section's field given, which the script's parser lacks
        if key not in setup.training and (name := train_template.section_of_key(key)) and name not in needed:
            needed[name] = [f"`{key}` in {where}"]
    if setup.layout.sp > 1 and setup.training.get("resume_from_checkpoint"):
        needed.setdefault("ulysses-resume", []).append(f"a resumed run under Ulysses SP (sp {setup.layout.sp})")
    keys = train_template.parts().keys
    held = [name for name in sections.held_sections(script) if all(key in setup.training for key in keys[name])]
    missing = {name: why for name, why in needed.items() if name not in held}
    if not missing:
        return None
    lacks = "; ".join(f"{name} (needed for {', '.join(why)})" for name, why in missing.items())
    if sections.is_marked(script):
        command = "python -m launch sync-scripts" + ("" if recipe.path.parent == RECIPES_DIR else f" {recipe.path}")
        how = (f"It is a copy, which holds the sections its configs turned on when it was last synced "
               f"({', '.join(held) or 'none'}): `{command}` rewrites it with those its config.yaml and Accelerate "
               "config turn on now ("
               + "; ".join(f"{name}: {sections.section(name).turned_on_by}" for name in missing) + ").")
    else:
        how = ("It is a fork (no `# Copied from` line), which sync-scripts leaves alone: copy each section from "
               "templates/train.py into it, all the lines between `# begin section NAME` and `# end section NAME` "
               "(its RecipeArguments fields, its lines in main() and its functions).")
    return f"{script} lacks the optional section(s) of templates/train.py that this run needs: {lacks}. {how}"


@rule()
def numbers_positive(setup, facts: Facts):
    # --num-processes, --num-machines and mesh sizes are checked by resolve() (the plan needs them);
    # --max-steps and --save-steps arrive here as max_steps and save_steps.
    t = setup.training
    bad = []
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_length", "logging_steps"):
        if t.get(key) is not None and t[key] <= 0:
            bad.append(f"{key} {t[key]} (must be positive)")
    if t.get("max_steps") is not None and (t["max_steps"] == 0 or t["max_steps"] < -1):
        bad.append(f"max_steps {t['max_steps']} (a positive number of steps, or -1 for num_train_epochs)")
    if str(t.get("save_strategy")) == "steps" and t.get("save_steps") is not None and t["save_steps"] <= 0:
        bad.append(f"save_steps {t['save_steps']:g} with save_strategy steps (must be positive)")
    if bad:
        return "Invalid number(s): " + "; ".join(bad) + "."
    return None


@rule(feature="parallel", doc=(
    "`num_processes` (all machines) = dp_replicate x dp_shard x tp x cp x sp",
    "Accelerate: \"ParallelismConfig total_size (N) does not match num_processes (M)\" in the ranks; not checked at "
    "all for DeepSpeed SP"))
def processes_fit_layout(setup, facts: Facts):
    plan = setup.layout
    if plan.world_size % plan.num_machines:
        return (
            f"{plan.world_size} processes cannot be spread evenly over {plan.num_machines} machines; "
            "num_processes counts processes on all machines together."
        )
    if setup.accelerate.get("parallelism_config"):
        m = plan.mesh
        product = m["dp_replicate"] * m["dp_shard"] * m["tp"] * m["cp"] * m["sp"]
        if product != plan.world_size:
            dims = " x ".join(f"{k}={v}" for k, v in m.items())
            # Accelerate checks this in the ranks only, and not at all for DeepSpeed SP (its num_processes is per node)
            return (
                f"The recipe's parallel layout ({dims} = {product}) does not use {plan.world_size} processes: "
                "dp_replicate x dp_shard x tp x cp x sp must equal the number of processes on all machines together. "
                "Pass a matching --num-processes, or change the mesh sizes (--dp-shard-size, --sp-size, --cp-size ...)."
            )
    return None


@rule()
def rendezvous_port(setup, facts: Facts):
    # accelerate launch passes it to torchrun even on one machine, which then fails after the start
    port, source = setup.options.main_process_port, envvars.source(setup.options, "main_process_port")
    if port is None or 1 <= port <= 65535:
        return None
    # a scheduler's port names the variable(s) it came from (launch.config.envvars.rendezvous), e.g. SKYPILOT_..., not
    # always
    # MASTER_PORT
    names = [n.strip() for n in source.split("=")]
    given, fix = (f"--main-process-port {port}", "Pass a port between 1 and 65535, e.g. 29500.") \
        if source.startswith("--") \
        else (f"{source}={port} (from the environment)",
              f"Unset {' and '.join(names)} or set {'it' if len(names) == 1 else 'them'} to a free port, e.g. 29500.")
    return (f"{given} is not a TCP port (1-65535): it is the ranks' rendezvous port, also on one machine, where "
            f"accelerate launch would start and then fail. {fix}")


@rule()
def multinode_rendezvous(setup, facts: Facts):
    o, machines = setup.options, setup.layout.num_machines
    # issue 36: a machine rank from any source (a stray PET_NODE_RANK=1 on one machine included), checked in one place
    if problem := envvars.machine_rank_problem(o, machines):
        return problem
    if machines > 1 and not o.main_process_ip:
        return (f"Multi-node run over {machines} machines: --main-process-ip (the address of machine rank 0) is not "
                "set, so the other machines would wait for a rendezvous with no host.")
    return None


@rule(machine=True)
def rendezvous_address_resolves(setup, facts: Facts):
    # issue 36: every machine of a multi-node run waits on this address (machine ranks > 0 for up to
    # --rendezvous-timeout before the start, machine rank 0's own ranks in torchrun): one that does not resolve is
    # refused before any wait
    o = setup.options
    if setup.layout.num_machines <= 1:
        return None
    return envvars.address_problem(o.main_process_ip, o.main_process_port or 29500)


@rule(machine=True)
def enough_gpus(setup, facts: Facts):
    if setup.options.cpu:
        return None
    needed = setup.layout.processes_per_machine
    if facts.gpu_count < needed:
        seen = f"{facts.gpu_count} GPU(s) are visible" if facts.gpu_count else "no GPU is visible"
        return (
            f"The recipe asks for {needed} GPU(s) on this machine but {seen}. Use --num-processes "
            f"{facts.gpu_count or 1} with a matching layout, check CUDA_VISIBLE_DEVICES and the container's GPU "
            "reservation, or run the smoke profile on CPU with --smoke --cpu."
        )
    return None


@rule(machine=True)
def model_and_data_found(setup, facts: Facts):
    if facts.missing_inputs:
        return "The run could not load its inputs: " + "; ".join(facts.missing_inputs) + "."
    return None


@rule()
def output_dir_outside_recipes(setup, facts: Facts):
    # a run's checkpoints inside a recipe folder would be taken for (and shipped with) the recipe's files
    if setup.output_dir.resolve().is_relative_to(RECIPES_DIR.resolve()):
        return (f"The output folder {setup.output_dir} is inside {RECIPES_DIR}, which holds the recipes: a run's "
                "checkpoints there would be taken for recipe files. Pass an --output-dir outside recipes/, e.g. "
                "outputs/NAME.")
    return None


@rule(machine=True)
def model_folder_loads(setup, facts: Facts):
    # AutoConfig and from_pretrained fail only in the ranks, 40-65 s after the start (issue 27)
    t = setup.training
    if problem := hub.folder_problem(t.get("model_name_or_path"), synthetic=bool(t.get("synthetic"))):
        return problem[0].upper() + problem[1:]
    return None


@rule(needs_model=True)
def model_architecture_valid(setup, facts: Facts):
    # what AutoConfig accepts but model creation or the first step does not (launch.facts.hub.architecture_problem)
    if problem := hub.architecture_problem(facts.model_config):
        message = hub.architecture_message(setup.training.get("model_name_or_path"), facts.model.source, problem)
        return message[0].upper() + message[1:]
    return None


def missing_inputs(training: dict) -> list[str]:
    """What model_and_data_found reports: a model or dataset that cannot be found from this machine. A synthetic
    run reads no dataset (random token rows) and only the model's config.json."""
    dataset = None if training.get("synthetic") else hub.input_problem(training.get("dataset_name"), "dataset")
    return [p for p in (hub.input_problem(training.get("model_name_or_path"), "model"), dataset) if p]


def floor_problems(feature_names, versions: dict) -> list[str]:
    problems = []
    for feature in feature_names:
        for package, floor in FLOORS.get(feature, {}).items():
            have = versions.get(package)
            if have is None:
                problems.append(f"{feature.replace('_', ' ')} needs {package}>={floor}, which is not installed")
            elif _public(have) < Version(floor):
                problems.append(f"{feature.replace('_', ' ')} needs {package}>={floor}, found {have}")
        for (package, bad), why in BROKEN.get(feature, {}).items():
            if versions.get(package) and _public(versions[package]) == Version(bad):
                problems.append(why)
    return problems


@rule(machine=True)
def version_floors(setup, facts: Facts):
    problems = floor_problems(features(setup), facts.versions)
    if problems:
        return "Installed versions are below what this recipe needs: " + "; ".join(problems) + (
            ". Install the pinned versions (requirements/; `bash ci/test.sh` or the container does)."
        )
    return None


# ---- Optional packages a setting turns on (issue 33) ---------------------------------------------------------------
# A setting whose package this machine lacks starts every rank, which dies minutes later (at model load or at
# trainer.train()) with an ImportError. Each rule below is one package's fact on this machine (machine=True: a plan
# made elsewhere is still valid): its version from `facts.versions` (launch.facts.machine.installed_versions), or a
# probe of
# launch.facts.machine run only when the setting is on. The message names the package, the setting and where it was
# given,
# and both fixes: the install command (the version from the lock that has it) and the setting that turns it off.
# On CPU the profile turns Liger and FlashAttention off (launch.config.profiles); a `--` argument that turns one back
# on is
# checked like any other.
PACKAGE_EXTRAS = {"flash-attn-4": "cu13"}  # as requirements/image.in installs it (the CUDA 13 CuTe DSL libraries)
JIT_TOOLS_FIX = {"ninja": "`pip install ninja=={version}`", "a C++ compiler": "e.g. `apt-get install g++`",
                 "Python's headers (Python.h)": "e.g. `apt-get install python3-dev`"}


def locked_version(package: str) -> str | None:
    """The version of `package` in the lock that installs it: the image's (requirements/image.lock), else its own
    (requirements/<package>.lock: flash-attn, an opt-in build of the image)."""
    from launch.facts import pins

    for lock in (pins.IMAGE_LOCK, pins.REQUIREMENTS / f"{package}.lock"):
        if lock.is_file() and (version := pins.read_lock(lock).get(pins.normalize(package))):
            return version
    return None


def requirement(package: str) -> str:
    """`name[extra]==version` as the lock installs it (no version when no lock has it)."""
    extra = f"[{PACKAGE_EXTRAS[package]}]" if package in PACKAGE_EXTRAS else ""
    version = locked_version(package)
    return f"{package}{extra}=={version}" if version else f"{package}{extra}"


def install_command(package: str, options: str = "") -> str:
    return f"`pip install {options}{requirement(package)}`"


def _given(setup, key: str, value) -> str:
    """`key: value` and where it was given (config.yaml, a layer of training arguments, or the default)."""
    shown = str(value).lower() if isinstance(value, bool) else value
    return f"`{key}: {shown}` ({setup.explicit[key][1] if key in setup.explicit else 'the default of TRL'})"


def _installed(facts: Facts, package: str) -> str | None:
    """The package's installed version, from the facts when they name it (tests give their own), else looked up."""
    if package in facts.versions:
        return facts.versions[package]
    return installed_versions([package])[package]


@rule(machine=True)
def liger_kernel_installed(setup, facts: Facts):
    # transformers 5.23 Trainer: "You have set `use_liger_kernel` to `True` but liger-kernel >= 0.3.0 is not
    # available", raised in every rank once the model has loaded
    if not is_on(setup.training.get("use_liger_kernel")) or _installed(facts, "liger-kernel"):
        return None
    return (f"{_given(setup, 'use_liger_kernel', True)} needs liger-kernel, which is not installed here: every rank "
            "would load the model and then stop with an ImportError (transformers' Trainer). Install it "
            f"({install_command('liger-kernel')}, the version of the image's lock), or turn Liger off: "
            "`-- --use_liger_kernel false` (Liger's kernels keep activations smaller: add `--fastest` to re-choose "
            "checkpointing and the micro-batch for a run without them).")


@rule(machine=True)
def trackio_installed(setup, facts: Facts):
    # transformers 5.23 TrackioCallback: "TrackioCallback requires trackio to be installed", raised in every rank
    # when the Trainer is built. report_to `all` takes only the trackers installed, so only `trackio` named counts
    # (a string is one name, as transformers reads it).
    report = setup.training.get("report_to")
    reports = report if isinstance(report, list) else [report]
    if "trackio" not in reports or _installed(facts, "trackio"):
        return None
    return (f"{_given(setup, 'report_to', report)} needs trackio, which is not installed here: every rank would stop "
            "when the Trainer is built (transformers' TrackioCallback). Install it "
            f"({install_command('trackio')}, the version of the locks), or run without tracking: "
            "`-- --report_to none`.")


@rule(machine=True)
def bitsandbytes_usable(setup, facts: Facts):
    # a quantized base (TRL's load_in_4bit / load_in_8bit) is loaded by bitsandbytes in every rank; on CPU the
    # rule quantized_base_on_cpu (launch.config.adapter.quantization_on_cpu_supported) decides instead
    key = next((k for k in ("load_in_4bit", "load_in_8bit") if is_on(setup.training.get(k))), None)
    if key is None or setup.options.cpu:
        return None
    fix = f"or train the adapter on an unquantized base: `-- --{key} false`."
    version = _installed(facts, "bitsandbytes")
    if version is None:
        return (f"{_given(setup, key, True)} quantizes the base model with bitsandbytes, which is not installed "
                f"here: every rank would stop loading the model. Install it ({install_command('bitsandbytes')}, the "
                f"version of the locks), {fix}")
    if facts.gpu_count and (problem := bitsandbytes_cuda_problem()):
        return (f"{_given(setup, key, True)} quantizes the base model with bitsandbytes {version}, and {problem}: "
                "every rank would stop at the first quantized layer. Reinstall the locked wheel "
                f"({install_command('bitsandbytes', '--force-reinstall ')}: its CUDA library must match torch's "
                "CUDA; `python -m launch doctor` runs a 4-bit round trip), " + fix)
    return None


# transformers 5.23 (modeling_utils `_check_and_adjust_attn_implementation`): flash_attention_N loads the package of
# FLASH_ATTENTION_COMPATIBILITY_MATRIX, and when it is missing a build from the Hugging Face kernels hub through the
# `kernels` package; a hub name (`org/name`) needs `kernels` alone.
FLASH_PACKAGES = {"flash_attention_2": "flash-attn", "flash_attention_3": "flash-attn-3",
                  "flash_attention_4": "flash-attn-4"}


@rule(machine=True)
def flash_attention_installed(setup, facts: Facts):
    attn = str(setup.training.get("attn_implementation") or "sdpa")
    package = FLASH_PACKAGES.get(attn)
    hub = "/" in attn
    if setup.options.cpu or not (package or hub) or (package and _installed(facts, package)):
        return None
    usable, why = kernels_route()
    if usable:
        return None
    needs = (f"the {package} package or, when it is missing, a build of the Hugging Face kernels hub" if package
             else "a build of the Hugging Face kernels hub")
    install = {"flash-attn": f"{install_command('flash-attn', '--no-build-isolation ')} (a long compile; the "
                             "image builds it with FLASH_ATTN=1)",
               "flash-attn-4": f"{install_command('flash-attn-4')} (compute capability 9.0 or newer)",
               "flash-attn-3": "flash-attn-3 (a build from FlashAttention's hopper/ sources; no lock has it)"}
    fix = f"Install it ({install.get(package)}), or use" if package else "Use"
    return (f"{_given(setup, 'attn_implementation', attn)} needs {needs} (the `kernels` package, {why}); neither is "
            f"here, so every rank would stop loading the model. {fix} SDPA, which every recipe runs: "
            "`-- --attn_implementation sdpa`.")


@rule(machine=True)
def deepspeed_cpu_adam_buildable(setup, facts: Facts):
    # With the optimizer offloaded, Accelerate replaces the optimizer with DeepSpeedCPUAdam, which loads DeepSpeed's
    # cpu_adam op: prebuilt for this accelerator, or JIT-compiled at the first step (deepspeed 0.19.8
    # op_builder/builder.py: `load`, then `jit_load`, which needs ninja and torch's C++ extension build)
    if setup.layout.kind != "deepspeed" or not setup.layout.offload_optimizer:
        return None
    missing = [tool for tool, found in jit_build_tools().items() if not found]
    if not missing:
        return None
    built, accelerator = deepspeed_prebuilt_ops()
    if "cpu_adam" in built and accelerator == ("cpu" if setup.options.cpu else "cuda"):
        return None
    fixes = "; ".join(f"{tool}: {JIT_TOOLS_FIX[tool].format(version=locked_version('ninja'))}" for tool in missing)
    return (f"The Accelerate config offloads the optimizer to the CPU (offload_optimizer_device in "
            f"{setup.recipe.accelerate_config_path}), so DeepSpeed runs Adam with its cpu_adam op, which this "
            f"DeepSpeed did not build when installed and compiles at the first step; the compile needs "
            f"{', '.join(missing)}, which this machine lacks (looked up on the PATH the ranks inherit): every rank "
            f"would stop at its first step. Install {'them' if len(missing) > 1 else 'it'} ({fixes}), or turn the "
            "offload off: `offload_optimizer_device: none` in the Accelerate config (`python -m launch plan` shows "
            "the GPU memory the optimizer state then needs).")


@rule()
def precision_fits_device(setup, facts: Facts):
    if setup.options.cpu and is_on(setup.training.get("fp16")):
        return (
            "fp16 mixed precision was asked for a CPU run; Accelerate has no fp16 autocast on CPU (the Accelerator "
            "would stop with \"fp16 mixed precision requires a device in ...\"). Drop --fp16: the CPU path trains in "
            "fp32, or in bf16 with `-- --bf16 true` (torch's CPU autocast, the recipe's own load dtype)."
        )
    return None


# The typical magnitudes the pure-16-bit rule checks an update against: RMSNorm scales start at 1.0 (the largest
# weights of a decoder, so the first whose updates round away), and a trained linear layer's weights are of the size of
# its initialisation, std 0.02 (transformers' `initializer_range` default, Llama / Qwen configs).
NORM_SCALE = 1.0
LINEAR_WEIGHT = 0.02


def _adapter_magnitude(setup, facts: Facts) -> float | None:
    """Typical |weight| of a LoRA A matrix at initialisation: PEFT's kaiming_uniform(a=sqrt(5)) draws from
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), mean |w| = 1/(2 sqrt(fan_in)), fan_in = hidden_size (B starts at zero, where
    no update rounds away). None when the model's config.json was not read."""
    hidden = getattr(facts.model_config, "hidden_size", None)
    return 1 / (2 * math.sqrt(hidden)) if hidden else None


@rule(doc=(
    "trainable weights with an fp32 master copy (fp32 `dtype` under DDP), or --pure-bf16",
    "pure bf16 training silently rounds away every Adam update below half a bf16 step of its weight "
    "(at 1.0: lr < 2^-8)"))
def pure_16bit_update_rounds_away(setup, facts: Facts):
    precision = setup.precision
    if precision.load_dtype == "auto" and facts.model_config is not None:  # `dtype: auto`: the checkpoint's own
        checkpoint = getattr(facts.model_config, "dtype", None) or getattr(facts.model_config, "torch_dtype", None)
        precision = Precision.resolve(setup.layout.kind, setup.accelerate, setup.training,
                                      Adapter.from_training(setup.training), "cpu" if setup.options.cpu else "gpu",
                                      checkpoint_dtype=str(checkpoint or ""), sp=setup.layout.sp)
    if not precision.pure_16bit or setup.options.pure_bf16:
        return None
    lr = float(setup.training.get("learning_rate") or 0)
    dtype = precision.trainable_dtype
    if precision.adapter:
        magnitude = _adapter_magnitude(setup, facts)
        if magnitude is None:
            return None
        what = f"of the LoRA A weights at their typical size ({magnitude:.2g} at initialisation)"
    else:
        magnitude = NORM_SCALE
        what = "of the weights near 1.0 (the RMSNorm scales)"
    half = half_step(dtype, magnitude)
    if lr >= half:
        return None
    where = f"`dtype: {precision.load_dtype}`" + (f" ({setup.explicit['dtype'][1]})" if "dtype" in setup.explicit
                                                   else "")
    trained = "adapter" if precision.adapter else "model"
    also = "" if precision.adapter else (
        f", and most updates of weights of typical size {LINEAR_WEIGHT} (half a step there is "
        f"{half_step(dtype, LINEAR_WEIGHT):.2g})")
    fix = ("Train the adapter in fp32: PEFT does unless the base is quantized; TRL 1.16 casts a quantized model's "
           "adapter to bf16, which FSDP1 with mixed precision upcasts again (qlora-fsdp), or use a larger "
           "learning_rate" if precision.adapter else
           "Load the model in fp32 (`dtype: float32` in config.yaml, or `-- --dtype float32`): the Trainer's "
           f"`{precision.mixed}: true` then computes in {precision.compute_dtype} under autocast and Adam updates fp32 "
           f"masters ({precision.bytes_per_param} bytes per parameter now, 16 then: `python -m launch plan` shows "
           "what fits); or use a strategy that keeps fp32 masters (DeepSpeed ZeRO, FSDP)")
    return (
        f"This run trains pure {dtype}: {where} under {setup.layout.strategy} keeps the trainable {trained} weights, "
        f"their gradients and Adam's states in {dtype} and updates the weights in place, with no fp32 master copy "
        f"(`{precision.mixed}` mixed precision only autocasts). An Adam update is about the learning rate in size, "
        f"and one smaller than half a {dtype} step of its weight rounds back to the weight: at learning_rate {lr:g} "
        f"every update {what} is lost (half a step there is {half:.2g}){also}, so the run silently trains less than "
        f"it says. {fix}. To train pure {dtype} on purpose, pass --pure-bf16."
    )


@rule(doc=(
    "checkpointing under one name: `activation_checkpointing*`, or only the deprecated `gradient_checkpointing*`",
    "transformers ignores `gradient_checkpointing*` without a word when `activation_checkpointing*` is set"))
def checkpointing_one_name(setup, facts: Facts):
    # transformers 5.23 TrainingArguments.__post_init__: the deprecated name is used only when the new one is unset
    problems = []
    for old, new, where in alias_ignored(setup.training, setup.explicit):
        problems.append(
            f"`{old}` is given as {setup.training.get(old)!r} ({where}), but `{new}` is set to "
            f"{setup.training.get(new)!r} ({setup.explicit[new][1]}), and transformers ignores the "
            f"deprecated `{old}` whenever `{new}` is set: the run would use {setup.training.get(new)!r}. Give the "
            f"value under the current name instead, e.g. `-- --{new} "
            f"{_argv_value(setup.training.get(old))}`.")
    return "\n".join(problems) or None


def _argv_value(value) -> str:
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


@rule(feature="context_parallel", doc=(
    "`activation_checkpointing: false` when the FSDP config checkpoints (`fsdp_activation_checkpointing: true`)",
    "Trainer: \"`fsdp_config['activation_checkpointing']` (FSDP's own activation checkpointing) and the "
    "`activation_checkpointing` training argument can't both be set to True. ...\""))
def checkpointing_not_twice(setup, facts: Facts):
    fsdp = setup.accelerate.get("fsdp_config") or {}
    ckpt = setup.checkpointing  # both names resolved once (launch.config.training_args.checkpointing)
    if is_on(fsdp.get("fsdp_activation_checkpointing")) and ckpt.enabled:
        where = setup.explicit.get(ckpt.name, (0, "TRL's default"))[1]
        return (
            "FSDP activation checkpointing (fsdp_activation_checkpointing in the Accelerate config) and activation "
            f"checkpointing in the training arguments (`{ckpt.name}: true`, from {where}) cannot both be on "
            "(transformers refuses it; TRL's SFTConfig defaults gradient_checkpointing to true). Pass "
            "`-- --activation_checkpointing false` (or set `activation_checkpointing: false` in config.yaml; the "
            "current name wins over the deprecated `gradient_checkpointing`), or set "
            "`fsdp_activation_checkpointing: false` in the Accelerate config."
        )
    return None


# ---- Sequence parallelism (ALST/Ulysses, DeepSpeed) -----------------------------------------------------------
@rule(needs_model=True, feature="sequence_parallel", applies=lambda setup: _sp(setup) > 1, doc=(
    "query heads divisible by sp; KV heads divide sp or are divisible by it",
    "DeepSpeed: \"Attention head count ... is not divisible by SP size ...\""))
def sp_heads_divisible(setup, facts: Facts):
    sp = _sp(setup)
    cfg = facts.model_config
    q = getattr(cfg, "num_attention_heads", None)
    kv = getattr(cfg, "num_key_value_heads", None) or q
    problems = []
    if q and q % sp:
        problems.append(f"its {q} query heads are not divisible by sp_size={sp}")
    if kv and kv % sp and sp % kv:
        problems.append(f"its {kv} KV heads neither divide sp_size={sp} nor are divisible by it")
    if problems:
        return (f"Ulysses sequence parallelism splits attention heads across the sp group, and the model "
                f"({setup.training.get('model_name_or_path')}) does not allow sp_size={sp}: {'; '.join(problems)}. "
                "Choose an sp_size that divides the query heads (--sp-size).")
    return None


@rule(feature="sequence_parallel", doc=(
    "`pad_to_multiple_of` a multiple of sp",
    "DeepSpeed: \"batch's seqlen=L isn't divisible by sp-size=S\""))
def sp_sequence_divisible(setup, facts: Facts):
    sp = _sp(setup)
    if sp <= 1:
        return None
    if problem := length_multiple_problem(setup, sp, (
            f"With sp_size={sp} every batch's sequence length must be divisible by {sp} (DeepSpeed: \"batch's "
            f"seqlen=L isn't divisible by sp-size={sp}\")")):
        return problem
    t = setup.training
    # synthetic rows are always exactly max_length tokens (launch.rank.synthetic): equal shapes without padding
    synthetic = bool(getattr(setup.options, "synthetic", False) or t.get("synthetic"))
    if setup.options.cpu and not synthetic and int(t["pad_to_multiple_of"]) != int(t.get("max_length") or 0):
        return ("On CPU, gloo all-gathers only equal shapes (\"ProcessGroupGloo::allgather: invalid tensor size\"), so "
                "every SP batch must have the same length: set pad_to_multiple_of equal to max_length "
                f"({t.get('max_length')}).")
    return None


@rule(feature="sequence_parallel", doc=(
    "`attn_implementation` FlashAttention 2/3 or SDPA, equal to `parallelism_config_sp_attn_implementation`",
    "DeepSpeed refuses eager and flex attention, and a mismatch (\"core_attn_implementation ... does not match\")"))
def sp_attention_supported(setup, facts: Facts):
    if _sp(setup) <= 1:
        return None
    model_attn = setup.training.get("attn_implementation")
    sp_attn = (setup.accelerate.get("parallelism_config") or {}).get(SP_ATTENTION_KEY, model_attn)
    if model_attn not in SP_ATTENTION or sp_attn not in SP_ATTENTION:
        return (f"Ulysses sequence parallelism needs FlashAttention 2/3 or SDPA; got attn_implementation="
                f"{model_attn}, {SP_ATTENTION_KEY}={sp_attn}. Eager and flex attention are "
                "refused (their 4D attention mask is dropped).")
    if model_attn != sp_attn:
        return (f"attn_implementation ({model_attn}) and {SP_ATTENTION_KEY} ({sp_attn}) must be "
                "the same (DeepSpeed: \"core_attn_implementation ... does not match model config "
                "attn_implementation\").")
    return None


@rule(feature="sequence_parallel", doc=(
    "`packing_strategy: wrapped` (or no packing), `padding_free` off",
    "IndexError in DeepSpeed's UlyssesSPDataLoaderAdapter.refill (bfd packing's 1-D cu_seq_lens cannot be sharded)"))
def sp_packing_safe(setup, facts: Facts):
    if _sp(setup) <= 1:
        return None
    t = setup.training
    if t.get("padding_free") or (t.get("packing") and t.get("packing_strategy", "bfd") != "wrapped"):
        return ("With sequence parallelism, use `packing_strategy: wrapped` (or no packing) and padding_free off: "
                "TRL's "
                "bfd packing and padding-free batches carry 1-D cu_seq_lens that DeepSpeed's SP data loader cannot "
                "shard (IndexError in UlyssesSPDataLoaderAdapter.refill). Wrapped rows are plain fixed-length token "
                "windows; with SDPA, documents that share a row attend to each other, as in any wrapped packing.")
    return None


@rule(feature="sequence_parallel", doc=(
    "DeepSpeed ZeRO stage 1, 2 or 3",
    "stage 0 crashes (DeepSpeed #7833)"))
def sp_zero_stage(setup, facts: Facts):
    if _sp(setup) > 1 and setup.layout.zero_stage not in (1, 2, 3):
        return (f"Ulysses sequence parallelism runs on DeepSpeed ZeRO stage 1, 2 or 3 (stage {setup.layout.zero_stage} "
                "crashes, DeepSpeed #7833): use distributed_type DEEPSPEED with zero_stage 1-3.")
    return None


@rule(feature="alst", doc=("`tiled_mlp` only with DeepSpeed",
                          "wrong gradients: DDP and FSDP would reduce a partial one"))
def tiled_mlp_needs_deepspeed(setup, facts: Facts):
    if setup.training.get("tiled_mlp") and setup.layout.kind != "deepspeed":
        return ("`tiled_mlp` needs DeepSpeed (ZeRO stage 1-3): DeepSpeed's TiledMLP accumulates each weight's gradient "
                "over the tiles and hands it to ZeRO only after the last tile; DDP and FSDP would reduce a partial "
                "one.")
    return None


@rule(feature="alst", doc=("no TRL `activation_offloading` with ZeRO-3 "
                          "(use `gradient_checkpointing_kwargs: {offload: true}`)",
           "AttributeError: 'Tensor' object has no attribute 'ds_status' in TRL's fused loss"))
def activation_offloading_without_zero3(setup, facts: Facts):
    if setup.training.get("activation_offloading") and setup.layout.zero_stage == 3:
        return ("activation_offloading cannot be combined with DeepSpeed ZeRO-3 here: TRL's offloader works through "
                "PyTorch saved-tensor hooks, which hand a saved parameter back to the backward as a new tensor object; "
                "TRL's fused loss saves the lm_head weight and, under ZeRO-3, reads DeepSpeed's `ds_status` from it in "
                "the backward (\"AttributeError: 'Tensor' object has no attribute 'ds_status'\" in "
                "trl/kernels/chunked_logprob.py). Set `activation_offloading: false` (gradient checkpointing stays), "
                "or "
                "use ZeRO stage 1/2.")
    return None


# ---- Ring-attention context parallelism (FSDP2) ------------------------------------------------------------------
@rule(feature="context_parallel", doc=(
    "FSDP version 2",
    "Accelerate: \"Using `cp_size>1` requires FSDP2, but the provided `fsdp_plugin` is using FSDP1.\""))
def cp_needs_fsdp2(setup, facts: Facts):
    if _cp(setup) > 1 and not _fsdp2(setup):
        return ("Ring-attention context parallelism runs on FSDP2 only: set distributed_type: FSDP and "
                "fsdp_config.fsdp_version: 2 in the Accelerate config (Accelerate: \"Using `cp_size>1` requires "
                "FSDP2\").")
    return None


@rule(feature="context_parallel", doc=(
    "`pad_to_multiple_of` a multiple of 2 x cp",
    "a length not divisible by cp: uneven shards and the collectives fail; divisible by cp but not 2 x cp: torch "
    "silently turns load balancing off"))
def cp_sequence_divisible(setup, facts: Facts):
    cp = _cp(setup)
    if cp <= 1:
        return None
    return length_multiple_problem(setup, 2 * cp, (
        f"With cp_size={cp} every sequence length must be divisible by 2 x cp_size = {2 * cp}: torch's head-tail "
        "load balancing cuts it into 2 x cp chunks (a length not divisible by cp makes the collectives fail; one "
        "divisible by cp only silently unbalances the work)"))


@rule(feature="context_parallel", doc=(
    "`attn_implementation: sdpa`",
    "Trainer: \"Context parallelism is supported only with SDPA attention, you are using ...\""))
def cp_attention_sdpa(setup, facts: Facts):
    attn = setup.training.get("attn_implementation")
    if _cp(setup) > 1 and attn != CP_ATTENTION:
        return (f"Ring-attention context parallelism supports SDPA attention only, not {attn} (transformers: "
                "\"Context parallelism is supported only with SDPA attention\"). Set attn_implementation: sdpa.")
    return None


@rule(needs_model=True, feature="context_parallel", applies=lambda setup: _cp(setup) > 1, doc=(
    "a full-attention model (no sliding-window layers)",
    "CP computes full causal attention: the window would silently widen (accelerate PR #4177 refuses it)"))
def cp_causal_only(setup, facts: Facts):
    cfg = facts.model_config
    layer_types = getattr(cfg, "layer_types", None) or []
    sliding = getattr(cfg, "use_sliding_window", False) or any("sliding" in str(t) for t in layer_types)
    if sliding:
        return (f"The model ({setup.training.get('model_name_or_path')}) uses sliding-window attention; context "
                "parallelism only computes full causal attention and would silently widen the window (accelerate PR "
                "#4177 refuses it). Use a model without sliding-window layers, or Ulysses SP.")
    return None


@rule(feature="context_parallel", doc=(
    "`packing: false`",
    "TRL: \"Packing is not compatible with context parallelism (`cp_size > 1`). ...\""))
def cp_no_packing(setup, facts: Facts):
    if _cp(setup) > 1 and (setup.training.get("packing") or setup.training.get("padding_free")):
        return ("Packing is not compatible with context parallelism (TRL: \"Packing is not compatible with context "
                "parallelism (`cp_size > 1`)\"): CP drops the per-layer attention mask, so packed documents would "
                "attend to each other. Set packing: false and use samples as long as the sequence length.")
    return None


@rule(doc=(
    "no `fsdp_offload_params: true` on a CPU run (FSDP1 or FSDP2, with or without CP)",
    "torch: \"Cannot access accelerator device when none is available\", in every rank after loading"))
def fsdp_param_offload_not_on_cpu(setup, facts: Facts):
    # issue 36: any FSDP run on CPU, not only CP ones (measured: FSDP2 without CP, and FSDP1, fail the same way)
    fsdp = setup.accelerate.get("fsdp_config") or {}
    if setup.layout.sharding == "fsdp" and setup.options.cpu and is_on(fsdp.get("fsdp_offload_params")):
        return (f"fsdp_offload_params: true moves {setup.layout.kind.upper()}'s parameters from the accelerator to "
                "host memory; on a CPU run there is no accelerator and every rank fails after loading (torch: \"Cannot "
                "access accelerator device when none is available\"). Set fsdp_offload_params: false in the "
                "Accelerate config's fsdp_config for CPU runs (the parameters are in host memory already).")
    return None


# ---- FSDP2 (and HSDP through parallelism_config) -----------------------------------------------------------------
# Accelerate's FullyShardedDataParallelPlugin reads FSDP1's keys under fsdp_version 2 in the ranks only, after the
# model has loaded, and there it only warns and drops most of them ("Multiple deprecation warnings due to FSDP2
# conversion", accelerate/utils/dataclasses.py): a sharding strategy other than full sharding is silently lost.
FSDP1_STRATEGY_IN_FSDP2 = {
    "HYBRID_SHARD": "HSDP in FSDP2 is parallelism_config: parallelism_config_dp_replicate_size (replicas, e.g. one "
                    "per node) x parallelism_config_dp_shard_size (GPUs that shard one copy)",
    "HYBRID_SHARD_ZERO2": "HSDP in FSDP2 is parallelism_config (dp_replicate x dp_shard), plus "
                           "fsdp_reshard_after_forward: false",
    "SHARD_GRAD_OP": "FSDP2 spells it fsdp_reshard_after_forward: false",
    "NO_SHARD": "an unsharded run is DDP (distributed_type: MULTI_GPU)",
}


@rule(feature="fsdp2", doc=(
    "with `fsdp_version: 2`, no FSDP1-only setting (`fsdp_sharding_strategy` other than FULL_SHARD, "
    "`fsdp_forward_prefetch`, an FSDP1 strategy name as `fsdp_reshard_after_forward`)",
    "Accelerate drops the strategy with a warning (full sharding instead), or raises in every rank after loading"))
def fsdp2_without_fsdp1_settings(setup, facts: Facts):
    if not _fsdp2(setup):
        return None
    fsdp = setup.accelerate.get("fsdp_config") or {}
    found = []
    strategy = str(fsdp.get("fsdp_sharding_strategy") or "FULL_SHARD").upper()
    if strategy not in ("FULL_SHARD", "1"):
        meaning = FSDP1_STRATEGY_IN_FSDP2.get(strategy, "not an FSDP2 setting")
        found.append(f"fsdp_sharding_strategy: {strategy} ({meaning})")
    if is_on(fsdp.get("fsdp_forward_prefetch")):
        found.append("fsdp_forward_prefetch: true (Accelerate: \"forward_prefetch is not yet implemented in FSDP2\"; "
                     "FSDP2 prefetches the next layer's all-gather by itself)")
    raf = fsdp.get("fsdp_reshard_after_forward")
    if isinstance(raf, str) and raf.strip().lower() not in ("true", "false", "1", "0", "yes", "no"):
        found.append(f"fsdp_reshard_after_forward: {raf} (an FSDP1 strategy name; FSDP2 takes true or false)")
    if not found:
        return None
    return ("The Accelerate config asks for FSDP2 (fsdp_version: 2) with FSDP1-only settings that FSDP2 ignores or "
            "refuses in the ranks after the model has loaded: " + "; ".join(found) + ". Change them in the "
            "Accelerate config's fsdp_config (or use fsdp_version: 1).")


@rule(feature="fsdp2", doc=(
    "with FSDP2 and a `parallelism_config` on more than one process, a mesh dimension to shard over: `dp_shard` or "
    "`cp` above 1",
    "Accelerate: \"FSDP is enabled but the parallelism config has no dimension for FSDP to shard across\", in "
    "every rank"))
def fsdp2_has_a_shard_dimension(setup, facts: Facts):
    # issue 36: Accelerate's ParallelismConfig checks this only in the ranks (_validate_accelerator), after start-up;
    # a single process is exempt there (no distributed setup: a valid config, e.g. a one-GPU fsdp2 run)
    m = setup.layout.mesh
    if (not _fsdp2(setup) or not setup.accelerate.get("parallelism_config") or m["dp_shard"] > 1 or m["cp"] > 1
            or setup.layout.world_size == 1):
        return None
    return (f"The mesh gives FSDP2 nothing to shard over: dp_shard {m['dp_shard']} and cp {m['cp']} (with dp_replicate "
            f"{m['dp_replicate']}), and FSDP2 shards the model over dp_shard x cp; Accelerate refuses it in every rank "
            "(\"FSDP is enabled but the parallelism config has no dimension for FSDP to shard across\"). Give FSDP2 a "
            "shard group, with dp_replicate x dp_shard still the processes (e.g. --dp-replicate-size 1 --dp-shard-size "
            f"{m['dp_replicate']}: one copy sharded over all of them), or, to keep a whole copy of the model on every "
            "process, use DDP (distributed_type: MULTI_GPU).")


# ---- FSDP's state-dict type: the final weights must be written (templates/train.py, launch/rank/consolidate.py) ------
# torch's StateDictType by value (1, 2, 3), in Accelerate's own list (an unknown name is refused earlier, with the
# Accelerate config's other enum values: launch.config.accelerate_config)
STATE_DICT_TYPES = tuple(FSDP_STATE_DICT_TYPE)


def fsdp_state_dict_type(accelerate: dict) -> str | None:
    """The state-dict type an Accelerate config gives the ranks' FSDP plugin (None: not FSDP), as Accelerate 1.15's
    `FullyShardedDataParallelPlugin.set_state_dict_type` reads it: `fsdp_state_dict_type` by name (any case) or by
    StateDictType value; absent, FULL_STATE_DICT under FSDP1 and SHARDED_STATE_DICT under FSDP2. An unknown value is
    returned as written, in upper case."""
    if accelerate.get("distributed_type") != "FSDP":
        return None
    fsdp = accelerate.get("fsdp_config") or {}
    value = str(fsdp.get("fsdp_state_dict_type") or "").strip().upper()
    if not value:
        return STATE_DICT_TYPES[0] if str(fsdp.get("fsdp_version") or 1) == "1" else STATE_DICT_TYPES[2]
    if value.isdigit() and 1 <= int(value) <= len(STATE_DICT_TYPES):
        return STATE_DICT_TYPES[int(value) - 1]
    return value


@rule(doc=(
    "under FSDP, `fsdp_state_dict_type` FULL_STATE_DICT or SHARDED_STATE_DICT",
    "LOCAL_STATE_DICT: no final weights are written (FSDP2 refuses it in every rank)"))
def fsdp_state_dict_type_saves_weights(setup, facts: Facts):
    kind = fsdp_state_dict_type(setup.accelerate)
    if kind in (None, "FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        return None
    path = setup.recipe.accelerate_config_path
    why = ("each rank would save only its own flat shard of FSDP1's parameters, which neither transformers' "
           "save_model nor train.py turns into weights: the run would end with no weights in final/ (and FSDP2 "
           "refuses LOCAL_STATE_DICT in every rank, after the model has loaded)")
    return (f"fsdp_state_dict_type {kind} in {path}: {why}. Use SHARDED_STATE_DICT (every rank writes its shard; at "
            "the end train.py consolidates the shards into safetensors files, a few GB per process at a time) or "
            "FULL_STATE_DICT (the whole model gathered in the first process's host memory at every save).")


# ---- Adapters (LoRA / QLoRA: launch.config.adapter)
# --------------------------------------------------------------------
def _adapter(setup):
    return Adapter.from_training(setup.training)


def _storage_shards(setup) -> bool:
    """Whether the layout shards parameters themselves (FSDP, ZeRO-3), so that a quantized base must be stored in a
    dtype the sharding can split."""
    return setup.layout.sharding == "fsdp" or (setup.layout.sharding == "zero" and setup.layout.zero_stage == 3)


@rule(feature="adapters", doc=(
    "`lora_r` at least 1",
    "PEFT refuses the rank in every rank, after the base model has loaded"))
def lora_rank_positive(setup, facts: Facts):
    a = _adapter(setup)
    if a is None or a.r >= 1:
        return None
    return (f"lora_r is {a.r}: a LoRA rank is the number of columns of the low-rank update, at least 1 (PEFT's "
            "LoraConfig refuses it in every rank after the base model has loaded). Set lora_r to a positive integer "
            "(8-64 is usual; the recipes use 16).")


# issue 36: adapter settings that PEFT, TRL or transformers refuse only in the ranks, after the model has loaded, or
# that train nothing and exit 0
@rule(feature="adapters", doc=(
    "`lora_alpha` positive",
    "0: the adapter's update is scaled by 0, nothing trains (grad_norm 0), the untrained adapter is saved, exit 0"))
def lora_alpha_positive(setup, facts: Facts):
    # PEFT accepts any alpha. 0 scales the update B A x by alpha / r = 0: both gradients are 0 and the run saves an
    # untrained adapter, exit 0. A negative alpha trains exactly the run of |alpha| mirrored (B becomes -B: SGD and
    # Adam are odd in the gradient), so it is never needed; refused too, so that one run has one alpha in its resume
    # identity (launch.config.adapter.Adapter.identity) and a slip of the sign is caught.
    a = _adapter(setup)
    if a is None or a.alpha > 0:
        return None
    why = ("makes every gradient of lora_A and lora_B 0 (grad_norm 0 at every step, DoRA's magnitudes aside): the "
           "untrained adapter would be saved as final/, with exit status 0") if a.alpha == 0 else (
           "only flips the sign of the update, which training undoes (it trains the run of the positive alpha, with "
           "lora_B negated)")
    return (f"lora_alpha is {a.alpha}: LoRA scales its update B A x by lora_alpha / lora_r (lora_alpha / sqrt(lora_r) "
            f"with use_rslora), so {a.alpha} {why}. Set lora_alpha to a positive integer (the recipes use 2 x lora_r, "
            f"here {max(2 * a.r, 1)}).")


@rule(feature="adapters", doc=(
    "`lora_dropout` in [0, 1)",
    "outside [0, 1]: torch's \"dropout probability has to be between 0 and 1\" in every rank after loading; 1: "
    "the adapter sees only zeros and trains nothing, exit 0"))
def lora_dropout_in_range(setup, facts: Facts):
    a = _adapter(setup)
    if a is None or 0 <= a.dropout < 1:
        return None
    why = ("torch.nn.Dropout refuses it in every rank after the base model has loaded (\"dropout probability has to "
           "be between 0 and 1\")") if not 0 <= a.dropout <= 1 else (
           "a dropout of 1 zeroes the adapter's input at every training step, so its gradients are 0 and the untrained "
           "adapter would be saved, with exit status 0")
    return (f"lora_dropout is {a.dropout:g}: it is the probability that LoRA drops each input element of the adapter "
            f"during training, and {why}. Set lora_dropout in [0, 1): 0.05 is TRL's default, 0 turns it off.")


@rule(feature="adapters", doc=(
    "`load_in_4bit` / `load_in_8bit` only with an adapter (`use_peft: true`)",
    "transformers: \"You cannot perform fine-tuning on purely quantized models\", in every rank after loading"))
def quantized_base_needs_adapter(setup, facts: Facts):
    t = setup.training
    bits = [b for b in (4, 8) if is_on(t.get(f"load_in_{b}bit", False))]
    if not bits or _adapter(setup) is not None:
        return None
    return (f"load_in_{bits[0]}bit is on but use_peft is off: TRL would load the base quantized "
            f"({bits[0]}-bit weights, which cannot be trained) and train no adapter on it, and transformers' Trainer "
            "refuses that in every rank after the model has loaded (\"You cannot perform fine-tuning on purely "
            "quantized models\"). Add `--use_peft true` (QLoRA: a LoRA adapter on the quantized base), or drop "
            f"load_in_{bits[0]}bit for a full fine-tune.")


@rule(feature="adapters", doc=(
    "at most one of `load_in_4bit` and `load_in_8bit`",
    "TRL: \"You can't use 8 bit and 4 bit precision at the same time\", in every rank"))
def quantization_one_kind(setup, facts: Facts):
    t = setup.training
    if not (is_on(t.get("load_in_4bit", False)) and is_on(t.get("load_in_8bit", False))):
        return None
    return ("load_in_4bit and load_in_8bit are both on: a base is quantized one way, and TRL's ModelConfig refuses "
            "both in every rank (\"You can't use 8 bit and 4 bit precision at the same time\"). Keep load_in_4bit "
            "(QLoRA, the recipes' choice) or load_in_8bit, and set the other false.")


@rule(needs_model=True, feature="adapters",
      applies=lambda setup: _adapter(setup) is not None, doc=(
          "`lora_target_modules` match at least one layer LoRA can wrap, and nothing else",
          "PEFT: \"Target modules ... not found in the base model\" (or \"Target module ... is not supported\"), "
          "in every rank after loading"))
def lora_targets_match(setup, facts: Facts):
    # The module names are the model's own, from the model built on the meta device (launch.facts.meta_model), so any
    # model
    # type is checked; a model that cannot be built here (custom code) is left to PEFT in the ranks.
    found = meta_model.modules(facts.model_config)
    if found is None:
        return None
    a = _adapter(setup)
    model = setup.training.get("model_name_or_path")
    if a.target_modules is None and (default := meta_model.default_targets(found.model_type)) is None:
        return (f"lora_target_modules is not set and PEFT has no default targets for the model type "
                f"{found.model_type!r} of {model} (it would stop every rank after loading: \"Please specify "
                "`target_modules` in `peft_config`\"). Name its layers, or use all-linear; its linear layers are "
                f"{', '.join(found.layer_linears())}.")
    targets = a if a.target_modules is not None else dataclasses.replace(a, target_modules=default)
    matched = targets.targets(found.kinds, output_layer=(found.output_layer or "lm_head").rsplit(".", 1)[-1])
    if a.all_linear:
        matched = [n for n in matched if n in found.linear]
    unsupported = sorted({f"{n.rsplit('.', 1)[-1]} ({found.kinds[n]})" for n in matched if not found.wrappable(n)})
    if matched and not unsupported:
        return None
    shown = list(a.target_modules) if isinstance(a.target_modules, tuple) else a.target_modules
    layers = ", ".join(found.layer_linears())
    if not matched:
        return (f"lora_target_modules {shown!r} match none of the linear layers of {model} (PEFT would stop every rank "
                "after loading with \"Target modules ... not found in the base model\"). Its linear layers are "
                f"{layers}; name some of them (a list matches a module whose name ends with an entry; a single string "
                "is a regular expression over the whole name), or use all-linear.")
    return (f"lora_target_modules {shown!r} match module(s) of {model} that LoRA cannot wrap: {', '.join(unsupported)} "
            "(PEFT would stop every rank after loading with \"Target module ... is not supported\"). Name linear "
            f"layers instead: {layers}; or use all-linear.")


@rule(feature="adapters", doc=(
    "a quantized base under FSDP or ZeRO-3: `load_in_4bit` with `bnb_4bit_quant_storage` equal to `dtype` "
    "(e.g. both bfloat16); no `load_in_8bit`",
    "FSDP shards only floating-point storage: Accelerate leaves uint8 4-bit weights whole on every GPU (a warning), "
    "mixed dtypes fail to flatten"))
def quantized_base_shardable(setup, facts: Facts):
    a = _adapter(setup)
    if a is None or a.quantization is None or not _storage_shards(setup):
        return None
    q = a.quantization
    where = setup.layout.strategy
    if q.bits == 8:
        return (f"load_in_8bit cannot be sharded by {where}: LLM.int8 weights are int8 tensors with their own "
                "statistics, which FSDP and ZeRO-3 cannot split. Use QLoRA's 4-bit base (load_in_4bit: true, "
                "bnb_4bit_quant_storage: bfloat16, dtype: bfloat16) or a layout that keeps the weights whole (DDP).")
    load = str(setup.training.get("dtype") or "float32").replace("torch.", "")
    if q.storage_dtype == load and load in ("bfloat16", "float16", "float32"):
        return None
    return (f"load_in_4bit under {where} needs bnb_4bit_quant_storage equal to the model's dtype (now "
            f"{q.storage_dtype} and {load}): FSDP and ZeRO-3 shard only floating-point tensors of one dtype, so "
            "bitsandbytes must pack the 4-bit weights into that dtype (PEFT's and bitsandbytes' FSDP-QLoRA docs). With "
            "uint8 storage Accelerate keeps every 4-bit weight whole on every GPU instead. Set "
            "bnb_4bit_quant_storage: bfloat16 and dtype: bfloat16.")


@rule(feature="adapters", doc=(
    "QLoRA (`load_in_4bit`) on CPU only where bitsandbytes' 4-bit path trains on CPU "
    "(`launch.config.adapter.quantization_on_cpu_supported`)",
    "bitsandbytes fails in the ranks after loading"))
def quantized_base_on_cpu(setup, facts: Facts):
    a = _adapter(setup)
    if a is None or a.quantization is None or not setup.options.cpu or quantization_on_cpu_supported():
        return None
    return (f"A {a.quantization.bits}-bit base (load_in_{a.quantization.bits}bit) was asked for on CPU, where "
            "bitsandbytes' quantized training does not run at our pins (launch/config/adapter.py "
            "`quantization_on_cpu_supported` says why). Run it on a GPU, or drop load_in_4bit / load_in_8bit for a "
            "CPU check of the LoRA run (the same adapter on an unquantized base).")


@rule(feature="adapters", doc=(
    "an adapter under FSDP checkpoints with the training config's `activation_checkpointing` (or "
    "`gradient_checkpointing`), not `fsdp_activation_checkpointing`",
    "the adapter is saved EMPTY (0 tensors in final/ and in every checkpoint), silently"))
def adapter_with_fsdp_activation_checkpointing(setup, facts: Facts):
    fsdp = setup.accelerate.get("fsdp_config") or {}
    if (_adapter(setup) is None or setup.layout.sharding != "fsdp"
            or not is_on(fsdp.get("fsdp_activation_checkpointing", False))):
        return None
    return ("A LoRA / QLoRA run under FSDP cannot use fsdp_activation_checkpointing: true. FSDP's checkpointing wraps "
            "each decoder layer in torch's checkpoint_wrapper, so module names gain `._checkpoint_wrapped_module.`, "
            "which PEFT's get_peft_model_state_dict does not strip (it strips `_fsdp_wrapped_module.` only): final/ "
            "and "
            "every checkpoint's adapter_model.safetensors would hold 0 tensors, silently (measured with peft 0.21.2, "
            "accelerate 1.15). Set fsdp_activation_checkpointing: false in the Accelerate config and "
            "activation_checkpointing: true in config.yaml (transformers' checkpointing: the adapter is saved whole).")


@rule(feature="adapters", doc=(
    "no `optim: paged_adamw_8bit` for QLoRA under FSDP",
    "PEFT's FSDP docs: it fails when the checkpoint is saved"))
def qlora_fsdp_optimizer(setup, facts: Facts):
    a = _adapter(setup)
    if (a is None or a.method != "qlora" or setup.layout.sharding != "fsdp"
            or str(setup.training.get("optim") or "") != "paged_adamw_8bit"):
        return None
    return ("optim: paged_adamw_8bit with QLoRA under FSDP fails when the first checkpoint is saved, after the "
            "training time spent to reach it (a caveat of PEFT's FSDP-QLoRA docs, peft docs/source/accelerate/"
            "fsdp.md). Use optim: adamw_torch_fused, the default: the adapter's optimizer states are small anyway.")


def merge_problems(identity: dict | None, allow_quantized: bool = False) -> list[str]:
    """Why the adapter of a finished run cannot be merged into its base (`python -m launch merge`), from the run's
    recorded identity (`launch.run.checkpoints.identity`: its "adapter" entry is `Adapter.identity()`). Merging runs in
    one process on the unsharded base (PEFT's `merge_and_unload` is not supported under FSDP, PEFT's FSDP docs), so
    the training layout itself never stops it; what does: no adapter, or a quantized base, whose merge into the
    unquantized weights is not the model that was trained (unless asked for)."""
    adapter = (identity or {}).get("adapter")
    if not adapter:
        return ["This run trained the whole model (its recorded identity has no adapter): its final folder is already "
                "a full model that loads in transformers, so there is nothing to merge."]
    quant = adapter.get("quantization")
    if quant and not allow_quantized:
        return [f"This adapter was trained on a {quant.get('bits')}-bit base ({adapter.get('method')}): PEFT merges it "
                "into the unquantized weights, which the adapter never saw, so the merged model differs from the "
                "trained one by the quantization error (its eval loss will not reproduce the run's). Merge anyway with "
                "`python -m launch merge RUN_DIR --allow-quantized`, or use the adapter on the 4-bit base as trained."]
    return []


# ---- Long context: positions and memory -------------------------------------------------------------------------
def rope_coverage(setup, config) -> tuple[int | None, str]:
    """How many positions the run's model covers, and what says so: RoPE scaling the run sets through
    model_init_kwargs (factor x original positions), else the model's max_position_embeddings (which already
    includes the model's own scaling, e.g. Llama-3.1's 131,072)."""
    init = setup.training.get("model_init_kwargs") or {}
    run = init.get("rope_parameters") or init.get("rope_scaling") or {}
    positions = getattr(config, "max_position_embeddings", None) if config is not None else None
    if run.get("rope_type", "default") not in ("default", None) and run.get("factor"):
        original = run.get("original_max_position_embeddings") or positions
        over = f" over {original:,} positions" if original else ""
        return (int(float(run["factor"]) * original) if original else None,
                f"the run's {run['rope_type']} RoPE scaling (x{float(run['factor']):g}{over})")
    return positions, "the model's max_position_embeddings"


@rule(needs_model=True, feature="long_context", applies=lambda setup: bool(setup.training.get("max_length")), doc=(
    "`max_length` within the positions the model covers, or RoPE scaling in `model_init_kwargs.rope_parameters` "
    "that covers it",
    "the model sees positions it was never trained on; the loss starts far higher (TRL PR #6846: 10.6 instead of "
    "4.4 at 1M tokens without YaRN)"))
def rope_covers_length(setup, facts: Facts):
    length = int(setup.training["max_length"])
    covered, source = rope_coverage(setup, facts.model_config)
    if not covered or length <= covered:
        return None
    rope = hub.rope_parameters(facts.model_config)
    positions = getattr(facts.model_config, "max_position_embeddings", covered)
    factor = max(2, 1 << math.ceil(math.log2(length / positions)))  # the next power of two
    theta = rope.get("rope_theta")
    return (f"max_length {length:,} is beyond the {covered:,} positions {source} covers "
            f"({setup.training.get('model_name_or_path')}): the model would see positions it was never trained on "
            "(TRL PR #6846 measured a first loss of 10.6 instead of 4.4 at 1M tokens without RoPE scaling). Set RoPE "
            "scaling that covers it in config.yaml, for example YaRN:\n"
            "  model_init_kwargs:\n    rope_parameters:\n      rope_type: yarn\n"
            + (f"      rope_theta: {theta:g}\n" if theta else "")
            + f"      factor: {float(factor):g}\n      original_max_position_embeddings: {positions}\n"
            f"(x{factor} over {positions:,} positions covers {factor * positions:,}), or lower max_length.")


@rule(machine=True, feature="long_context", doc=(
    "offloaded activations and optimizer state fit the node's host memory",
    "the host runs out of (pinned) memory mid-run: the kernel kills a rank, or pinning fails"))
def host_memory_fits(setup, facts: Facts):
    plan = facts.memory
    if plan is None or plan.target.host_memory_gib is None or setup.options.cpu:
        return None
    need, have = plan.estimate.host_per_node_gib, plan.target.host_memory_gib
    if need <= have:
        return None
    terms = ", ".join(f"{t.name} {t.gib:.1f} GiB" for t in plan.estimate.host_terms if t.gib >= 0.05)
    return (f"This run needs {need:.1f} GiB of host memory per node ({plan.layout.processes_per_machine} processes, "
            f"each: {terms}; pinned blocks rounded up to powers of two) and this machine has {have:.1f} GiB. Lower "
            "max_length, turn off `offload` in activation_checkpointing_kwargs (if the GPUs can hold the "
            "checkpoints), or use a machine with more memory; `python -m launch plan RECIPE --host-memory GIB` "
            "shows the table. --force starts it anyway.")


@rule(machine=True, doc=("the planner's peak memory per GPU within the GPU's memory",
                         "CUDA out of memory, after the model has loaded"))
def gpu_memory_fits(setup, facts: Facts):
    plan = facts.memory
    if plan is None or setup.options.cpu or facts.gpu_count == 0:
        return None
    est, have = plan.estimate, plan.target.gpu_memory_gib
    if est.gpu_peak_gib <= have:
        return None
    return (f"The planner predicts {est.gpu_peak_gib:.1f} GiB per GPU and the GPUs here have {have:.1f} GiB: "
            f"{est.advice()} The table above has every term; `python -m launch plan {setup.recipe.name} "
            "--max-length auto` finds the longest length that fits. --force starts it anyway (the prediction is a "
            "model, checked against published runs within 15%).")


def by_name(name: str) -> Rule:
    return next(r for r in RULES if r.name == name)


def skipped_line(setup, facts: Facts, report: Report) -> str | None:
    """One line saying which model-dependent rules were not checked, and why."""
    if not report.skipped:
        return None
    # the memory plan needs the same config.json: say that its table is skipped too, not only the rules
    table = "; the memory table (and the fit check) skipped" if getattr(facts, "memory", None) is None else ""
    return (f"model config of {setup.training.get('model_name_or_path')} not read ({facts.model.problem}): not "
            f"checked: {', '.join(report.skipped)}{table}")

"""Rules every run keeps, whatever its layout: required keys, the script's sections, positive numbers, the
process count and the mesh, the rendezvous, GPUs, inputs, the output folder, the model's folder and
architecture, version floors.
"""

from __future__ import annotations


from packaging.version import Version

from launch.checks.rules.registry import Facts, features, rule
from launch.config import envvars
from launch.config.layout import processes_problem
from launch.facts import hub
from launch.recipe import sections, template as train_template
from launch.recipe.discovery import RECIPES_DIR

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


def _public(version: str) -> Version:
    return Version(Version(version).public)


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
    # the check itself is `launch.config.layout.processes_problem`, which `plan` calls too; this adds the run's flags
    if (found := processes_problem(setup.layout, setup.accelerate)) is None:
        return None
    what, problem = found
    if what == "mesh":
        return (f"{problem} Pass a matching --num-processes, or change the mesh sizes (--dp-shard-size, --sp-size, "
                "--cp-size ...).")
    return f"{problem}; num_processes counts processes on all machines together."


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
    # a machine rank from any source (a stray PET_NODE_RANK=1 on one machine included), checked in one place
    if problem := envvars.machine_rank_problem(o, machines):
        return problem
    if machines > 1 and not o.main_process_ip:
        return (f"Multi-node run over {machines} machines: --main-process-ip (the address of machine rank 0) is not "
                "set, so the other machines would wait for a rendezvous with no host.")
    return None


@rule(machine=True)
def rendezvous_address_resolves(setup, facts: Facts):
    # every machine of a multi-node run waits on this address (machine ranks > 0 for up to
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
    # AutoConfig and from_pretrained fail only in the ranks, 40-65 s after the start
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

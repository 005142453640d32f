"""Optional packages a setting turns on: the setting is refused before start when its package is missing here.

A setting whose package this machine lacks starts every rank, which dies minutes later (at model load or at
trainer.train()) with an ImportError. Each rule here is one package's fact on this machine (machine=True: a plan made
elsewhere is still valid): its version from `facts.versions` (launch.facts.machine.installed_versions), or a probe of
launch.facts.machine run only when the setting is on. The message names the package, the setting and where it was
given, and both fixes: the install command (the version from the lock that has it) and the setting that turns it off.
On CPU the profile turns Liger and FlashAttention off (launch.config.profiles); a `--` argument that turns one back on
is checked like any other.
"""

from __future__ import annotations



from launch.checks.rules.registry import Facts, probes, rule
from launch.facts.machine import installed_versions
from launch.switches import is_on

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
    if facts.gpu_count and (problem := probes().bitsandbytes_cuda_problem()):
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
    usable, why = probes().kernels_route()
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
    missing = [tool for tool, found in probes().jit_build_tools().items() if not found]
    if not missing:
        return None
    built, accelerator = probes().deepspeed_prebuilt_ops()
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

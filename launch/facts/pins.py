"""The pins and the locks under requirements/, read with `packaging`: the one parser for both, and the lock an
environment was set up from.

- `pins.txt`: the direct versions, chosen by hand (`name==version` lines).
- `cpu.lock`, `image.lock`, `image-build.lock`, `flash-attn.lock`: every package of a set, resolved by
  `bash requirements/lock.sh` (uv's `--generate-hashes` format: `name==version \\` then one `--hash=sha256:HEX`
  continuation line for each file of that version on the index, then `# via` comments). Every lock entry must
  carry at least one sha256 hash: ci/setup.sh and the Dockerfile install them with `pip --require-hashes`.
- `*.in`: the names in a set, no versions (`-c pins.txt` lines aside).

Read by `python -m launch doctor` and the tests, and by ci/setup.sh, requirements/lock.sh and the Dockerfile through
`python -m launch.lockfile` (launch/lockfile.py: the command line; the bundle for a machine with its own torch is
launch/facts/bundle.py). The standard library and `packaging` only: ci/setup.sh runs it before any virtualenv exists.

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
# A bundle's manifest (launch/facts/bundle.py writes it): the marker of a virtualenv set up from a bundle copies its
# `machine_packages`, the packages left to the machine's own torch build.
BUNDLE_MANIFEST = "bundle.json"
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


def parse_requirement(where: str, line: str) -> Requirement:
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
        req = parse_requirement(where, line)
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
        req = parse_requirement(where, line)
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
        name = normalize(parse_requirement(where, requirement).name)
        blocks[name] = " \\\n    ".join([requirement] + [f"--hash={h}" for h in hashes]) + "\n"
    return blocks


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


def venv_site_packages(venv: Path) -> list[Path]:
    """The site-packages folders of the virtualenv at `venv` (lib/pythonX.Y/site-packages, lib64's too)."""
    return sorted({p.resolve() for p in Path(venv).glob("lib*/python*/site-packages") if p.is_dir()})


def installed_in(venv: Path) -> dict[str, str]:
    """{normalized name: version} of what is installed inside the virtualenv at `venv` itself, not what it sees
    beside its own (a bundle's venv sees the machine's packages through a .pth file: ci/setup.sh --from)."""
    out: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=[str(p) for p in venv_site_packages(venv)]):
        name = dist.metadata["Name"]
        if name:
            out.setdefault(normalize(name), dist.version)
    return out


def venv_problems(lock: dict[str, str], venv: Path, lock_name: str) -> list[str]:
    """Each package of the lock that is not installed inside the virtualenv at `venv` at its version. One that this
    interpreter sees at that version elsewhere (the machine's own packages, beside a bundle's venv) is named as
    such: pip takes it as installed and installs nothing."""
    inside, seen = installed_in(venv), installed_distributions()
    problems = []
    for name, want in sorted(lock.items()):
        have = inside.get(name)
        if have is not None and satisfies(have, want):
            continue
        if have is not None:
            problems.append(f"{name} {have} is installed in {venv} but {lock_name} locks {want}")
        elif name in seen and satisfies(seen[name], want):
            problems.append(f"{name} {seen[name]} is not installed in {venv}: it is seen from outside it (the "
                            "machine's own packages)")
        else:
            problems.append(f"{name} is not installed in {venv} ({lock_name} locks {want})")
    return problems


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


# ---- the setup marker: the lock a virtualenv was set up from --------------------------------------------------------

def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


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


# The marker's keys and their types: what write_marker writes, and all that read_marker accepts.
MARKER_KEYS = {"lock": str, "lock_sha256": str, "setup": str, "machine_packages": list}
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def marker_problem(marker: object) -> str | None:
    """What makes a parsed setup marker unusable, None when nothing does: its keys (MARKER_KEYS, no other), their
    types, `machine_packages` a list of package names, `lock_sha256` a sha256, and `lock` a lock file under
    requirements/ (relative to the repository, not leaving it) that parses."""
    if not isinstance(marker, dict):
        return f"a JSON {type(marker).__name__}, not an object"
    missing, unknown = sorted(MARKER_KEYS.keys() - marker.keys()), sorted(marker.keys() - MARKER_KEYS.keys())
    if missing or unknown:
        return "; ".join(([f"no `{', '.join(missing)}`"] if missing else [])
                         + ([f"unknown `{', '.join(unknown)}`"] if unknown else []))
    for key, kind in MARKER_KEYS.items():
        if not isinstance(marker[key], kind):
            return f"`{key}` is a {type(marker[key]).__name__}, not a {kind.__name__}"
    bad = [name for name in marker["machine_packages"] if not (isinstance(name, str) and _NAME.fullmatch(name))]
    if bad:
        return f"`machine_packages` holds {bad[0]!r}, not a package name"
    if not re.fullmatch(r"[0-9a-f]{64}", marker["lock_sha256"]):
        return "`lock_sha256` is not a sha256"
    lock = marker["lock"]
    path = (REPO_ROOT / lock).resolve()
    if (Path(lock).is_absolute() or not path.is_relative_to(REQUIREMENTS.resolve()) or path.suffix != ".lock"
            or not path.is_file()):
        return f"`lock` {lock!r} is not a lock file of this repository's requirements/"
    try:
        read_lock(path)
    except (OSError, UnicodeDecodeError, PinError) as e:
        return f"its lock does not parse: {e}"
    return None


def read_marker(prefix: Path | None = None) -> dict | None:
    """The setup marker of the environment at `prefix` (default: this interpreter's, sys.prefix); None without one.
    A marker that is not what write_marker writes (marker_problem) is a PinError naming it, one line."""
    path = Path(sys.prefix if prefix is None else prefix) / MARKER
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        why = f"{type(e).__name__}: {e}"
    else:
        why = marker_problem(marker)
    if why is not None:
        raise PinError(f"{path} is not a setup marker ({why}): set the environment up again "
                       "(`bash ci/setup.sh --gpu` or `--from DIR`)")
    return {**marker, "path": path, "lock_path": (REPO_ROOT / marker["lock"]).resolve(),
            "machine_packages": [normalize(n) for n in marker["machine_packages"]]}


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

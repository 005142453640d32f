"""The pins and the locks under requirements/, read with `packaging`: the one parser for both.

- `pins.txt`: the direct versions, chosen by hand (`name==version` lines).
- `cpu.lock`, `image.lock`, `image-build.lock`: every package of a set, resolved by `bash requirements/lock.sh`
  (`name==version` lines with `# via` comments).
- `*.in`: the names in a set, no versions (`-c pins.txt` lines aside).

Read by `python -m launch doctor`, ci/setup.sh and requirements/lock.sh (through the command line below) and
the tests. Command line (run from the repository root):

    python -m launch.pins pin NAME              print NAME's version in pins.txt
    python -m launch.pins check [--exact] LOCK  exit 1 unless every package of LOCK is installed at its version
                                                (--exact: and nothing else is, pip and this project aside)
    python -m launch.pins compare LOCK RESOLVED exit 1 unless RESOLVED (a resolver's output) pins exactly LOCK
"""

from __future__ import annotations

import importlib.metadata
import sys
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


class PinError(ValueError):
    """A line of a pins, lock or .in file that is not what that file may hold."""


def normalize(name: str) -> str:
    """PEP 503 name: `PyYAML`, `pyyaml` and `py_yaml` are one package."""
    return canonicalize_name(name)


def _lines(text: str, source: str):
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            yield f"{source}:{number}", line


def _requirement(where: str, line: str) -> Requirement:
    try:
        return Requirement(line)
    except InvalidRequirement as e:
        raise PinError(f"{where}: `{line}` is not a requirement ({e})") from None


def parse_pins(text: str, source: str = "pins") -> dict[str, str]:
    """{normalized name: version} from `name==version` lines (pins.txt or a lock).

    Comments and blank lines are skipped. Anything else that is not one exact pin is an error naming its line:
    an option line (`-c ...`), a range, a wildcard, a URL, an environment marker, a duplicate name.
    """
    pins: dict[str, str] = {}
    for where, line in _lines(text, source):
        if line.startswith("-"):
            raise PinError(f"{where}: `{line}`: option lines do not belong in a pins or lock file")
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


def main(argv: list[str]) -> int:
    usage = "usage: python -m launch.pins {pin NAME | check [--exact] LOCK | compare LOCK RESOLVED}"
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
        for p in problems:
            print(p)
        return 1 if problems else 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

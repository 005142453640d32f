"""The pins and the locks under requirements/, read with `packaging`: the one parser for both.

- `pins.txt`: the direct versions, chosen by hand (`name==version` lines).
- `cpu.lock`, `image.lock`, `image-build.lock`, `flash-attn.lock`: every package of a set, resolved by
  `bash requirements/lock.sh` (uv's `--generate-hashes` format: `name==version \\` then one `--hash=sha256:HEX`
  continuation line for each file of that version on the index, then `# via` comments). Every lock entry must
  carry at least one sha256 hash: ci/setup.sh and the Dockerfile install them with `pip --require-hashes`.
- `*.in`: the names in a set, no versions (`-c pins.txt` lines aside).

Read by `python -m launch doctor`, ci/setup.sh and requirements/lock.sh (through the command line below) and
the tests. Command line (run from the repository root):

    python -m launch.pins pin NAME              print NAME's version in pins.txt
    python -m launch.pins check [--exact] LOCK  exit 1 unless every package of LOCK is installed at its version
                                                (--exact: and nothing else is, pip and this project aside)
    python -m launch.pins compare LOCK RESOLVED exit 1 unless RESOLVED (a resolver's output) pins exactly LOCK
                                                and every entry of LOCK has a hash
    python -m launch.pins constraints LOCK [--without NAME]...
                                                print LOCK's `name==version` lines without hashes (a constraint
                                                file for the resolver; NAME's entries left out)
    python -m launch.pins entries LOCK NAME...  print NAME's entries of LOCK with their hashes (a requirements
                                                file for `pip install --require-hashes`)
"""

from __future__ import annotations

import importlib.metadata
import re
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


def main(argv: list[str]) -> int:
    usage = ("usage: python -m launch.pins {pin NAME | check [--exact] LOCK | compare LOCK RESOLVED | "
             "constraints LOCK [--without NAME]... | entries LOCK NAME...}")
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
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except PinError as e:  # a malformed pins or lock file: its line, not a traceback
        print(f"launch.pins: {e}", file=sys.stderr)
        sys.exit(1)

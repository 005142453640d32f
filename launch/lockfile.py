"""`python -m launch.lockfile VERB ...`: the pins and the locks from the shell, for the scripts that set up and check an
environment before the launcher itself can run. From the repository root:

    pin NAME                          print NAME's version in pins.txt
    check [--exact] [--venv VENV] LOCK
                                      exit 1 unless every package of LOCK is installed at its version
                                      (--exact: and nothing else is, pip and this project aside; --venv: inside the
                                      virtualenv VENV itself, not beside it: the machine's packages a bundle's venv
                                      sees do not count)
    missing VENV LOCK                 print the entries of LOCK (with their hashes) not installed inside VENV at
                                      their version: what pip left to the machine's packages
    compare LOCK RESOLVED             exit 1 unless RESOLVED (a resolver's output) pins exactly LOCK and every entry of
                                      LOCK has a hash
    constraints LOCK [--without NAME]...
                                      print LOCK's `name==version` lines without hashes (a constraint file for the
                                      resolver; NAME's entries left out)
    entries LOCK NAME...              print NAME's entries of LOCK with their hashes (a requirements file for
                                      `pip install --require-hashes`)
    bundle DIR --python-version X.Y --platform TAG [--list] [NAME...]
                                      write DIR/bundle.lock (image.lock less the torch build, with hashes; NAME...:
                                      only these) and DIR/bundle.json (what it is for); --list: print them instead
    bundle-check DIR                  exit 1, saying why in one paragraph, unless the bundle in DIR installs this
                                      checkout on this interpreter: made from its image.lock, for its Python version
                                      and a platform it installs, a file of the right hash for every entry
    platforms TAG                     print the platform tags a machine of TAG installs (PEP 600)
    mark VENV LOCK SETUP [BUNDLE_DIR] write VENV's setup marker: the lock it was set up from (and, from a bundle, the
                                      packages left to the machine's torch build); exit 1 and write nothing unless
                                      every package of LOCK (BUNDLE_DIR/bundle.lock) is installed inside VENV at
                                      its version

Run by ci/setup.sh (bundle, bundle-check, platforms, missing, mark, check), requirements/lock.sh (pin, constraints,
compare), the Dockerfile and ci/image.sh (check --exact). Not a command of `python -m launch`, whose commands import the
whole launcher: this runs with the standard library and `packaging` only, as ci/setup.sh needs it before any virtualenv
exists (a bare `python3` with `packaging`, or a throwaway virtualenv). A malformed pins or lock file is one line naming
it, exit status 1; a usage error, exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from launch.facts import bundle, pins

USAGE = ("usage: python -m launch.lockfile {pin NAME | check [--exact] [--venv VENV] LOCK | missing VENV LOCK | "
         "compare LOCK RESOLVED | constraints LOCK [--without NAME]... | entries LOCK NAME... | "
         "bundle DIR --python-version X.Y --platform TAG [--list] [NAME...] | bundle-check DIR | platforms TAG | "
         "mark VENV LOCK SETUP [BUNDLE_DIR]}")


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


def _report(problems: list[str]) -> int:
    for p in problems:
        print(p)
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    verb, args = (argv[0], argv[1:]) if argv else ("", [])
    if verb == "pin" and len(args) == 1:
        version = pins.read_pins().get(pins.normalize(args[0]))
        if version is None:
            print(f"{args[0]} has no pin in {pins.PINS_FILE}", file=sys.stderr)
            return 1
        print(version)
        return 0
    exact = args[:1] == ["--exact"]
    venv = Path(args[1 + exact]) if args[exact:exact + 1] == ["--venv"] and len(args) > 1 + exact else None
    if verb == "check" and len(args) == 1 + exact + 2 * (venv is not None):
        lock = Path(args[-1])
        installed = pins.installed_distributions() if venv is None else pins.installed_in(venv)
        problems = (pins.lock_problems(pins.read_lock(lock), installed, lock.name) if venv is None
                    else pins.venv_problems(pins.read_lock(lock), venv, lock.name))
        if exact:
            problems += pins.unlocked_problems(pins.read_lock(lock), installed, lock.name)
        return _report(problems)
    if verb == "missing" and len(args) == 2:
        venv, lock = Path(args[0]), Path(args[1])
        inside, blocks = pins.installed_in(venv), pins.entry_blocks(lock.read_text())
        for name, want in pins.read_lock(lock).items():
            if name not in inside or not pins.satisfies(inside[name], want):
                print(blocks[name], end="")
        return 0
    if verb == "compare" and len(args) == 2:
        lock = Path(args[0])
        problems = compare_sets(pins.read_lock(lock), pins.read_lock(Path(args[1])), lock.name)
        return _report(problems + pins.hash_problems(pins.read_hashes(lock), lock.name))
    if verb == "constraints" and len(args) % 2 == 1 and set(args[1::2]) <= {"--without"}:
        without = {pins.normalize(name) for name in args[2::2]}
        for name, version in pins.read_lock(Path(args[0])).items():
            if name not in without:
                print(f"{name}=={version}")
        return 0
    if verb == "entries" and len(args) >= 2:
        blocks = pins.entry_blocks(Path(args[0]).read_text())
        missing = [name for name in args[1:] if pins.normalize(name) not in blocks]
        if missing:
            print(f"{args[0]} has no entry for {', '.join(missing)}", file=sys.stderr)
            return 1
        print("".join(blocks[pins.normalize(name)] for name in args[1:]), end="")
        return 0
    if verb == "bundle" and len(args) >= 5 and args[1] == "--python-version" and args[3] == "--platform":
        folder, python_version, platform, rest = Path(args[0]), args[2], args[4], args[5:]
        only = [name for name in rest if name != "--list"]
        if "--list" in rest:
            entries, left = bundle.bundle_entries(only=only)
            for block in entries.values():
                print(block.split(" ", 1)[0].strip())
            print(f"# {len(entries)} packages for CPython {python_version} {platform}; left to the machine's torch "
                  f"build: {', '.join(left)}")
            return 0
        manifest = bundle.write_bundle(folder, python_version, platform, only)
        print(f"{folder / bundle.BUNDLE_LOCK}: {manifest['packages']} packages of {manifest['lock']} for CPython "
              f"{python_version} {platform}; left to the machine's torch build: "
              f"{', '.join(manifest['machine_packages'])}")
        return 0
    if verb == "bundle-check" and len(args) == 1:
        folder = Path(args[0])
        problems, python, platform = bundle.bundle_problems(folder)
        if problems:
            print(f"{folder} cannot set this checkout up with {sys.executable} (CPython {bundle.this_python()}): "
                  f"{'; '.join(problems)}. Nothing was installed. On a machine with network, make the bundle for "
                  f"this interpreter: `bash ci/setup.sh --bundle {folder} --python-version {python} --platform "
                  f"{platform}`, then bring {folder} here and run `ci/setup.sh --from {folder}` again with the same "
                  "PYTHON.", file=sys.stderr)
            return 1
        return 0
    if verb == "platforms" and len(args) == 1:
        print("\n".join(bundle.pip_platforms(args[0])))
        return 0
    if verb == "mark" and len(args) in (3, 4):
        venv = Path(args[0])
        # the lock's packages must be in the venv itself: pip installs nothing for a package it sees installed at
        # its version beside the venv (the machine's, through the .pth file of a bundle's venv)
        lock = Path(args[3]) / bundle.BUNDLE_LOCK if len(args) == 4 else Path(args[1])
        if problems := pins.venv_problems(pins.read_lock(lock), venv, lock.name):
            print(f"not marking {venv} as set up from {lock}: {len(problems)} of its packages are not installed in "
                  f"it at their version:", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            return 1
        marker = pins.write_marker(venv, Path(args[1]), args[2], Path(args[3]) if len(args) == 4 else None)
        own = marker["machine_packages"]
        print(f"{venv / pins.MARKER}: {marker['lock']}" + (f", the machine's own {', '.join(own)}" if own else ""))
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except pins.PinError as e:  # a malformed pins or lock file: its line, not a traceback
        print(f"launch.lockfile: {e}", file=sys.stderr)
        sys.exit(1)

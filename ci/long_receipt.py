"""The long tests' receipt (docs/long-tests-receipt.json): which tree `bash ci/long.sh` tested, where, and how it went.

    python ci/long_receipt.py write JUNIT_XML SECONDS   (ci/long.sh, after pytest) write the receipt from pytest's
                                                        JUnit XML; exit 1 unless every long test passed
    python ci/long_receipt.py check                     exit 1, saying why, unless the receipt is for this tree and
                                                        records no failure (tests/test_long_receipt.py runs it in CI)

The tests marked `long` (pyproject.toml; each says why in its module) start many more training processes than CI's
budget allows on every commit: a dying rank and a resume per family, Ctrl-C, two machines on loopback, `trl sft`,
the GPU check script end to end, a wheel bundle installed offline, a recipe copied outside the repository. CI
does not run them; it checks this receipt instead, whose `inputs_sha256` covers every tracked file those tests can
depend on. A change to any of them makes the receipt stale, and CI fails until `bash ci/long.sh` has run again on
the changed tree and its receipt is committed with the change.

`check` needs only the standard library; `write` runs with the venv's python (the launcher's machine facts).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECEIPT = ROOT / "docs" / "long-tests-receipt.json"
# What the long tests cannot depend on: prose (the docs and every README, which the tests of the CI tier check) and
# this receipt itself. Every other tracked file is an input: code, recipes, configs, locks, tests, scripts.
NOT_INPUTS = ("docs/",)
NOT_INPUT_SUFFIXES = (".md",)
VERSIONS = ("torch", "transformers", "trl", "accelerate", "deepspeed", "peft", "datasets")


def inputs(root: Path = ROOT) -> list[str]:
    """The tracked files the long tests may depend on, in git's order."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    names = [n for n in out.decode().split("\0") if n]
    return [n for n in names if not n.startswith(NOT_INPUTS) and not n.endswith(NOT_INPUT_SUFFIXES)
            and (root / n).is_file()]


def inputs_sha256(root: Path = ROOT) -> str:
    """One SHA-256 over each input's name and content (a renamed file changes it too)."""
    digest = hashlib.sha256()
    for name in inputs(root):
        digest.update(name.encode() + b"\0" + hashlib.sha256((root / name).read_bytes()).digest())
    return digest.hexdigest()


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in VERSIONS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def results(junit_xml: Path) -> dict:
    """pytest's JUnit XML: each test's outcome and seconds, and the counts."""
    tests, counts = [], {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                break
        counts[outcome] += 1
        name = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        tests.append({"test": name, "outcome": outcome, "seconds": round(float(case.get("time") or 0), 1)})
    return {"counts": counts, "tests": tests}


def write(junit_xml: Path, seconds: float) -> int:
    sys.path.insert(0, str(ROOT))  # run by the venv's python (ci/long.sh), where the launcher's modules import
    from launch.facts.machine import cpu_model

    found = results(junit_xml)
    receipt = {
        "inputs_sha256": inputs_sha256(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
                 # other work on the host slows every duration below: the load when the receipt was written
                 "load_average": [round(x, 1) for x in os.getloadavg()]},
        "versions": _versions(),
        "wall_s": round(seconds),
        **found,
    }
    RECEIPT.write_text(json.dumps(receipt, indent=2) + "\n")
    counts = found["counts"]
    print(f"ci/long_receipt.py: {RECEIPT.relative_to(ROOT)}: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['error']} errors, {counts['skipped']} skipped in {seconds:.0f} s")
    return 0 if counts["passed"] and not counts["failed"] and not counts["error"] else 1


def problems(root: Path = ROOT) -> list[str]:
    receipt_path = root / RECEIPT.relative_to(ROOT)
    if not receipt_path.is_file():
        return [f"{RECEIPT.relative_to(ROOT)} is missing: run `bash ci/long.sh` and commit the receipt it writes"]
    receipt = json.loads(receipt_path.read_text())
    found = []
    if receipt.get("inputs_sha256") != inputs_sha256(root):
        found.append(f"{RECEIPT.relative_to(ROOT)} was written for another tree (dated {receipt.get('date')}): the "
                     "code, configs or tests changed since the long tests last ran. Run `bash ci/long.sh` on this "
                     "tree and commit the receipt it writes with the change")
    counts = receipt.get("counts") or {}
    if not counts.get("passed") or counts.get("failed") or counts.get("error"):
        found.append(f"the long tests did not all pass when the receipt was written: {counts}")
    return found


def main(argv: list[str]) -> int:
    if argv[:1] == ["write"] and len(argv) == 3:
        return write(Path(argv[1]), float(argv[2]))
    if argv == ["check"]:
        found = problems()
        for line in found:
            print(f"ci/long_receipt.py: {line}", file=sys.stderr)
        return 1 if found else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The inputs of a GPU host's setup that are not what they should be: a setup marker that was tampered with (doctor
names it in one problem line, no traceback), a venv whose locked packages pip left to the machine's own (no marker
is written for it), and a bundle that cannot install this checkout on this interpreter (`ci/setup.sh --from DIR`
refuses before creating anything, in a paragraph of its own). No downloads, no GPU: fake venvs and bundles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.tags import sys_tags

from launch.checks.doctor import run_doctor
from launch.facts import bundle as bundlefiles
from launch.facts import pins as pinfiles
from launch.facts.machine import REPORTED

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "ci" / "setup.sh"
PYTHON = "%d.%d" % sys.version_info[:2]
PLATFORM = next(t.platform for t in sys_tags() if t.platform.startswith("manylinux_2_"))
IMAGE = pinfiles.read_lock(pinfiles.IMAGE_LOCK)


def lockfile(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launch.lockfile", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


def setup_sh(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SETUP), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


# ---- doctor on a tampered setup marker: one problem line, the CPU lock's check goes on --------------------------

def good_marker() -> dict:
    return {"lock": "requirements/image.lock", "lock_sha256": pinfiles.sha256(pinfiles.IMAGE_LOCK),
            "setup": "ci/setup.sh --gpu", "machine_packages": []}


def fake_repo(tmp_path: Path, monkeypatch) -> Path:
    """A repository root whose requirements/ holds a lock that does not parse and a link to a lock outside it."""
    repo = tmp_path / "repo"
    (repo / "requirements").mkdir(parents=True)
    (repo / "requirements" / "broken.lock").write_text("numpy>=1 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    (tmp_path / "outside.lock").write_text(pinfiles.IMAGE_LOCK.read_text())
    (repo / "requirements" / "link.lock").symlink_to(tmp_path / "outside.lock")
    monkeypatch.setattr(pinfiles, "REPO_ROOT", repo)
    monkeypatch.setattr(pinfiles, "REQUIREMENTS", repo / "requirements")
    return repo


TAMPERED = {
    "lock file missing": (dict(lock="requirements/gone.lock"), "`lock` 'requirements/gone.lock' is not a lock file"),
    "key missing": ("no setup", "no `setup`"),
    "unknown key": (dict(extra=1), "unknown `extra`"),
    "lock outside the repository": (dict(lock="../../../../etc/hosts"), "is not a lock file of this repository"),
    "absolute lock": (dict(lock="/etc/hosts"), "is not a lock file of this repository"),
    "lock linked outside requirements/": (dict(lock="requirements/link.lock"), "is not a lock file of this"),
    "a string for a list": (dict(machine_packages="torch"), "`machine_packages` is a str, not a list"),
    "not a name in the list": (dict(machine_packages=["torch", 3]), "`machine_packages` holds 3, not a package"),
    "a number for a string": (dict(setup=3), "`setup` is a int, not a str"),
    "not a sha256": (dict(lock_sha256="x"), "`lock_sha256` is not a sha256"),
    "unparsable JSON": ("{", "JSONDecodeError"),
    "not an object": ("[]", "a JSON list, not an object"),
    "not UTF-8": (b"\xff\xfe", "UnicodeDecodeError"),
    "lock that fails to parse": (dict(lock="requirements/broken.lock"), "its lock does not parse: broken.lock:1"),
}


@pytest.mark.parametrize("case", TAMPERED)
def test_doctor_names_a_tampered_marker_in_one_problem_line(case, tmp_path, monkeypatch):
    change, why = TAMPERED[case]
    marker = tmp_path / "venv" / pinfiles.MARKER
    marker.parent.mkdir()
    if isinstance(change, dict):
        marker.write_text(json.dumps({**good_marker(), **change}))
    elif change == "no setup":
        marker.write_text(json.dumps({k: v for k, v in good_marker().items() if k != "setup"}))
    elif isinstance(change, bytes):
        marker.write_bytes(change)
    else:
        marker.write_text(change)
    fake_repo(tmp_path, monkeypatch)
    monkeypatch.setattr(pinfiles.sys, "prefix", str(marker.parent))
    lines: list[str] = []
    n = run_doctor(versions={name: pinfiles.read_pins()[name] for name in REPORTED}, gpus=[], strict=False,
                   out=lines.append, installed=pinfiles.read_lock(pinfiles.CPU_LOCK))
    problems = [line for line in lines if line.startswith("PROBLEM:")]
    assert n == 1 and len(problems) == 1, lines
    assert problems[0].startswith(f"PROBLEM: {marker} is not a setup marker (") and why in problems[0], problems
    assert "\n" not in problems[0]
    # judged as the CPU venv meanwhile
    assert any(line.startswith("lock           cpu.lock: the installed versions match") for line in lines), lines


def test_the_good_marker_is_read(tmp_path):
    (tmp_path / pinfiles.MARKER).write_text(json.dumps({**good_marker(), "machine_packages": ["Torch"]}))
    host = pinfiles.host_lock(False, prefix=tmp_path)
    assert (host.path, host.machine) == (pinfiles.IMAGE_LOCK, frozenset({"torch"}))


def test_doctor_command_on_a_tampered_marker_exits_non_zero_without_a_traceback(tmp_path):
    """`python -m launch doctor` itself, its environment's marker (sys.prefix) naming a lock that does not exist."""
    (tmp_path / pinfiles.MARKER).write_text(json.dumps({**good_marker(), "lock": "requirements/gone.lock"}))
    code = ("import runpy, sys; sys.prefix = sys.argv[1]; sys.argv = ['launch', 'doctor']; "
            "runpy.run_module('launch', run_name='__main__', alter_sys=True)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    problems = [line for line in proc.stdout.splitlines() if line.startswith("PROBLEM:")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert problems == [f"PROBLEM: {tmp_path / pinfiles.MARKER} is not a setup marker (`lock` "
                        "'requirements/gone.lock' is not a lock file of this repository's requirements/): set the "
                        "environment up again (`bash ci/setup.sh --gpu` or `--from DIR`)"], proc.stdout


# ---- the marker: only for a venv that holds the lock's packages itself --------------------------------------------

def fake_venv(path: Path, **dists: str) -> Path:
    """A virtualenv's site-packages holding only these distributions' metadata."""
    site = path / "lib" / f"python{PYTHON}" / "site-packages"
    site.mkdir(parents=True)
    for name, version in dists.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path


def test_no_marker_for_a_venv_whose_packages_are_the_machines(tmp_path):
    """pip installs nothing for a package it sees at its locked version beside the venv (a bundle's venv sees the
    machine's packages): `mark` refuses such a venv and `missing` lists what ci/setup.sh --from then installs into
    it. Here the "machine" is this interpreter, which has packaging at image.lock's version."""
    assert pinfiles.installed_distributions()["packaging"] == IMAGE["packaging"]
    bundle = tmp_path / "bundle"
    bundlefiles.write_bundle(bundle, PYTHON, PLATFORM, only=["packaging", "pyyaml"])
    venv = fake_venv(tmp_path / "venv", pyyaml=IMAGE["pyyaml"])
    setup = f"ci/setup.sh --from {bundle}"
    proc = lockfile("mark", venv, "requirements/image.lock", setup, bundle)
    assert proc.returncode == 1 and not (venv / pinfiles.MARKER).exists(), proc.stderr
    assert (f"packaging {IMAGE['packaging']} is not installed in {venv}: it is seen from outside it (the machine's "
            "own packages)") in proc.stderr
    assert "pyyaml" not in proc.stderr
    proc = lockfile("missing", venv, bundle / bundlefiles.BUNDLE_LOCK)
    assert proc.returncode == 0 and proc.stdout == pinfiles.entry_blocks(
        pinfiles.IMAGE_LOCK.read_text())["packaging"], proc.stdout
    assert lockfile("check", "--venv", venv, bundle / bundlefiles.BUNDLE_LOCK).returncode == 1
    assert lockfile("check", bundle / bundlefiles.BUNDLE_LOCK).returncode == 0  # what pip saw: "satisfied"
    # a venv at another version inside is named as such
    other = fake_venv(tmp_path / "other", packaging="20.0", pyyaml=IMAGE["pyyaml"])
    proc = lockfile("mark", other, "requirements/image.lock", setup, bundle)
    assert proc.returncode == 1 and f"packaging 20.0 is installed in {other} but bundle.lock locks" in proc.stderr
    # installed inside: marked
    inside = fake_venv(tmp_path / "inside", packaging=IMAGE["packaging"], pyyaml=IMAGE["pyyaml"])
    proc = lockfile("mark", inside, "requirements/image.lock", setup, bundle)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((inside / pinfiles.MARKER).read_text())["setup"] == setup
    assert lockfile("missing", inside, bundle / bundlefiles.BUNDLE_LOCK).stdout == ""
    assert lockfile("check", "--venv", inside, bundle / bundlefiles.BUNDLE_LOCK).returncode == 0


# ---- --from DIR with a bundle that cannot install this checkout: refused before anything is created ---------------

def bundle_for(folder: Path, python=PYTHON, platform=PLATFORM, names=("packaging",)) -> Path:
    bundlefiles.write_bundle(folder, python, platform, only=list(names))
    return folder


OTHER_PYTHON = "3.12" if PYTHON != "3.12" else "3.13"
MISMATCHED = {
    "another Python": (lambda d: bundle_for(d, python=OTHER_PYTHON),
                       f"it is for CPython {OTHER_PYTHON}, this interpreter is CPython {PYTHON}"),
    "another platform": (lambda d: bundle_for(d, platform="macosx_11_0_arm64"),
                         "it is for macosx_11_0_arm64, which this machine does not install"),
    "a wheel missing": (lambda d: bundle_for(d), f"no file for packaging=={IMAGE['packaging']}"),
    "a wheel for another Python": (
        lambda d: (bundle_for(d, names=["pyyaml"]) / f"pyyaml-{IMAGE['pyyaml']}-cp30-cp30-{PLATFORM}.whl").touch(),
        f"no file this interpreter installs for pyyaml=={IMAGE['pyyaml']} (pyyaml-{IMAGE['pyyaml']}-cp30-cp30-"),
    "a damaged wheel": (
        lambda d: (bundle_for(d) / f"packaging-{IMAGE['packaging']}-py3-none-any.whl").write_text("junk"),
        f"files that do not match bundle.lock's sha256 (damaged or replaced): packaging-{IMAGE['packaging']}-py3"),
    "an entry that is not image.lock's": (
        lambda d: (bundle_for(d) / "bundle.lock").write_text(
            f"packaging==20.0 \\\n    --hash=sha256:{'0' * 64}\n"),
        "bundle.lock has entries that are not image.lock's (another version or hash): packaging==20.0"),
    "an unreadable manifest": (lambda d: (bundle_for(d) / "bundle.json").write_text("{"),
                               "bundle.json cannot be read (JSONDecodeError"),
    "a manifest without its keys": (lambda d: (bundle_for(d) / "bundle.json").write_text("{}"),
                                    "bundle.json is not a bundle's manifest"),
}


@pytest.mark.parametrize("case", MISMATCHED)
def test_from_refuses_a_bundle_that_cannot_install_this_checkout(case, tmp_path):
    make, why = MISMATCHED[case]
    folder = tmp_path / "bundle"
    make(folder)
    venv = tmp_path / "venv"
    proc = setup_sh("--from", folder, env={"PYTHON": sys.executable, "VENV": str(venv)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert not venv.exists() and proc.stdout == ""
    message = proc.stderr.strip()
    assert "\n" not in message and message.startswith(f"ci/setup.sh: {folder} cannot set this checkout up with "
                                                      f"{sys.executable} (CPython {PYTHON}): "), message
    assert why in message, message
    # the bundle to make: this interpreter's Python, the bundle's platform or else this machine's newest (PLATFORM)
    assert (f"On a machine with network, make the bundle for this interpreter: `bash ci/setup.sh --bundle {folder} "
            f"--python-version {PYTHON} --platform {PLATFORM}`") in message, message


@pytest.mark.slow


@pytest.mark.long
def test_a_venv_this_run_created_is_removed_when_pip_fails(tmp_path):
    """A bundle that passes its check (here one with no entries) and a pip that fails (a constraints file that does
    not exist): the venv ci/setup.sh --from created is removed, with a line of its own. Slow: it creates a venv."""
    folder = bundle_for(tmp_path / "bundle")
    lock = folder / "bundle.lock"
    lock.write_text("".join(line for line in lock.read_text().splitlines(True) if line.startswith("#")))
    venv = tmp_path / "venv"
    proc = setup_sh("--from", folder, env={"PYTHON": sys.executable, "VENV": str(venv),
                                           "PIP_CONSTRAINT": str(tmp_path / "none.txt")}, timeout=300)
    assert proc.returncode != 0 and not venv.exists(), proc.stdout + proc.stderr
    assert f"ci/setup.sh: the setup failed (above); removed {venv}, which this run had created" in proc.stderr

"""The ranks run the launcher's own code: whether or not its checkout is pip-installed, from any working
directory, and for a recipe folder copied outside the repository.

The checkout under test is a copy of this one in a temporary folder (the files git would track: this working tree,
uncommitted edits included), never installed. The venv the tests run in has another checkout installed in editable
mode (this one in CI, or another), which a plain `import launch` finds: the trap the launcher must not fall into
(`launch.run.command.code_env`). A marker added to the copy's `launch/rank/monitor.py` (imported by every rank of a
launcher run) prints the file each process imported, so each test sees which `launch` its ranks ran. Where the
checkout is installed itself, every other launcher test covers it.

Three runs, one step each (`--max-steps 1`: the fewest that make the ranks import launch; the run is then not
judged, and each test asserts that it says so): ddp from the copy's root (`python -m launch`), fsdp2 from another
folder (`python COPY/launch`, nothing installed), lora from a copy of its recipe folder outside the repository
(`PYTHONPATH=COPY python -m launch .`). Each costs about 10-15 s of CPU on a quiet 2-core machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launcher import REPO, explain, test_env

MARKER = "ranks-code-marker"
# What .gitignore keeps out of a checkout (the venv is a symlink here: copying it would copy the whole venv)
NOT_IN_A_CHECKOUT = (".git", ".venv", "__pycache__", "*.egg-info", "outputs", ".pytest_cache", "build", ".env")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of this checkout, not installed, whose rank-side code prints where it was imported from."""
    copy = tmp_path_factory.mktemp("ranks-code") / "checkout"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(*NOT_IN_A_CHECKOUT))
    monitor = copy / "launch" / "rank" / "monitor.py"
    monitor.write_text(monitor.read_text() + f"\nprint(f\"{MARKER} {{os.environ.get('RANK', 'launcher')}} "
                                             "{__file__}\", flush=True)\n")
    return copy


def _env(pythonpath: Path | None = None) -> dict:
    env = {k: v for k, v in test_env().items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def _run(argv: list, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, env=_env(pythonpath), capture_output=True,
                          text=True, timeout=600)


def _imported(proc: subprocess.CompletedProcess) -> dict[str, set[str]]:
    """{process (RANK, or "launcher"): the monitor.py files it imported}, from the markers in the output (the ranks'
    output reaches the launcher's stdout through its log streaming)."""
    out: dict[str, set[str]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER + " "):
            _, who, path = line.split(" ", 2)
            out.setdefault(who, set()).add(path)
    return out


def _assert_ran_the_copy(proc, checkout: Path, out: Path) -> None:
    assert proc.returncode == 0, explain(proc)
    mine = {str(checkout / "launch" / "rank" / "monitor.py")}
    assert _imported(proc) == {"launcher": mine, "0": mine, "1": mine}, explain(proc)
    # one optimizer step, logged; not judged against the recorded 12 steps, and the launcher says so
    losses = [x["loss"] for x in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in x]
    assert len(losses) == 1 and losses[0] > 0, losses
    assert "[launch] not judged: this run's layout" in proc.stdout and "'max_steps': 1" in proc.stdout


def test_a_plain_import_finds_another_launch_here(checkout, tmp_path):
    """The trap is set: without the launcher's PYTHONPATH a process started outside the copy does not import the
    copy's `launch` (the venv's editable install points elsewhere, or nothing is installed)."""
    proc = _run(["-c", "import launch; print(launch.__file__)"], cwd=tmp_path)
    assert str(checkout) not in proc.stdout, proc.stdout


@pytest.mark.slow


@pytest.mark.long
def test_ranks_import_the_copy_run_from_its_root(checkout, tmp_path):
    out = tmp_path / "ddp"
    proc = _run(["-m", "launch", "ddp", "--smoke", "--cpu", "--max-steps", "1", "--output-dir", out], cwd=checkout)
    _assert_ran_the_copy(proc, checkout, out)
    # from the root the command names the checkout's files relative to it, as a user types them there
    assert _command(proc.stdout).startswith("accelerate launch --config_file accelerate_configs/multi_gpu.yaml ")


@pytest.mark.slow


@pytest.mark.long
def test_ranks_import_the_copy_run_from_another_folder(checkout, tmp_path):
    """`python COPY/launch` from a folder outside the copy: the command names the copy's files by absolute paths and
    shows the PYTHONPATH its ranks get."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "fsdp2"
    proc = _run([checkout / "launch", "fsdp2", "--smoke", "--cpu", "--max-steps", "1", "--output-dir", out],
                cwd=elsewhere)
    _assert_ran_the_copy(proc, checkout, out)
    shown = _command(proc.stdout)
    assert shown.startswith(f"PYTHONPATH={checkout} accelerate launch --config_file "
                            f"{checkout / 'accelerate_configs' / 'fsdp2.yaml'} "), shown
    assert f" {checkout / 'recipes/fsdp2/train.py'} --config {checkout / 'recipes/fsdp2/config.yaml'} " in shown
    assert list(elsewhere.iterdir()) == []  # nothing written into the working directory


@pytest.mark.slow


@pytest.mark.long
def test_ranks_import_the_copy_for_a_recipe_folder_copied_outside_the_repository(checkout, tmp_path):
    """A recipe folder copied out of the repository, run from inside it: its config's `accelerate_config:` names a
    file of the checkout's accelerate_configs/ (found under the launcher's checkout), its own files are named
    relative to the working directory."""
    recipe = tmp_path / "my-lora"
    shutil.copytree(checkout / "recipes" / "lora", recipe)
    out = tmp_path / "lora"
    proc = _run(["-m", "launch", ".", "--smoke", "--cpu", "--max-steps", "1", "--output-dir", out], cwd=recipe,
                pythonpath=checkout)
    _assert_ran_the_copy(proc, checkout, out)
    shown = _command(proc.stdout)
    assert shown.startswith(f"PYTHONPATH={checkout} accelerate launch --config_file "
                            f"{checkout / 'accelerate_configs' / 'multi_gpu.yaml'} "), shown
    assert " train.py --config config.yaml " in shown
    assert json.loads((out / "run_summary.json").read_text())["recipe"] == "my-lora"


def _command(out: str) -> str:
    """The `accelerate launch` command the launcher printed, on one line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "accelerate launch" in line)
    end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
    return " ".join(" ".join(line.rstrip("\\") for line in lines[start:end + 1]).split())


def test_the_dry_run_names_paths_that_work_from_where_it_runs(tmp_path, capsys, monkeypatch):
    """In-process: from the repository root the command names the files relative to it; from another folder by
    absolute paths, after the PYTHONPATH the ranks get."""
    from launch.__main__ import main

    def command_from(cwd) -> str:
        monkeypatch.chdir(cwd)
        assert main(["ddp", "--smoke", "--cpu", "--dry-run", "--output-dir", str(tmp_path / "out")]) == 0
        return _command(capsys.readouterr().out)

    assert command_from(REPO).startswith("accelerate launch --config_file accelerate_configs/multi_gpu.yaml "
                                          "--num_processes 2 --mixed_precision no recipes/ddp/train.py --config "
                                          "recipes/ddp/config.yaml ")
    there = command_from(tmp_path)
    assert there.startswith(f"PYTHONPATH={REPO} accelerate launch --config_file "
                            f"{REPO / 'accelerate_configs' / 'multi_gpu.yaml'} "), there
    assert f" {REPO / 'recipes' / 'ddp' / 'train.py'} --config {REPO / 'recipes' / 'ddp' / 'config.yaml'} " in there

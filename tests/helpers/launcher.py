"""Test helpers: running the launcher as a user would, a cache of smoke runs shared across tests, the parity check
(through `launch.results.stepdiff`, the judge's own step-by-step difference) and the rule-message registry."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.common import OFFLINE_ENV, free_port  # noqa: F401 (re-exported for the tests)
from launch.results.outdir import RunFolder
from launch.results.plots import write_comparison
from launch.results.stepdiff import step_difference

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "harness"


def test_env(env: dict | None = None, fault: str | None = None) -> dict:
    """The environment of a launcher started by a test: offline; with `fault` ("RANK:STEP:raise|hang"), the
    harness's sitecustomize injects that fault into the training ranks (tests/harness/sitecustomize.py)."""
    full = dict(os.environ, **OFFLINE_ENV)
    if fault:
        full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HARNESS), os.environ.get("PYTHONPATH")]))
        full["RECIPES_TEST_FAULT"] = fault
    full.update(env or {})
    return full


test_env.__test__ = False  # a helper, not a test


def launch_cli(*args, timeout=600, env=None, fault=None) -> subprocess.CompletedProcess:
    """`python -m launch ARGS` from the repository root, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "launch", *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, env=test_env(env, fault),
    )


def launch_in_process(*args, env=None, fault=None) -> subprocess.CompletedProcess:
    """What `python -m launch ARGS` does, run by `launch.__main__.main` inside the test process: the launcher's
    imports (torch, transformers, TRL, Accelerate: ~3.5 s) are paid once per session instead of once per run. The
    training job is the same real `accelerate launch` process group with its ranks. The `python -m launch` entry point
    itself (`sys.exit(main())`) is exercised by the tests that use launch_cli. Output is captured as launch_cli's."""
    import io
    from unittest import mock

    from launch.__main__ import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    argv = list(map(str, args))
    with mock.patch.dict(os.environ, test_env(env, fault), clear=True), \
            mock.patch.object(sys, "stdout", out), mock.patch.object(sys, "stderr", err):
        cwd = os.getcwd()
        os.chdir(REPO)
        try:
            rc = main(argv)
        finally:
            os.chdir(cwd)
            out.flush()
            err.flush()
    text = lambda stream: stream.buffer.getvalue().decode("utf-8", errors="replace")  # noqa: E731
    return subprocess.CompletedProcess(["python", "-m", "launch", *argv], rc, text(out), text(err))


class SmokeRuns:
    """Runs each (recipe, args) once per test session; parity tests reuse the smoke tests' runs. Shared by the
    session's pytest-xdist workers through `root` (a folder they all see): the first worker that needs a run makes
    it under a file lock and stores its result next to it; a worker that needs it meanwhile waits on the lock, then
    reads it. Without xdist the same, in one process."""

    def __init__(self, root: Path):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.done: dict[tuple, tuple[subprocess.CompletedProcess, dict]] = {}

    def output_dir(self, recipe: str, *args: str) -> Path:
        key = json.dumps([recipe, *map(str, args)])
        return self.root / f"{recipe}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    def run(self, recipe: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
        key = (recipe, *args)
        if key not in self.done:
            out = self.output_dir(recipe, *args)
            result = out.with_name(out.name + ".result.json")
            with open(out.with_name(out.name + ".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this worker dies
                if not result.is_file():
                    proc = launch_in_process(recipe, "--smoke", "--cpu", "--output-dir", out, *args)
                    result.write_text(json.dumps({"args": proc.args, "returncode": proc.returncode,
                                                  "stdout": proc.stdout, "stderr": proc.stderr}))
            saved = json.loads(result.read_text())
            proc = subprocess.CompletedProcess(saved["args"], saved["returncode"], saved["stdout"], saved["stderr"])
            summary_path = RunFolder(out).summary
            summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
            self.done[key] = (proc, summary)
        return self.done[key]


# alst-ulysses-4gpu as pure SP over 2 processes (sp 2 x dp 1), rows padded to 128 tokens (equal lengths, as gloo's
# all-to-all needs), 6 steps of 2 micro-batches: tests/test_sp_parity.py's SP side against DP, and the one-machine
# run that tests/test_multinode.py's two machines of one process each must equal (one run, shared)
ROWS = ("--pad_to_multiple_of", "128", "--max_steps", "6")
SP2_ROWS = ("--sp-size", "2", "--dp-shard-size", "1", "--", *ROWS, "--gradient_accumulation_steps", "2")

PARITY_PLOTS = REPO / "outputs" / "parity-failures"


def assert_parity(name: str, runs: list[tuple[str, dict]], tolerance: dict[str, float]) -> None:
    """Each run's per-step metrics (run_summary.json's "observed") within `tolerance` (max |diff| per metric) of the
    first run's. On failure, `launch compare`'s plot and table of the runs are written to
    outputs/parity-failures/NAME.png and the table is part of the assertion message."""
    (_, first), problems = runs[0], []
    for label, other in runs[1:]:
        for metric, limit in tolerance.items():
            diff = step_difference(first, other, metric, label)
            if not diff.complete or not diff.steps:
                problems.append(f"{label} {metric}: {diff.n_run} steps, the first run has {diff.n_reference}")
            elif not diff.max_abs < limit:  # NaN is never within
                problems.append(f"{label} {metric}: max |diff| {diff.max_abs:.3g} >= {limit:g}")
    if problems:
        path = PARITY_PLOTS / f"{name}.png"
        table = write_comparison(runs, path, tolerance={m: {"max_abs": v, "mean": v} for m, v in tolerance.items()},
                                 title=name)
        raise AssertionError("; ".join(problems) + f"\nplot: {path}\n{table}")


TESTED_RULES: set[str] = set()


def shows(rule_fn):
    """Marks a test as one that shows rule_fn's message (tests/test_rules.py checks every rule has one)."""
    TESTED_RULES.add(rule_fn.__name__)
    return lambda test: test


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-4000:]}\n--- stderr (tail)\n{proc.stderr[-4000:]}"


def leftover_processes(marker: str) -> list[str]:
    """Processes whose command line still mentions `marker` (a test's output folder: the launcher's job and ranks),
    this process excepted: a stopped or failed run must leave none."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if marker in cmd and p.pid != os.getpid():
            found.append(f"{p.pid}: {cmd[:200]}")
    return found

"""Multi-node on loopback: two launcher invocations on this host, machine ranks 0 and 1 (127.0.0.1, a free
port), must train exactly like one machine with all the processes: one process each for ddp and zero3, two each
for ring-attention CP (cp 4 over both machines) and Ulysses SP (sp 2 x dp 2 over both machines)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.launcher import REPO, explain, free_port, launch_in_process, test_env

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("recipe,processes", [("ddp", 2), ("zero3", 2), ("ring-cp-4gpu", 4), ("alst-ulysses-4gpu", 4)])
def test_two_machines_on_loopback_match_one_machine(recipe, processes, tmp_path, smoke_runs):
    port = str(free_port())

    def argv(rank):
        return [recipe, "--smoke", "--cpu", "--num-processes", str(processes), "--num-machines", "2",
                "--machine-rank", str(rank), "--main-process-ip", "127.0.0.1", "--main-process-port", port,
                "--output-dir", str(tmp_path / f"machine{rank}")]

    # machine rank 1 is a launcher process of its own (`python -m launch`); machine rank 0 runs in this process
    # (helpers.launcher.launch_in_process), as the two would on two hosts
    machine1 = subprocess.Popen([sys.executable, "-m", "launch", *argv(1)], cwd=REPO, env=test_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    machine0 = launch_in_process(*argv(0))
    out1 = machine1.communicate(timeout=600)[0]
    assert machine0.returncode == 0, explain(machine0)
    assert machine1.returncode == 0, out1[-4000:]
    multi = json.loads((tmp_path / "machine0" / "run_summary.json").read_text())
    assert multi["layout"]["num_machines"] == 2 and multi["world_size"] == processes
    proc, single = smoke_runs.run(recipe)  # one machine, all processes: the recorded smoke invocation
    assert proc.returncode == 0, explain(proc)
    # measured: identical (0.0) per-step losses and grad norms for all four (gloo over loopback reduces in the same
    # order as on one machine)
    assert multi["observed"]["loss"] == pytest.approx(single["observed"]["loss"], abs=1e-6)
    assert multi["observed"]["grad_norm"] == pytest.approx(single["observed"]["grad_norm"], abs=1e-6)

"""Multi-node on loopback: two launcher invocations on this host, machine ranks 0 and 1 (127.0.0.1, a free
port), must train exactly like one machine with all the processes: one process each for ddp and zero3, two each
for ring-attention CP (cp 4 over both machines), Ulysses SP (sp 2 x dp 2 over both machines) and fsdp2-70b's HSDP
(dp_replicate 2 x dp_shard 2: one replica per machine, as its GPU layout spans machines); and ddp again with
nothing but each scheduler's rendezvous variables (SkyPilot's, and the PET_* of a Kubeflow TrainJob)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.launcher import REPO, explain, free_port, launch_in_process, test_env

pytestmark = pytest.mark.slow


def two_machines(argv, env=lambda rank: {}):
    """Machine ranks 0 and 1 on this host: rank 1 is a launcher process of its own (`python -m launch`), rank 0 runs
    in this process (helpers.launcher.launch_in_process), as the two would on two hosts. argv(rank) and env(rank):
    each machine's command line and environment. Returns rank 0's output."""
    machine1 = subprocess.Popen([sys.executable, "-m", "launch", *argv(1)], cwd=REPO, env=test_env(env(1)),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    machine0 = launch_in_process(*argv(0), env=env(0))
    out1 = machine1.communicate(timeout=600)[0]
    assert machine0.returncode == 0, explain(machine0)
    assert machine1.returncode == 0, out1[-4000:]
    return machine0.stdout


@pytest.mark.parametrize("recipe,processes", [("ddp", 2), ("zero3", 2), ("ring-cp-4gpu", 4), ("alst-ulysses-4gpu", 4),
                                               ("fsdp2-70b", 4)])
def test_two_machines_on_loopback_match_one_machine(recipe, processes, tmp_path, smoke_runs):
    port = str(free_port())

    def argv(rank):
        return [recipe, "--smoke", "--cpu", "--num-processes", str(processes), "--num-machines", "2",
                "--machine-rank", str(rank), "--main-process-ip", "127.0.0.1", "--main-process-port", port,
                "--output-dir", str(tmp_path / f"machine{rank}")]

    two_machines(argv)
    multi = json.loads((tmp_path / "machine0" / "run_summary.json").read_text())
    assert multi["layout"]["num_machines"] == 2 and multi["world_size"] == processes
    proc, single = smoke_runs.run(recipe)  # one machine, all processes: the recorded smoke invocation
    assert proc.returncode == 0, explain(proc)
    # measured: identical (0.0) per-step losses and grad norms for all five (gloo over loopback reduces in the same
    # order as on one machine)
    assert multi["observed"]["loss"] == pytest.approx(single["observed"]["loss"], abs=1e-6)
    assert multi["observed"]["grad_norm"] == pytest.approx(single["observed"]["grad_norm"], abs=1e-6)


# Each scheduler's own variables on machine rank `rank` of two, on loopback (what launch/skypilot/recipe.yaml and
# launch/kubernetes/trainjob.yaml get from SkyPilot and from Kubeflow Trainer's torch runtime on real nodes)
SCHEDULER_ENV = {
    "SkyPilot": lambda rank, port: {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": str(rank),
                                    "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.2", "SKYPILOT_NUM_GPUS_PER_NODE": "1"},
    "TrainJob": lambda rank, port: {"PET_NNODES": "2", "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1",
                                    "PET_MASTER_PORT": str(port), "PET_NPROC_PER_NODE": "1"},
}


@pytest.mark.parametrize("scheduler", SCHEDULER_ENV)
def test_two_machines_from_the_schedulers_variables_match_one_machine(scheduler, tmp_path, smoke_runs):
    """No --num-processes, --num-machines, --machine-rank or --main-process-ip: each launcher takes them from its
    scheduler's variables (launch.envvars.rendezvous). SkyPilot sets no port: its launchers get the test's free
    port as a flag, where a real node would use accelerate's 29500."""
    port = free_port()
    flags = ["--main-process-port", str(port)] if scheduler == "SkyPilot" else []

    def argv(rank):
        return ["ddp", "--smoke", "--cpu", *flags, "--output-dir", str(tmp_path / f"machine{rank}")]

    out0 = two_machines(argv, env=lambda rank: SCHEDULER_ENV[scheduler](rank, port))
    rank_source = {"SkyPilot": "SKYPILOT_NODE_RANK", "TrainJob": "PET_NODE_RANK"}[scheduler]
    assert f"machine rank 0 (from {rank_source})" in out0
    multi = json.loads((tmp_path / "machine0" / "run_summary.json").read_text())
    assert multi["layout"]["num_machines"] == 2 and multi["world_size"] == 2
    proc, single = smoke_runs.run("ddp")
    assert proc.returncode == 0, explain(proc)
    # measured: identical (0.0) per-step losses and grad norms, as with the flags above
    assert multi["observed"]["loss"] == pytest.approx(single["observed"]["loss"], abs=1e-6)
    assert multi["observed"]["grad_norm"] == pytest.approx(single["observed"]["grad_norm"], abs=1e-6)

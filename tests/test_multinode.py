"""Multi-node on loopback: two launcher invocations on this host, machine ranks 0 and 1 (127.0.0.1, a free
port), must train exactly like one machine with all the processes. Each family once, each rendezvous source once:

- ddp from nothing but SkyPilot's variables, zero3 from nothing but a Kubeflow TrainJob's PET_* (one process each);
- ring-attention CP (cp 2: the ring crosses the machines at every hop) and Ulysses SP (sp 2: the all-to-all crosses
  them) from the launcher's flags, one process each;
- fsdp2-70b's smoke layout from the flags: HSDP dp_replicate 2 x dp_shard 2, one replica per machine (two processes
  each), as its GPU layout spans machines.

The one-machine runs are the session's shared smoke runs (the SP one is tests/test_sp_parity.py's)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.launcher import REPO, SP2_ROWS, explain, free_port, launch_in_process, test_env

pytestmark = [pytest.mark.slow, pytest.mark.long]


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


# Each scheduler's own variables on machine rank `rank` of two, on loopback (what launch/skypilot/recipe.yaml and
# launch/kubernetes/trainjob.yaml get from SkyPilot and from Kubeflow Trainer's torch runtime on real nodes)
SCHEDULER_ENV = {
    "SkyPilot": lambda rank, port: {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": str(rank),
                                    "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.2", "SKYPILOT_NUM_GPUS_PER_NODE": "1"},
    "TrainJob": lambda rank, port: {"PET_NNODES": "2", "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1",
                                    "PET_MASTER_PORT": str(port), "PET_NPROC_PER_NODE": "1"},
}
RANK_SOURCE = {"SkyPilot": "SKYPILOT_NODE_RANK", "TrainJob": "PET_NODE_RANK"}

# recipe, processes on both machines together, where the rendezvous comes from (flags or a scheduler's variables),
# the run's other arguments (the one-machine run is the smoke run with the same arguments)
CASES = {
    "ddp-from-skypilot": ("ddp", 2, "SkyPilot", ()),
    "zero3-from-trainjob": ("zero3", 2, "TrainJob", ()),
    "ring-cp-2gpu": ("ring-cp-2gpu", 2, "flags", ()),
    "alst-ulysses-sp2": ("alst-ulysses-4gpu", 2, "flags", SP2_ROWS),
    "fsdp2-70b-hsdp": ("fsdp2-70b", 4, "flags", ()),
}


@pytest.mark.parametrize("case", CASES)
def test_two_machines_on_loopback_match_one_machine(case, tmp_path, smoke_runs):
    """With a scheduler's variables: no --num-processes, --num-machines, --machine-rank or --main-process-ip; each
    launcher takes them from its scheduler (launch.config.envvars.rendezvous). SkyPilot sets no port: its launchers get
    the test's free port as a flag, where a real node would use accelerate's 29500."""
    recipe, processes, source, extra = CASES[case]
    port = free_port()
    options, training = (list(extra[:extra.index("--")]), list(extra[extra.index("--"):])) if extra else ([], [])
    if source == "flags":
        def argv(rank):
            return [recipe, "--smoke", "--cpu", "--num-processes", str(processes), "--num-machines", "2",
                    "--machine-rank", str(rank), "--main-process-ip", "127.0.0.1", "--main-process-port", str(port),
                    *options, "--output-dir", str(tmp_path / f"machine{rank}"), *training]

        def env(rank):
            return {}
    else:
        flags = ["--main-process-port", str(port)] if source == "SkyPilot" else []

        def argv(rank):
            return [recipe, "--smoke", "--cpu", *flags, *options, "--output-dir", str(tmp_path / f"machine{rank}"),
                    *training]

        def env(rank):
            return SCHEDULER_ENV[source](rank, port)

    out0 = two_machines(argv, env)
    if source != "flags":
        assert f"machine rank 0 (from {RANK_SOURCE[source]})" in out0
    multi = json.loads((tmp_path / "machine0" / "run_summary.json").read_text())
    assert multi["layout"]["num_machines"] == 2 and multi["world_size"] == processes
    # one machine, all the processes: the recorded smoke invocation (or the SP parity test's run)
    proc, single = smoke_runs.run(recipe, *(["--num-processes", str(processes), *extra] if extra else []))
    assert proc.returncode == 0, explain(proc)
    assert single["layout"]["num_machines"] == 1 and single["world_size"] == processes
    # measured: identical (0.0) per-step losses and grad norms for all five (gloo over loopback reduces in the same
    # order as on one machine)
    assert multi["observed"]["loss"] == pytest.approx(single["observed"]["loss"], abs=1e-6)
    assert multi["observed"]["grad_norm"] == pytest.approx(single["observed"]["grad_norm"], abs=1e-6)

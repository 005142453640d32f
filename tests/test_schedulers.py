"""The schedulers' files (launch/slurm, launch/skypilot, launch/kubernetes) and the rendezvous variables they set.

Each file is checked by its scheduler's own definition of it: the SkyPilot task by SkyPilot's task schema (vendored
from its package: launch/skypilot/refresh-schema.sh says why and how), the TrainJob by the Kubeflow Trainer API's
models (kubeflow-trainer-api, in the CPU lock). The launcher's side: each scheduler's variables give the multi-node
options (`launch.config.envvars.rendezvous`), here in-process; tests/test_multinode.py trains across two launchers on
loopback that are given nothing else.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from types import SimpleNamespace

import jsonschema
import pytest
import yaml

from helpers.launcher import REPO, explain, launch_in_process
from launch.config import envvars
from launch.errors import LaunchError

SKYPILOT_TASK = REPO / "launch" / "skypilot" / "recipe.yaml"
SKYPILOT_SCHEMA = REPO / "launch" / "skypilot" / "task-schema.json"
TRAINJOB = REPO / "launch" / "kubernetes" / "trainjob.yaml"
SBATCH = REPO / "launch" / "slurm" / "recipe.sbatch"


# ---- the files, by their schedulers' own definitions -----------------------------------------------------------
def skypilot_problems(task: dict) -> list[str]:
    """What SkyPilot's task parser says of a task: its task schema, then its resources schema (sky/task.py and
    sky/resources.py apply them in turn), with SkyPilot's validator: JSON Schema draft 7 plus its two enum keywords
    (sky/utils/validator.py)."""
    schemas = json.loads(SKYPILOT_SCHEMA.read_text())

    def enum(case_sensitive):
        def check(_validator, enums, instance, _schema):
            fold = (lambda s: s) if case_sensitive else str.lower
            if fold(instance) not in [fold(e) for e in enums]:
                yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r}")
        return check

    validator = jsonschema.validators.extend(jsonschema.Draft7Validator, {
        "case_insensitive_enum": enum(False), "case_sensitive_enum": enum(True)})
    task = {k: v for k, v in task.items() if v is not None}  # as SkyPilot does (skip_none)
    problems = [e.message for e in validator(schemas["task"]).iter_errors(task)]
    resources = {k: v for k, v in (task.get("resources") or {}).items() if v is not None}
    return problems + [e.message for e in validator(schemas["resources"]).iter_errors(resources)]


def test_skypilot_task_is_valid_for_skypilot():
    schemas = json.loads(SKYPILOT_SCHEMA.read_text())
    assert re.fullmatch(r"\d+\.\d+\.\d+", schemas["skypilot_version"])
    task = yaml.safe_load(SKYPILOT_TASK.read_text())
    assert skypilot_problems(task) == []
    assert task["num_nodes"] >= 2
    # the checks can fail: a misspelled field, a wrong type, an unknown resource
    for path, value in ((("nodes",), 2), (("num_nodes",), "two"), (("resources", "accelerator"), "H100:8")):
        broken = copy.deepcopy(task)
        *parents, key = path
        target = broken
        for p in parents:
            target = target[p]
        target[key] = value
        assert skypilot_problems(broken), f"{path}={value!r} passed SkyPilot's schema"


def test_skypilot_task_passes_every_skypilot_variable_the_launcher_reads():
    """The task runs our image with `docker run`: each SkyPilot variable launch.config.envvars reads must cross into
    it."""
    run = yaml.safe_load(SKYPILOT_TASK.read_text())["run"]
    for name in envvars.SCHEDULERS["SkyPilot"].values():
        assert f"-e {name}" in run, f"{name} is not passed into the container"
    assert "--network host" in run  # machine rank 0's address is the node's


def trainjob_model():
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    return TrainerV1alpha1TrainJob


def test_trainjob_is_valid_for_the_kubeflow_trainer_api():
    """The Trainer API's own models read the manifest (types, required fields) and write back every field they
    know: a manifest that comes back unchanged has no field the API lacks (a misspelled one would be dropped)."""
    TrainJob = trainjob_model()
    manifest = yaml.safe_load(TRAINJOB.read_text())
    assert TrainJob.from_dict(manifest).to_dict() == manifest
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and manifest["kind"] == "TrainJob"
    misspelled = copy.deepcopy(manifest)
    misspelled["spec"]["trainer"]["numNode"] = misspelled["spec"]["trainer"].pop("numNodes")
    assert TrainJob.from_dict(misspelled).to_dict() != misspelled
    wrong_type = copy.deepcopy(manifest)
    wrong_type["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(ValueError):
        TrainJob.from_dict(wrong_type)


def test_trainjob_runs_the_launcher_on_the_torch_runtime():
    spec = yaml.safe_load(TRAINJOB.read_text())["spec"]
    trainer = spec["trainer"]
    assert spec["runtimeRef"]["name"] == "torch-distributed"  # the runtime that sets the PET_* variables
    assert trainer["command"] == ["python", "-m", "launch"] and trainer["args"][0] in _recipes()
    assert trainer["numNodes"] >= 2
    # an integer numProcPerNode becomes PET_NPROC_PER_NODE, which the launcher reads (`auto` it would leave to the
    # recipe's own count); one process per GPU
    assert isinstance(trainer["numProcPerNode"], int)
    assert int(trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"]) == trainer["numProcPerNode"]


def _recipes() -> set[str]:
    return {p.parent.name for p in (REPO / "recipes").glob("*/config.yaml")}


def test_the_scheduler_files_name_recipes_that_exist():
    assert yaml.safe_load(SKYPILOT_TASK.read_text())["envs"]["RECIPE"] in _recipes()


def test_sbatch_script_parses_and_exports_what_the_launcher_reads():
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0
    text = SBATCH.read_text()
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # SLURM's own SLURM_NNODES / SLURM_NODEID reach srun's tasks
        assert re.search(rf"export .*\b{name}\b", text), name


# ---- the variables, read as the multi-node options --------------------------------------------------------------
NOTHING_GIVEN = SimpleNamespace(**dict.fromkeys(envvars.RENDEZVOUS_FLAGS))

# (scheduler, its variables on machine rank 1 of 2, the options they give, where each came from)
SCHEDULER_CASES = [
    ("SLURM", {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "MASTER_ADDR": "node-a", "MASTER_PORT": "29501"},
     {"num_machines": 2, "machine_rank": 1, "main_process_ip": "node-a", "main_process_port": 29501,
      "num_processes": None},
     {"num_machines": "SLURM_NNODES", "machine_rank": "SLURM_NODEID", "main_process_ip": "MASTER_ADDR",
      "main_process_port": "MASTER_PORT", "num_processes": "default"}),
    ("SkyPilot", {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.8\n",
                  "SKYPILOT_NUM_GPUS_PER_NODE": "8"},
     {"num_machines": 2, "machine_rank": 1, "main_process_ip": "10.0.0.7", "main_process_port": None,
      "num_processes": 16},
     {"num_machines": "SKYPILOT_NUM_NODES", "machine_rank": "SKYPILOT_NODE_RANK",
      "main_process_ip": "SKYPILOT_NODE_IPS", "main_process_port": "default",
      "num_processes": "SKYPILOT_NUM_GPUS_PER_NODE x 2 machines"}),
    ("TrainJob", {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-node-0-0.job",
                  "PET_MASTER_PORT": "29400", "PET_NPROC_PER_NODE": "8"},
     {"num_machines": 2, "machine_rank": 1, "main_process_ip": "job-node-0-0.job", "main_process_port": 29400,
      "num_processes": 16},
     {"num_machines": "PET_NNODES", "machine_rank": "PET_NODE_RANK", "main_process_ip": "PET_MASTER_ADDR",
      "main_process_port": "PET_MASTER_PORT", "num_processes": "PET_NPROC_PER_NODE x 2 machines"}),
]


@pytest.mark.parametrize("scheduler,env,values,sources", SCHEDULER_CASES, ids=[c[0] for c in SCHEDULER_CASES])
def test_each_schedulers_variables_give_the_multinode_options(scheduler, env, values, sources):
    r = envvars.rendezvous(NOTHING_GIVEN, env)
    assert r.values == values
    assert r.sources == sources
    assert "machine rank 1 (from " + sources["machine_rank"] + ")" in r.describe()


def test_a_flag_wins_over_the_schedulers_variables():
    given = SimpleNamespace(**{**vars(NOTHING_GIVEN), "machine_rank": 0, "num_processes": 4})
    r = envvars.rendezvous(given, {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2",
                                   "SKYPILOT_NUM_GPUS_PER_NODE": "8"})
    assert (r.values["machine_rank"], r.sources["machine_rank"]) == (0, "--machine-rank")
    assert (r.values["num_processes"], r.sources["num_processes"]) == (4, "--num-processes")
    assert (r.values["num_machines"], r.sources["num_machines"]) == (2, "SKYPILOT_NUM_NODES")


def test_nothing_set_leaves_the_defaults():
    r = envvars.rendezvous(NOTHING_GIVEN, {})
    assert set(r.values.values()) == {None} and set(r.sources.values()) == {"default"}
    assert r.describe() is None  # one machine, no scheduler: the run's output is as before


def test_two_schedulers_that_agree_are_both_named():
    r = envvars.rendezvous(NOTHING_GIVEN, {"SLURM_NNODES": "2", "SKYPILOT_NUM_NODES": "2"})
    assert (r.values["num_machines"], r.sources["num_machines"]) == (2, "SLURM_NNODES = SKYPILOT_NUM_NODES")


def test_two_schedulers_that_disagree_are_refused_unless_a_flag_decides():
    env = {"SLURM_NODEID": "0", "PET_NODE_RANK": "1"}
    with pytest.raises(LaunchError, match=r"SLURM_NODEID=0 and PET_NODE_RANK=1.*--machine-rank"):
        envvars.rendezvous(NOTHING_GIVEN, env)
    given = SimpleNamespace(**{**vars(NOTHING_GIVEN), "machine_rank": 1})
    assert envvars.rendezvous(given, env).values["machine_rank"] == 1


@pytest.mark.parametrize("env,match", [
    ({"SKYPILOT_NODE_RANK": "one"}, r"SKYPILOT_NODE_RANK='one' is not an integer"),
    ({"PET_NNODES": "0"}, r"PET_NNODES='0' must be at least 1"),
    ({"PET_NODE_RANK": "-1"}, r"PET_NODE_RANK='-1' must be at least 0"),
    ({"PET_NPROC_PER_NODE": "many"}, r"PET_NPROC_PER_NODE='many' is not an integer"),
])
def test_a_bad_scheduler_variable_is_named(env, match):
    with pytest.raises(LaunchError, match=match):
        envvars.rendezvous(NOTHING_GIVEN, env)


@pytest.mark.parametrize("words", ["auto", "gpu", "cpu"])
def test_torchrun_counting_words_leave_the_recipes_process_count(words):
    r = envvars.rendezvous(NOTHING_GIVEN, {"PET_NNODES": "2", "PET_NPROC_PER_NODE": words})
    assert r.values["num_processes"] is None and r.values["num_machines"] == 2


def test_a_cpu_skypilot_node_leaves_the_recipes_process_count():
    r = envvars.rendezvous(NOTHING_GIVEN, {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "0"})
    assert r.values["num_processes"] is None


# ---- through the launcher: a dry run with nothing but the scheduler's variables -----------------------------------
def test_dry_run_takes_the_rendezvous_from_skypilots_variables(tmp_path):
    env = {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.2",
           "SKYPILOT_NUM_GPUS_PER_NODE": "1"}
    proc = launch_in_process("ddp", "--smoke", "--cpu", "--dry-run", "--output-dir", tmp_path / "out", env=env)
    assert proc.returncode == 0, explain(proc)
    assert "machine rank 1 (from SKYPILOT_NODE_RANK)" in proc.stdout
    assert "machine rank 0 at 127.0.0.1 (from SKYPILOT_NODE_IPS)" in proc.stdout
    assert re.search(r"--num_processes 2\b", proc.stdout) and re.search(r"--machine_rank 1\b", proc.stdout)
    assert re.search(r"--main_process_ip 127\.0\.0\.1\b", proc.stdout)


def test_dry_run_refuses_two_schedulers_that_disagree(tmp_path):
    env = {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "1", "PET_NNODES": "2", "PET_NODE_RANK": "0"}
    proc = launch_in_process("ddp", "--smoke", "--cpu", "--dry-run", "--output-dir", tmp_path / "out", env=env)
    assert proc.returncode == 2, explain(proc)
    assert "SKYPILOT_NODE_RANK=1 and PET_NODE_RANK=0" in proc.stdout + proc.stderr

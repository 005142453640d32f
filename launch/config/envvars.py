"""The environment variables the launcher reads, each parsed here, once, with a clear error on a bad value.

Three kinds are read elsewhere, on purpose: Hugging Face's own (HF_ENDPOINT, HF_HUB_OFFLINE, HF_HOME ...), which the
hub module reads through huggingface_hub's parse of them, so that it probes what the downloads will use; trackio's
TRACKIO_DIR, which `launch.run.tracking` reads as trackio itself does (a path, no parsing); and
RECIPES_CACHE, which `launch.config.smoke` reads itself: it is on the lowest floor (it imports nothing of the launcher,
and the tests call it directly), while this module raises LaunchError one floor up.

The multi-node defaults come from the scheduler that started this machine's launcher (`rendezvous`): SLURM, SkyPilot,
or torch elastic's PET_* variables (a Kubeflow Trainer TrainJob sets them). docs/schedulers.md shows each.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

from launch.constants import ENV_MIN_FREE_MB
from launch.errors import LaunchError

DOCTOR_AT_START = "LAUNCH_DOCTOR_AT_START"  # set in the image: every run first runs the doctor's strict checks


def _number(name: str, default: float, cast=int, minimum: float = 0):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise LaunchError(f"The environment variable {name}={raw!r} is not a{'n integer' if cast is int else ' number'}"
                          f"; unset it or set a number (default {default}).") from None
    if value < minimum:
        raise LaunchError(f"The environment variable {name}={raw!r} must be at least {minimum}.")
    return value


def min_free_bytes() -> int:
    """LAUNCH_MIN_FREE_MB: the free space (MiB) the output folder's file system must have before a run (200)."""
    return _number(ENV_MIN_FREE_MB, 200) * 2**20


def doctor_at_start() -> bool:
    """LAUNCH_DOCTOR_AT_START=1 (the image sets it): a run starts with the doctor's strict checks, and `doctor` is
    strict (GPU-only packages must be installed too)."""
    return os.environ.get(DOCTOR_AT_START) == "1"


def optional_int(name: str, environ=None) -> int | None:
    """An integer variable set by a scheduler (SLURM_NNODES, SLURM_NODEID, MASTER_PORT), None when unset."""
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"The environment variable {name}={raw!r} is not an integer; the launcher reads it as the "
                          "default of a multi-node option. Unset it or fix it.") from None


# --- Rendezvous: where this machine's launcher stands among the machines of one job -----------------------------

# The facts, named as the run options (`launch.config.options.Options`) and `accelerate launch`'s arguments, with the
# flag that sets each. num_processes counts the processes on all machines; a scheduler gives it per machine.
RENDEZVOUS_FLAGS = {
    "num_machines": "--num-machines",
    "machine_rank": "--machine-rank",
    "main_process_ip": "--main-process-ip",
    "main_process_port": "--main-process-port",
    "num_processes": "--num-processes",
}
PER_MACHINE = "processes_per_machine"  # a scheduler's fact that becomes num_processes (x the machines)

# Each scheduler's own variables, fact -> variable (as SLURM, SkyPilot and torch elastic name them). SLURM has no
# variable for machine rank 0's address: launch/slurm/recipe.sbatch exports torch's MASTER_ADDR / MASTER_PORT, which
# any other launcher may set as well. torch elastic's PET_* are torchrun's own option defaults; Kubeflow Trainer's
# torch runtime sets them in every node of a TrainJob (PET_MASTER_ADDR is node 0's stable name, PET_NPROC_PER_NODE
# the TrainJob's numProcPerNode, or `auto` / `gpu` / `cpu` for torchrun to count, which the launcher leaves to the
# recipe). SkyPilot gives every node all the nodes' addresses, rank 0 first, and sets no port.
SCHEDULERS = {
    "SLURM": {"num_machines": "SLURM_NNODES", "machine_rank": "SLURM_NODEID"},
    "SkyPilot": {"num_machines": "SKYPILOT_NUM_NODES", "machine_rank": "SKYPILOT_NODE_RANK",
                 "main_process_ip": "SKYPILOT_NODE_IPS", PER_MACHINE: "SKYPILOT_NUM_GPUS_PER_NODE"},
    "torch elastic (a Kubeflow TrainJob)": {"num_machines": "PET_NNODES", "machine_rank": "PET_NODE_RANK",
                                            "main_process_ip": "PET_MASTER_ADDR",
                                            "main_process_port": "PET_MASTER_PORT",
                                            PER_MACHINE: "PET_NPROC_PER_NODE"},
    "torch": {"main_process_ip": "MASTER_ADDR", "main_process_port": "MASTER_PORT"},
}
TORCHRUN_COUNTS = ("auto", "gpu", "cpu")  # PET_NPROC_PER_NODE words: torchrun counts the devices itself
# Variables that hold every machine's address, machine rank 0's first: SkyPilot's is one a line; a comma- or
# space-separated list (someone's own setting) is read the same way, instead of as one address that cannot resolve.
ADDRESS_LISTS = ("SKYPILOT_NODE_IPS",)
MINIMUM = {"num_machines": 1, "machine_rank": 0, PER_MACHINE: 0}  # SKYPILOT_NUM_GPUS_PER_NODE is 0 on a CPU node


def _scheduler_value(fact: str, name: str, environ):
    """One scheduler variable read as the fact it gives, None when unset (or when it leaves the fact open)."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    if fact == "main_process_ip":
        return re.split(r"[\s,]+", raw.strip())[0] if name in ADDRESS_LISTS else raw.strip()
    if fact == PER_MACHINE and raw.strip().lower() in TORCHRUN_COUNTS:
        return None
    value = optional_int(name, environ)
    if value < MINIMUM.get(fact, value):
        raise LaunchError(f"The environment variable {name}={raw!r} must be at least {MINIMUM[fact]}; the launcher "
                          f"reads it as the default of {RENDEZVOUS_FLAGS.get(fact, '--num-processes')}. Unset it or "
                          "fix it.")
    return None if fact == PER_MACHINE and value == 0 else value


@dataclass(frozen=True)
class Rendezvous:
    """The multi-node facts of a run (None: not set, the Accelerate config's) and where each came from: the flag, the
    scheduler variable(s) that agreed on it, or "default"."""

    values: dict
    sources: dict
    per_machine_given: tuple = ()  # (variable, raw value) of a scheduler's process count per machine, also a word

    @property
    def from_scheduler(self) -> bool:
        return any(not s.startswith("--") and s != "default" for s in self.sources.values())

    def options(self) -> dict:
        """The run options these facts fill in (`dataclasses.replace(options, **r.options())`), with their sources
        (`rendezvous_sources`: rules name where a bad value came from, `source()`)."""
        return {**self.values, "rendezvous_sources": dict(self.sources)}

    def process_count_line(self, world_size: int, per_machine: int) -> str | None:
        """One line when a scheduler said how many processes a machine runs and that count was not used: which count
        won, and why (a flag wins; a word such as `auto` asks torchrun to count devices, which the launcher leaves to
        the recipe)."""
        if not self.per_machine_given:
            return None
        name, raw = self.per_machine_given
        used = f"processes: {world_size} in all ({per_machine} per machine)"
        if self.sources["num_processes"].startswith("--"):
            return (f"{used} from {self.sources['num_processes']}, not {name}={raw}: a flag wins over the scheduler's "
                    "variables")
        if raw.strip().lower() in TORCHRUN_COUNTS:
            return (f"{used} from the Accelerate config's num_processes: {name}={raw} asks torchrun to count this "
                    "machine's devices, which the launcher does not guess; pass --num-processes (all machines "
                    "together) to choose")
        return None

    def describe(self) -> str | None:
        """One line for the run's output when more than one machine takes part or a scheduler set anything."""
        v, s = self.values, self.sources
        if (v["num_machines"] or 1) <= 1 and not self.from_scheduler:
            return None

        def fact(text, key):
            return f"{text} (from {s[key]})" if s[key] != "default" else f"{text} (default)"
        parts = [fact(f"machine rank {v['machine_rank'] or 0}", "machine_rank"),
                 fact(f"{v['num_machines'] or 1} machines", "num_machines"),
                 fact(f"machine rank 0 at {v['main_process_ip'] or '(not set)'}", "main_process_ip"),
                 fact(f"port {v['main_process_port'] or 29500}", "main_process_port")]
        if s["num_processes"] != "default" and not s["num_processes"].startswith("--"):
            parts.append(fact(f"{v['num_processes']} processes in all", "num_processes"))
        return "rendezvous: " + "; ".join(parts)


def rendezvous(given, environ=None) -> Rendezvous:
    """The multi-node facts of this machine's launcher: a flag given on the command line, else the scheduler's
    variables, else the default (None: the Accelerate config's; machine rank 0; accelerate launch's port 29500).

    given: the run options (or any object with the RENDEZVOUS_FLAGS attributes, None when not given). The only place
    that decides this order. Two schedulers' variables that disagree on a fact no flag gives are refused: which of
    them started this job is not ours to guess."""
    environ = os.environ if environ is None else environ
    found: dict[str, list[tuple[str, object]]] = {}
    per_machine_given: tuple = ()
    for variables in SCHEDULERS.values():
        for fact, name in variables.items():
            if fact == PER_MACHINE and (environ.get(name) or "").strip() and not per_machine_given:
                per_machine_given = (name, environ[name].strip())
            if (value := _scheduler_value(fact, name, environ)) is not None:
                found.setdefault(fact, []).append((name, value))
    values, sources = {}, {}
    for fact, flag in RENDEZVOUS_FLAGS.items():
        explicit = getattr(given, fact, None)
        if explicit is not None:
            # a value the options already took from the environment keeps that name (rules say where it came from)
            values[fact], sources[fact] = explicit, (getattr(given, "rendezvous_sources", None) or {}).get(fact, flag)
            continue
        key = PER_MACHINE if fact == "num_processes" else fact
        seen = found.get(key, [])
        if len({value for _name, value in seen}) > 1:
            told = " and ".join(f"{name}={value}" for name, value in seen)
            raise LaunchError(
                f"The environment holds two schedulers' rendezvous variables that disagree: {told} (for {flag}). "
                "Unset the variables of the scheduler that did not start this job, or pass " + flag + " to choose.")
        if not seen:
            values[fact], sources[fact] = None, "default"
        elif fact == "num_processes":
            values[fact] = seen[0][1] * (values["num_machines"] or 1)
            sources[fact] = f"{' = '.join(n for n, _v in seen)} x {values['num_machines'] or 1} machines"
        else:
            values[fact], sources[fact] = seen[0][1], " = ".join(name for name, _value in seen)
    return Rendezvous(values, sources, per_machine_given)


def source(options, fact: str) -> str:
    """Where the run option `fact` came from: its flag, or the scheduler variable(s) `rendezvous` took it from."""
    return (getattr(options, "rendezvous_sources", None) or {}).get(fact) or RENDEZVOUS_FLAGS[fact]


def _given(options, fact: str, value) -> str:
    """`--machine-rank 1`, or `PET_NODE_RANK=1 (from the environment)`."""
    where = source(options, fact)
    if where == "default":
        return f"{RENDEZVOUS_FLAGS[fact]} (not given: {value})"
    return f"{where} {value}" if where.startswith("--") else f"{where}={value} (from the environment)"


def machine_rank_problem(options, machines: int) -> str | None:
    """The one check of this machine's rank against the machine count, whatever set either (a flag, SLURM, SkyPilot,
    a TrainJob's PET_* variables, the Accelerate config): a rank not below the count would wait for a machine rank 0
    that is not part of the job (or pass for one: any local process listening on the port)."""
    rank = options.machine_rank or 0
    if 0 <= rank < machines:
        return None
    where = source(options, "num_machines")
    if where == "default":
        count = (f"{machines}: neither --num-machines nor a scheduler's machine count (SLURM_NNODES, "
                 "SKYPILOT_NUM_NODES, PET_NNODES) is set, so the run's own is used: the Accelerate config's "
                 "num_machines, 1 for --smoke")
    else:
        count = f"{where} {machines}" if where.startswith("--") else f"{where}={machines} (from the environment)"
    return (f"{_given(options, 'machine_rank', rank)} makes this machine rank {rank}, but the job has machine ranks "
            f"0..{machines - 1} only (machine count {count}). This machine would wait for a rendezvous that is not "
            "part of the job, or take any process listening on the port for machine rank 0. Unset the stray "
            "variable, or give the machine count and this machine's rank together (--num-machines N --machine-rank "
            "R, or the scheduler's own variables).")


def address_problem(host: str | None, port: int) -> str | None:
    """Machine rank 0's address must resolve before any machine waits on it (a typo, or a list where one address
    is expected, would otherwise wait the whole rendezvous timeout)."""
    if not host:
        return None
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        return (f"The address of machine rank 0, {host!r}, does not resolve ({getattr(e, 'strerror', None) or e}): "
                "every machine would wait for it until the rendezvous timeout. Check --main-process-ip or the "
                "scheduler's variable it came from (MASTER_ADDR, PET_MASTER_ADDR, SKYPILOT_NODE_IPS: one address a "
                "line, machine rank 0's first).")
    return None

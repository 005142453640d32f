"""launch/run/upstream_warnings.py: the ranks' PYTHONWARNINGS silences exactly torch's deprecation of the two
collectives DeepSpeed and Accelerate call, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from helpers.common import free_port
from launch.run import upstream_warnings

# The deprecated collectives called as DeepSpeed's TorchBackend calls them, in a one-process gloo job, with Python's
# warning memory reset between the calls as the Trainer's per-step code does; then a FutureWarning of another text.
SCRIPT = textwrap.dedent("""
    import warnings

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1)
    for _ in range(2):
        dist.all_gather_into_tensor(torch.zeros(2), torch.ones(2))
        dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2))
        warnings.filterwarnings("default", message="unrelated")  # any filter change resets the once-per-place memory
    warnings.warn("another deprecation", FutureWarning)
    dist.destroy_process_group()
""")


def _stderr(env: dict) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), **env)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environ, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def test_without_the_filters_every_call_warns():
    err = _stderr({})
    assert err.count("`torch.distributed.all_gather_into_tensor` is deprecated") == 2
    assert err.count("`torch.distributed.reduce_scatter_tensor` is deprecated") == 2


def test_the_ranks_environment_silences_the_two_deprecations_only():
    err = _stderr(upstream_warnings.env({}))
    assert "is deprecated" not in err
    assert "FutureWarning: another deprecation" in err


def test_the_users_own_pythonwarnings_are_kept_and_win():
    env = upstream_warnings.env({"PYTHONWARNINGS": "error::FutureWarning"})
    assert env["PYTHONWARNINGS"].endswith(",error::FutureWarning")
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), **env)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environ, timeout=120)
    assert proc.returncode != 0 and "FutureWarning: `torch.distributed.all_gather_into_tensor`" in proc.stderr


def test_the_launcher_passes_them_to_the_ranks_and_names_deepspeeds_accelerator_on_cpu(tmp_path, monkeypatch):
    """child_env: the filters above, and on CPU DS_ACCELERATOR=cpu (launch.config.profiles.CPU_ENV), with which
    DeepSpeed picks the accelerator its detection would pick without its 'Setting accelerator to CPU' warning in every
    process."""
    from launch.run import runner
    from launch.config.options import Options
    from launch.run.resolve import resolve

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    setup = resolve(Options(recipe="zero3", smoke=True, cpu=True, output_dir=str(tmp_path)), progress=lambda *_: None)
    env = runner.child_env(setup, tmp_path / "monitor")
    assert env["PYTHONWARNINGS"] == upstream_warnings.env({})["PYTHONWARNINGS"] and env["DS_ACCELERATOR"] == "cpu"
    probe = "from deepspeed.accelerator import get_accelerator; print(get_accelerator()._name)"

    def accelerator(**extra):
        environ = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                              env=dict(environ, CUDA_VISIBLE_DEVICES="", **extra))
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.split()[-1], "Setting accelerator to CPU" in proc.stdout + proc.stderr

    assert accelerator() == ("cpu", True)
    assert accelerator(DS_ACCELERATOR=env["DS_ACCELERATOR"]) == ("cpu", False)

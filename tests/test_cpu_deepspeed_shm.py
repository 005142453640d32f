"""launch/cpu/deepspeed_shm.py: a DeepSpeed CPU run starts without compiling DeepSpeed's `deepspeed_shm_comm` op.

Each case initialises DeepSpeed's communication backend (`deepspeed.init_distributed`, as Accelerate does for a
DeepSpeed launch) in a fresh one-process gloo job, with the op's JIT `load()` replaced by a function that stops the
process: reaching it means DeepSpeed would have compiled the op (35 s to minutes on this machine). The first case
shows that DeepSpeed does reach it on its own, so the second one shows the fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers.common import free_port

SCRIPT = textwrap.dedent("""
    import sys

    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    def compile_refused(self, verbose=True):
        sys.exit("DeepSpeed tried to compile deepspeed_shm_comm")

    ShareMemCommBuilder.load = compile_refused
    if sys.argv[1] == "fix":
        from launch.cpu import deepspeed_shm

        assert deepspeed_shm.skip_build() is True
        assert deepspeed_shm.skip_build() is True  # idempotent
    import deepspeed
    import deepspeed.comm as dist
    import torch

    deepspeed.init_distributed(dist_backend="gloo")
    from deepspeed.comm import comm

    assert comm.cdb.shm_comm_op is None
    x = torch.ones(3)
    dist.all_reduce(x)  # training's collectives do not need the op
    print("started without the op", x.tolist())
    torch.distributed.destroy_process_group()  # else gloo may abort at exit (launch/cpu/gloo_exit.py)
""")


def _run(mode: str, **env) -> subprocess.CompletedProcess:
    environ = dict(os.environ, ACCELERATE_USE_DEEPSPEED="true", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", CUDA_VISIBLE_DEVICES="", **env)
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, env=environ,
                          timeout=300)


@pytest.mark.long
def test_deepspeed_compiles_the_shm_op_at_init_without_the_fix():
    proc = _run("upstream")
    assert proc.returncode != 0 and "DeepSpeed tried to compile deepspeed_shm_comm" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.long
def test_the_fix_starts_deepspeed_without_compiling_the_op():
    proc = _run("fix")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "started without the op [1.0, 1.0, 1.0]" in proc.stdout


def test_the_fix_leaves_a_run_without_deepspeed_alone():
    """DDP and FSDP runs: nothing marked and DeepSpeed not imported for it."""
    code = ("import sys; from launch.cpu import deepspeed_shm; "
            "print(deepspeed_shm.skip_build(), 'deepspeed' in sys.modules)")
    environ = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_DEEPSPEED"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "False"], proc.stderr[-2000:]

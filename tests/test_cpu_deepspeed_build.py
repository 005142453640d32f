"""launch/cpu/deepspeed_build.py: DeepSpeed's CPU ops are compiled without debug information on the CPU path.

The first case shows DeepSpeed's own flags (with `-g`) and the fix's (the same less `-g`) in a fresh process, whose
imports the patch cannot leak out of; the second reads the flags the zero3-offload smoke run's `cpu_adam` was built
with (torch's JIT build file), the run CI makes anyway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from torch.utils.cpp_extension import _get_build_directory

SCRIPT = textwrap.dedent("""
    import json, os
    from deepspeed.ops.op_builder import CPUAdamBuilder
    from launch.cpu import deepspeed_build

    flags = {"upstream": CPUAdamBuilder().cxx_args()}
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "false"  # not a DeepSpeed run: nothing to patch
    flags["patched without DeepSpeed"] = deepspeed_build.drop_debug_info()
    flags["untouched"] = CPUAdamBuilder().cxx_args()
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # as `accelerate launch` sets it for a DeepSpeed config
    flags["patched"] = [deepspeed_build.drop_debug_info(), deepspeed_build.drop_debug_info()]
    flags["fixed"] = CPUAdamBuilder().cxx_args()
    print(json.dumps(flags))
""")


def test_cpu_op_flags_lose_only_the_debug_flag():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # one fresh process: the patch cannot leak into this one
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    flags = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "-g" in flags["upstream"] and "-O3" in flags["upstream"]  # DeepSpeed's own: what the fix has to change
    assert flags["patched without DeepSpeed"] is False and flags["untouched"] == flags["upstream"]
    assert flags["patched"] == [True, True]  # idempotent
    assert flags["fixed"] == [arg for arg in flags["upstream"] if arg != "-g"]


def test_the_offload_smoke_runs_cpu_adam_is_built_without_debug_info(smoke_runs):
    proc, _ = smoke_runs.run("zero3-offload")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ninja = os.path.join(_get_build_directory("cpu_adam", verbose=False), "build.ninja")
    cflags = next(line for line in open(ninja) if line.startswith("cflags ="))
    assert "-O3" in cflags.split() and "-g" not in cflags.split(), cflags

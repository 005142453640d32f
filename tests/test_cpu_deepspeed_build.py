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
    import json, sys
    from deepspeed.ops.op_builder import CPUAdamBuilder
    from launch.cpu import deepspeed_build

    before = CPUAdamBuilder().cxx_args()
    patched = deepspeed_build.drop_debug_info()
    again = deepspeed_build.drop_debug_info()
    print(json.dumps({"before": before, "after": CPUAdamBuilder().cxx_args(), "patched": [patched, again]}))
""")


def _flags(use_deepspeed: bool) -> dict:
    env = dict(os.environ, ACCELERATE_USE_DEEPSPEED=str(use_deepspeed).lower(), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cpu_op_flags_lose_only_the_debug_flag():
    fixed = _flags(use_deepspeed=True)
    assert "-g" in fixed["before"] and "-O3" in fixed["before"]  # DeepSpeed's own: what the fix has to change
    assert fixed["after"] == [arg for arg in fixed["before"] if arg != "-g"]
    assert fixed["patched"] == [True, True]  # idempotent
    untouched = _flags(use_deepspeed=False)  # not a DeepSpeed run: nothing patched
    assert untouched["patched"] == [False, False] and untouched["after"] == untouched["before"]


def test_the_offload_smoke_runs_cpu_adam_is_built_without_debug_info(smoke_runs):
    proc, _ = smoke_runs.run("zero3-offload")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ninja = os.path.join(_get_build_directory("cpu_adam", verbose=False), "build.ninja")
    cflags = next(line for line in open(ninja) if line.startswith("cflags ="))
    assert "-O3" in cflags.split() and "-g" not in cflags.split(), cflags

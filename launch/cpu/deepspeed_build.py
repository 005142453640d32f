"""DeepSpeed on CPU: compile its CPU ops (the optimizer offload's `cpu_adam`) without debug information.

DeepSpeed behaviour changed (0.19.8, `deepspeed/ops/op_builder/cpu/builder.py`): `CPUOpBuilder.cxx_args` compiles
every op of its CPU accelerator with `-O3 -g`. A run that keeps the optimizer in host memory (zero3-offload, the ALST
recipes) steps Adam with `DeepSpeedCPUAdam`, whose `cpu_adam` op torch.utils.cpp_extension JIT-compiles at the first
step on a machine that has not built it for this checkout's venv (into TORCH_EXTENSIONS_DIR): on a fresh machine, such
as a CI runner, every session. The debug information is a third of that compile and nothing reads it: cpu_adam.cpp
alone took 66.9 s with `-g` and 44.8 s without (one core of a 2-core AMD EPYC, measured). GCC's code generation does
not depend on `-g`, so the op computes the same Adam steps.

The fix: `CPUOpBuilder.cxx_args` without "-g", in the ranks of a CPU DeepSpeed run only (ACCELERATE_USE_DEEPSPEED, as
`deepspeed_shm`); the GPU path's builders are not touched. The flags are part of the JIT build's identity, so a cache
built with `-g` is built once more. Tested by tests/test_cpu_deepspeed_build.py; installed only from
`launch.cpu.enable_cpu_path`.
"""

from __future__ import annotations

from launch.cpu.deepspeed_shm import deepspeed_in_use

DEBUG_FLAG = "-g"


def drop_debug_info() -> bool:
    """Make DeepSpeed's CPU op builds leave out `-g`. Returns whether the builder is patched (False: no DeepSpeed run).
    Idempotent."""
    if not deepspeed_in_use():
        return False
    from deepspeed.ops.op_builder.cpu.builder import CPUOpBuilder

    upstream = CPUOpBuilder.cxx_args
    if getattr(upstream, "without_debug_info", False):
        return True

    def cxx_args(self):
        return [arg for arg in upstream(self) if arg != DEBUG_FLAG]

    cxx_args.without_debug_info = True
    CPUOpBuilder.cxx_args = cxx_args
    return True

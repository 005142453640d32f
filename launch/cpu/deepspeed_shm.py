"""DeepSpeed on CPU: do not compile its shared-memory all-reduce op, which training never uses.

DeepSpeed behaviour avoided (0.19.8, `deepspeed/comm/torch.py`): `TorchBackend.__init__` (reached through Accelerate's
`deepspeed.init_distributed` when the Trainer builds its Accelerator) calls `build_shm_op()`, which on DeepSpeed's
CPU accelerator JIT-compiles the C++ op `deepspeed_shm_comm` (csrc/cpu/comm/shm*.cpp, through
torch.utils.cpp_extension, into ~/.cache/torch_extensions/py311_cpu) whenever `deepspeed.ops.__compatible_ops__`
lists it as compatible: 35 s on an idle 2-core machine (measured), about 3 minutes on a loaded one, in
which the run prints nothing until "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully"; later
runs load the cached build. The op serves only `TorchBackend.inference_all_reduce` (DeepSpeed inference and AutoTP's
inference mode). Training's collectives (ZeRO's all-gather and reduce-scatter, the gradient all-reduce) are
torch.distributed calls on gloo with or without it, and `inference_all_reduce` itself falls back to
`torch.distributed.all_reduce` when the op is absent.

The fix: mark the op incompatible in the dict `build_shm_op` reads (DeepSpeed keeps that dict in `deepspeed.ops`, "so
edits to it persist"), so that it returns None before compiling. Only when Accelerate will run DeepSpeed
(ACCELERATE_USE_DEEPSPEED, set by `accelerate launch` for a DeepSpeed config), so that a DDP or FSDP run does not
import DeepSpeed for it. Tested by tests/test_cpu_deepspeed_shm.py; installed only from `launch.cpu.enable_cpu_path`.
"""

from __future__ import annotations

import os


def deepspeed_in_use() -> bool:
    """Accelerate's own test for a DeepSpeed launch (accelerate 1.15, state.py `PartialState.__init__`)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def skip_build() -> bool:
    """Keep DeepSpeed's `TorchBackend` from compiling `deepspeed_shm_comm`. Returns whether it was marked (False: no
    DeepSpeed run, or DeepSpeed's communication backend already exists and the op's fate is decided). Idempotent."""
    if not deepspeed_in_use():
        return False
    import deepspeed.comm.comm as ds_comm
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    if ds_comm.cdb is not None:  # init_distributed already ran: too late to matter
        return False
    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    return True

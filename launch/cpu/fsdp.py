"""FSDP2 on CPU over gloo: an Accelerate config with `distributed_type: FSDP` (fsdp_version 2) really shards.

accelerate/state.py (accelerate 1.15), `AcceleratorState.__init__`: the branch that turns a requested FSDP plugin
(`ACCELERATE_USE_FSDP`, which `accelerate launch` sets for `distributed_type: FSDP`, or an `fsdp_plugin`, or
`cp_size > 1`) into `DistributedType.FSDP` runs only for GPU-like distributed types (MULTI_GPU, MULTI_XPU, ...).
Under `use_cpu` the state stays `MULTI_CPU`: the plugin is silently dropped and the model trains unsharded
(plain DDP) while the run still looks like an FSDP run; with a `parallelism_config` (HSDP's dp_replicate x dp_shard,
CP) accelerate/parallelism_config.py `_validate_accelerator` refuses it ("ParallelismConfig is only compatible
DistributedType.FSDP (version 2) ... but got DistributedType.MULTI_CPU"). We run the same promotion, with upstream's
own checks and messages, for MULTI_CPU. FSDP2's `fully_shard` works on gloo as it does on NCCL.

Narrow on purpose: only the call that initialises Accelerate's shared state, and only MULTI_CPU (a single process
stays unsharded, as a single GPU does upstream). tests/test_cpu_fsdp.py shows each rank holding 1/N of every sharded
parameter through this patch, and that upstream alone does not shard.

FSDP1 (recipes/qlora-fsdp, which runs FSDP1 for bitsandbytes' 4-bit weights) needs two more things on CPU, both only
under an FSDP1 plugin: Accelerate hands FSDP1 `device_id=accelerator.device`, which MULTI_CPU sets to `cpu:0`,
while torch's FSDP1 takes the compute device of CPU parameters as `cpu` and refuses the pair (torch 2.13
fsdp/_init_utils.py `_get_compute_device`: "Inconsistent compute device and `device_id` on rank 0: cpu vs cpu:0"),
so the state's device becomes `cpu`; and Accelerate gathers a FULL_STATE_DICT with `offload_to_cpu=True`
(accelerator.py `get_state_dict`), where torch's `FlatParamHandle.to_cpu` "moves" the gathered flat parameter to the
CPU it is already on and then frees its storage (fsdp/_flat_param.py: `flat_param_to(cpu)` then
`_free_unsharded_flat_param()`), so the save fails ("setStorage: ... out of bounds for storage of size 0"): on CPU
the move becomes the copy it is on a GPU. (FSDP1's `sync_module_states`, which needs an accelerator, is turned off by
the CPU profile: launch/config/profiles.py `cpu_accelerate`.)

Imported only from `launch.cpu.enable_cpu_path` (and launch.cpu.context_parallel), i.e. only for `use_cpu` runs.
"""

from __future__ import annotations

import functools
import os

# The lines the smoke tests look for: FSDP really ran, not a silent MULTI_CPU fallback.
CP_LINE = "[launch.cpu] context parallelism on CPU: FSDP2 over the device mesh, cp_size={cp}"
FSDP_LINE = "[launch.cpu] FSDP2 on CPU: parameters sharded over {shard} process(es), replicated {replicate} time(s)"
FSDP1_LINE = "[launch.cpu] FSDP1 on CPU: flat parameters sharded over {shard} process(es)"


def enable() -> None:
    """Promote MULTI_CPU + an FSDP2 request to DistributedType.FSDP, as upstream does on GPUs (idempotent)."""
    from accelerate.state import AcceleratorState

    original_init = AcceleratorState.__init__
    if getattr(original_init, "_cpu_fsdp_patch", False):
        return

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        fresh = not AcceleratorState._shared_state  # only the call that initialises the shared state decides
        original_init(self, *args, **kwargs)
        if fresh:
            _promote(self, kwargs.get("fsdp_plugin"))

    __init__._cpu_fsdp_patch = True
    AcceleratorState.__init__ = __init__


def _promote(state, fsdp_plugin) -> None:
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if state.distributed_type != DistributedType.MULTI_CPU:
        return
    pc = getattr(state, "parallelism_config", None)
    cp = pc is not None and pc.cp_enabled
    requested = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" or fsdp_plugin is not None
    if not (requested or cp):
        return
    # The checks and assignments of the GPU branch of AcceleratorState.__init__ (accelerate 1.15), verbatim.
    if cp and fsdp_plugin is None:
        raise ValueError(
            "`cp_size > 1` specified in the `parallelism_config`, but no `fsdp_plugin` was provided. We need a "
            "`fsdp_plugin` to use context parallelism with `cp_backend=torch`, as we also shard the model across "
            "the device mesh to save more memory"
        )
    if cp and fsdp_plugin.fsdp_version == 1:
        raise ValueError("Using `cp_size>1` requires FSDP2, but the provided `fsdp_plugin` is using FSDP1. ")
    if fsdp_plugin is None:
        return  # an env request without a plugin object: left to upstream
    state.distributed_type = DistributedType.FSDP
    if state._mixed_precision != "no":
        fsdp_plugin.set_mixed_precision(state._mixed_precision)
    state.fsdp_plugin = fsdp_plugin
    PartialState._shared_state["distributed_type"] = state.distributed_type
    if fsdp_plugin.fsdp_version == 1:
        _fsdp1_on_cpu(state)
        if state.process_index == 0:
            print(FSDP1_LINE.format(shard=state.num_processes), flush=True)
        return
    if state.process_index == 0:
        if cp:
            print(CP_LINE.format(cp=pc.cp_size), flush=True)
        else:
            replicate = pc.dp_replicate_size if pc is not None else 1
            print(FSDP_LINE.format(shard=state.num_processes // replicate, replicate=replicate), flush=True)


def _fsdp1_on_cpu(state) -> None:
    """FSDP1 under MULTI_CPU: the device torch's FSDP1 expects, and a FULL_STATE_DICT gather that keeps its storage
    (module docstring)."""
    import contextlib

    import torch
    from accelerate.state import PartialState
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    state.device = PartialState._shared_state["device"] = torch.device("cpu")
    original_to_cpu = FlatParamHandle.to_cpu
    if getattr(original_to_cpu, "_cpu_fsdp_patch", False):
        return

    @contextlib.contextmanager
    def to_cpu(self):
        if self.flat_param.device.type != "cpu":
            with original_to_cpu(self):
                yield
            return
        # Upstream's steps, with the copy that its move to another device makes: the gathered weights stay readable
        # (a state dict's tensors are views of them) while the gathered buffer itself is freed, then are copied back.
        self.flat_param.data = self.flat_param.data.clone()
        self._free_unsharded_flat_param()
        try:
            yield
        finally:
            padded = self._alloc_padded_unsharded_flat_param()
            padded[: self.flat_param.numel()].copy_(self.flat_param)
            self._use_unsharded_flat_param(padded)

    to_cpu._cpu_fsdp_patch = True
    FlatParamHandle.to_cpu = to_cpu

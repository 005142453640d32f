"""TRL's activation offloading (SFTConfig `activation_offloading`) in a CPU run.

TRL behaviour worked around (trl 1.16, `trl/models/activation_offloading.py`, `OffloadActivations.__init__`): the
offloader asks `torch.accelerator.current_accelerator().type` for the device it offloads *from*, which is None on a
machine without an accelerator, so SFTTrainer fails at start ("'NoneType' object has no attribute 'type'"); its
default CUDA-style streams and pinned memory do not exist on CPU either. We build the same offloader with "cpu" as
that device, no streams and no pinned memory. At each entry the offloader also calls `device_module.empty_cache()`
when bitsandbytes is imported (peft and transformers import it once it is installed); `torch.cpu` has no
`empty_cache` (no caching allocator to empty), so the offloader gets `torch.cpu` with a no-op one. Its saved-tensor
hooks then run as on GPU (every checkpointed layer input goes through pack/unpack and the tracker), but the "offload" is
a copy within host memory: a CPU run checks that the hooks keep loss and gradients unchanged, not that memory is saved.
tests/test_alst_tiling.py holds the unit test; the alst-ulysses-8gpu CPU smoke profile runs with offloading on.
"""

from __future__ import annotations

from unittest import mock

_installed = False


def install() -> None:
    """Route SFTTrainer's offloader construction through `_cpu_offloading_ctx_manager`. Idempotent."""
    global _installed
    if _installed:
        return
    from trl.trainer import sft_trainer

    original = sft_trainer.get_act_offloading_ctx_manager

    def _cpu_offloading_ctx_manager(model, *args, **kwargs):
        import torch

        kwargs.update(use_pin_memory=False, use_streams=False)
        with mock.patch.object(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cpu")):
            offloader = original(model, *args, **kwargs)
        device_module = getattr(offloader, "device_module", None)
        if device_module is not None and not hasattr(device_module, "empty_cache"):
            offloader.device_module = _WithEmptyCache(device_module)
        return offloader

    sft_trainer.get_act_offloading_ctx_manager = _cpu_offloading_ctx_manager
    _installed = True


class _WithEmptyCache:
    """`torch.cpu` as TRL's offloader uses it, plus the `empty_cache()` that CPU torch lacks (a no-op: the CPU has no
    caching allocator to empty)."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)

    @staticmethod
    def empty_cache() -> None:
        pass

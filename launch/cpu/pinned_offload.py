"""transformers' activation-checkpoint offload (`activation_checkpointing_kwargs: {offload: true}`) in a CPU run.

transformers behaviour worked around (5.23, `modeling_utils.py`, `PreTrainedModel._activation_checkpointing_enable`):
with `offload=True` each checkpointed layer call runs inside `torch.autograd.graph.save_on_cpu(pin_memory=True, ...)`,
and CPU-only torch refuses to allocate pinned memory ("pin_memory=True requires a CUDA or other accelerator
backend"), so the first forward fails. We hand transformers the same `save_on_cpu` with `pin_memory=False`. Its
hooks then run as on GPU (each layer's input goes through pack and unpack), but the "offload" is a copy within host
memory: a CPU run checks that offloading keeps loss and gradients unchanged, not that it saves memory.
Tested by tests/test_offload.py; installed only from `launch.cpu.enable_cpu_path`.
"""

from __future__ import annotations

import functools
import os

_installed = False


def install() -> None:
    """Make transformers' checkpoint offload allocate pageable instead of pinned host memory. Idempotent."""
    global _installed
    if _installed:
        return
    import torch
    from transformers import modeling_utils

    announced = []

    @functools.wraps(torch.autograd.graph.save_on_cpu)
    def save_on_cpu_unpinned(pin_memory=False, device_type="cuda"):
        if not announced:  # the smoke tests look for this line: offload really ran
            announced.append(True)
            if os.environ.get("RANK", "0") == "0":
                print("[launch.cpu] activation-checkpoint offload on CPU: save_on_cpu with pageable memory", flush=True)
        return torch.autograd.graph.save_on_cpu(pin_memory=False, device_type=device_type)

    modeling_utils.save_on_cpu = save_on_cpu_unpinned
    _installed = True

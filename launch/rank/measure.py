"""What a run measures inside each rank: throughput and memory, written for the launcher to summarise
(`launch.speed.measured`).

`measure_callback` is added by `launch.rank.monitor` when the launcher sets LAUNCH_BENCH=<warm-up steps>. Cheap
enough for every run:
- tokens: a forward pre-hook on the input embeddings adds each micro-batch's `input_ids.numel()` (a shape, no
  device sync; padding counts; under CP/SP each rank counts its own shard);
- non-pad tokens: a forward pre-hook on the model reads the batch the Trainer passes (`real_tokens`): the sum of a
  padded batch's `attention_mask`, or for a padding-free batch (packing, `padding_free`) every token, less the tail
  that `pad_to_multiple_of` adds (read off `position_ids`). Summed on the device, read at the synchronised marks:
  no extra sync;
- time: `time.perf_counter()` at every step end (no sync), and one `torch.cuda.synchronize()` at the start of the
  first measured step, every `SYNC_EVERY` (10) measured steps and at the last step's end. The overall tokens/s and
  MFU come from those synchronised marks, so they are the GPU's time; the per-step times between two marks are the
  host's view (the host may run ahead of the GPU, so single steps jitter; their sum is exact at each mark). Cost:
  on GPU one queue drain per 10 steps (the next step's first kernels wait for the host to enqueue them, typically
  well under a millisecond: an estimate, not measured here, no GPU), a Python hook per micro-batch and one JSON
  write per 10 steps (host-side cost measured on CPU in tests/test_bench.py: tens of microseconds per step).
  LAUNCH_BENCH_SYNC=1 (for the launcher's `--bench`) synchronises at every step begin and end instead, for exact
  per-step times, at the cost of the host-device overlap at every step boundary;
- memory, per rank, read at the marks: `torch.cuda.max_memory_allocated()` and `max_memory_reserved()` since the
  first measured step (peaks reset there), the device memory in use as the driver sees it (`cudaMemGetInfo`: total
  - free, so also the CUDA context and NCCL's buffers that PyTorch does not count; the caching allocator keeps its
  peak reservation, so the value at a mark is the peak's), the process's peak resident set (`ru_maxrss`, whole
  lifetime) and the host memory in use (psutil);
- the device name and, where pynvml is importable, the GPU's enforced power limit (a 500 W H100 is slower than a
  700 W one);
- the run's setup, as resolved in the rank (`run_setup`): the model's attention implementation, the SDPA backend the
  dispatcher picked for the first attention call (`torch._fused_sdp_choice` on that call's own arguments, read
  under a TorchFunctionMode during the first forward of a `--bench` run only, then removed: cuDNN and flash differ
  1.7-2.3x on Hopper), the checkpointing mode (off / on / on + offload) and Liger on or off.
Warm-up steps (default 2: optimizer states allocated, kernels compiled, caches filled) are not measured.

Rank side: imports nothing of the launcher but `launch.rank.run_files` (names only).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from launch.rank import run_files  # names only

DEFAULT_WARMUP = 2
SYNC_EVERY = 10  # measured steps between two synchronised marks (and file writes)
SYNC_ENV = "LAUNCH_BENCH_SYNC"  # "1": synchronise at every step begin and end (exact per-step times)

def measure_callback(folder: Path, warmup: int, sync_every_step: bool | None = None):
    import resource

    import torch
    from transformers import TrainerCallback

    rank = int(os.environ.get("RANK", "0"))
    cuda = torch.cuda.is_available()
    if sync_every_step is None:
        sync_every_step = os.environ.get(SYNC_ENV) == "1"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    class MeasureCallback(TrainerCallback):
        def __init__(self):
            self.seen = 0  # optimizer steps begun
            self.steps: list[dict] = []  # measured steps
            self.marks: list[dict] = []  # synchronised: measured steps so far, seconds since the first, tokens
            self.tokens = 0  # tokens of the current step
            self.total_tokens = 0  # over the measured steps
            self.real = 0  # non-pad tokens of the current step (a device tensor until the next mark)
            self.total_real = 0
            self.pad_multiple = None  # pad_to_multiple_of
            self.t_start = self.t_last = self.t_begin = None
            self.hook = self.real_hook = None
            self.memory: dict = {}
            self.device: dict = {}  # name and power limit, read once
            self.setup: dict = {}  # attention, SDPA backend, checkpointing, Liger (run_setup)

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            embeddings = model.get_input_embeddings() if model is not None else None
            if embeddings is not None:
                self.hook = embeddings.register_forward_pre_hook(self._count)
                self.real_hook = model.register_forward_pre_hook(self._count_real, with_kwargs=True)
            multiple = getattr(args, "pad_to_multiple_of", None)
            self.pad_multiple = multiple if isinstance(multiple, int) and multiple > 1 else None
            self.setup = run_setup(args, model)
            if model is not None and sync_every_step:  # --bench only: a plain run's first forward stays untouched
                _probe_sdpa(model, self.setup)

        def _count(self, module, inputs):
            if inputs and hasattr(inputs[0], "numel") and module.training:
                self.tokens += int(inputs[0].numel())

        def _count_real(self, module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if module.training and hasattr(ids, "numel"):
                self.real = self.real + real_tokens(ids, kwargs, self.pad_multiple)

        def on_step_begin(self, args, state, control, **kwargs):
            self.seen += 1
            self.tokens = 0
            self.real = 0
            if self.seen == warmup + 1:  # the first measured step
                sync()
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                self.t_start = self.t_last = time.perf_counter()
                self.marks = [{"steps": 0, "time_s": 0.0, "tokens": 0}]
            elif sync_every_step and self.t_start is not None:
                sync()
            self.t_begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if self.t_start is None:  # a warm-up step
                return
            if sync_every_step:
                sync()
            now = time.perf_counter()
            # exact per step when synchronised; else the host's view between two step ends
            elapsed = now - (self.t_begin if sync_every_step else self.t_last)
            self.t_last = now
            self.total_tokens += self.tokens
            self.total_real = self.total_real + self.real
            self.steps.append({"step": state.global_step, "time_s": elapsed, "tokens": self.tokens,
                               "real_tokens": self.real})
            if len(self.steps) % SYNC_EVERY == 0 or (state.max_steps and state.global_step >= state.max_steps):
                self._mark()  # (the last step's mark here: on_train_end comes after the Trainer's closing work)

        def on_train_end(self, args, state, control, **kwargs):
            if self.hook is not None:
                self.hook.remove()
                self.real_hook.remove()
            if self.t_start is not None and self.marks[-1]["steps"] < len(self.steps):
                self._mark()
            else:
                self._write()

        def _mark(self):
            sync()
            self.marks.append({"steps": len(self.steps), "time_s": time.perf_counter() - self.t_start,
                               "tokens": self.total_tokens, "real_tokens": int(self.total_real)})
            self.memory = _memory_now(cuda)
            self._write()

        def _write(self):
            if not self.device:
                self.device = {"device": _device_name(), "power_limit_w": _power_limit_w()}
            for step in self.steps:  # the device sums, read after the mark's sync (or at the end)
                step["real_tokens"] = int(step["real_tokens"])
            info = {"rank": rank, "warmup": warmup, **self.device, "setup": self.setup,
                    "sync_every_step": sync_every_step, "steps": self.steps, "marks": self.marks,
                    "memory": self.memory or _memory_now(cuda)}
            try:
                folder.mkdir(parents=True, exist_ok=True)
                path = folder / run_files.rank_file(rank)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(info))
                os.replace(tmp, path)
            except OSError:
                pass

    def _memory_now(on_gpu: bool) -> dict:
        out = {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30,
               "host_used_gib": _host_used_gib()}
        if on_gpu:
            free, total = torch.cuda.mem_get_info()
            out.update(max_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
                       max_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
                       device_used_gib=(total - free) / 2**30, device_total_gib=total / 2**30)
        return out

    return MeasureCallback()


def real_tokens(ids, kwargs: dict, pad_multiple: int | None):
    """The non-pad tokens of a micro-batch whose `input_ids` are `ids`, from the model's keyword arguments, as a
    device tensor (no sync) or an int: a padded batch's `attention_mask` summed; a padding-free batch (no mask; rows
    concatenated, TRL's packing or `padding_free`) is all real, but for the tail `pad_to_multiple_of` pads it with:
    each row's tokens up to the last with a non-zero position id (a last sequence of one token would count as that
    pad). A mask of another shape (4-D, or the whole sequence where CP sharded the ids): every token counted."""
    mask = kwargs.get("attention_mask")
    if mask is not None and getattr(mask, "shape", None) == ids.shape:
        return mask.sum()
    positions = kwargs.get("position_ids")
    if mask is None and pad_multiple and getattr(positions, "shape", None) == ids.shape:
        import torch

        index = torch.arange(1, positions.shape[-1] + 1, device=positions.device)
        return ((positions != 0) * index).amax(dim=-1).sum()
    return ids.numel()


def run_setup(args, model) -> dict:
    """What the rank runs, from its resolved training arguments and model (None where it cannot be read):
    attention implementation, checkpointing mode (transformers' activation checkpointing and its `offload`, TRL's
    activation offloading, or FSDP's own activation checkpointing from Accelerate's plugin), Liger on or off.
    `sdpa_backend` is filled in by the first forward (`_probe_sdpa`)."""
    config = getattr(model, "config", None)
    ckpt = bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None))
    ckpt_kwargs = getattr(args, "activation_checkpointing_kwargs", None) or \
        getattr(args, "gradient_checkpointing_kwargs", None) or {}
    offload = isinstance(ckpt_kwargs, dict) and bool(ckpt_kwargs.get("offload"))
    by = "transformers" if ckpt else None
    if not ckpt:
        plugin = _fsdp_plugin()
        if plugin is not None and getattr(plugin, "activation_checkpointing", False):
            ckpt, by = True, "FSDP"
            offload = bool(getattr(plugin, "activation_checkpointing_offload", False))
    if args is None:
        mode = None
    else:
        mode = ("on + offload" if offload else "on") if ckpt else "off"
        if getattr(args, "activation_offloading", False):  # TRL: the whole step's saved tensors in host memory
            mode += " + TRL activation offloading"
    liger = getattr(args, "use_liger_kernel", None)
    peft = getattr(model, "peft_config", None)  # a PEFT model: {adapter name: its config}
    adapters = sorted({str(getattr(c.peft_type, "value", c.peft_type)) for c in peft.values()}) \
        if isinstance(peft, dict) else []
    return {"attn_implementation": getattr(config, "_attn_implementation", None), "sdpa_backend": None,
            "checkpointing": mode, "checkpointing_by": by, "liger": None if liger is None else bool(liger),
            "adapter": ", ".join(adapters) or None}


def _fsdp_plugin():
    """Accelerate's FSDP plugin of this process, if its state is initialised (never initialises it)."""
    try:
        from accelerate.state import AcceleratorState

        return getattr(AcceleratorState(), "fsdp_plugin", None) if AcceleratorState._shared_state else None
    except Exception:  # noqa: BLE001 - no Accelerate state: no FSDP checkpointing to report
        return None


def _probe_sdpa(model, setup: dict) -> None:
    """Record in setup["sdpa_backend"] the backend SDPA's dispatcher picks for the first attention call of the first
    forward (e.g. "CUDNN_ATTENTION", "FLASH_ATTENTION"; on CPU FLASH_ATTENTION is torch's CPU flash kernel), asked
    with that call's own tensors and arguments. The mode is pushed in the model's forward pre-hook and popped in its
    forward hook, both removed after the first forward: a Python hop per torch call during one forward only."""
    import torch
    from torch.nn.attention import SDPBackend
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention

    class Probe(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa and setup["sdpa_backend"] is None:
                try:
                    setup["sdpa_backend"] = SDPBackend(torch._fused_sdp_choice(*args, **kwargs)).name
                except Exception as exc:  # noqa: BLE001 - the dispatcher cannot be asked: say so, never guess
                    setup["sdpa_backend"] = f"not recorded ({type(exc).__name__})"
                setup["sdpa_device"] = args[0].device.type if args else None
            return func(*args, **kwargs)

    probe, handles = Probe(), []

    def enter(module, inputs):
        probe.__enter__()

    def leave(module, inputs, output):
        probe.__exit__(None, None, None)
        for h in handles:
            h.remove()

    handles += [model.register_forward_pre_hook(enter), model.register_forward_hook(leave)]


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return "cpu"


def _power_limit_w() -> float | None:
    """The GPU's enforced power limit (W), if pynvml is importable."""
    try:
        import pynvml
        import torch

        if not torch.cuda.is_available():
            return None
        pynvml.nvmlInit()
        index = torch.cuda.current_device()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible and visible.split(",")[index].strip().isdigit():
            index = int(visible.split(",")[index])
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    except Exception:  # noqa: BLE001 - no NVML: the power limit is not reported
        return None


def _host_used_gib() -> float | None:
    try:
        import psutil

        vm = psutil.virtual_memory()
        return (vm.total - vm.available) / 2**30
    except Exception:  # noqa: BLE001 - psutil missing: host memory is not reported
        return None

"""The estimate: the terms of a run assembled into phases and a peak (see the package docstring), whether it fits
a budget, and the longest length that does."""

from __future__ import annotations

from dataclasses import replace

from launch.memory.architecture import Architecture
from launch.memory.constants import (CPU_DEEPSPEED_ENGINE_GIB, CPU_RUNTIME_BASELINE_GIB, LOSSES, OVERHEAD, STRATEGIES,
                                     gib, pow2)
from launch.memory.results import Estimate, Term
from launch.memory.run_shape import RunShape
from launch.memory.terms import (checkpointed_input_bytes, comm_buffer_bytes, gathered_param_bytes, kernel_length_limits,
                                 layer_working_set_bytes, loss_bytes, model_state_bytes,
                                 offloaded_activation_host_bytes, optimizer_step_bytes, stored_activation_bytes)


def _zero_label(run: RunShape) -> str:
    if run.strategy == "deepspeed":
        return f"zero_stage {run.zero_stage}"
    return {"ddp": "DDP (replicated)", "fsdp2": "FSDP2 sharding (dp_shard x cp)"}[run.strategy]


def estimate(arch: Architecture, run: RunShape) -> Estimate:
    """Per-GPU and per-host memory of `run` training `arch`, term by term (see the module docstring)."""
    if run.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {run.strategy!r}; expected one of {STRATEGIES}")
    if run.loss not in LOSSES:
        raise ValueError(f"unknown loss {run.loss!r}; expected one of {LOSSES}")
    cpu = run.device == "cpu"
    states = model_state_bytes(arch, run)
    zl = _zero_label(run)
    length_setting = "max_length, per_device_train_batch_size" + (", cp_size" if run.cp > 1 else "") + (
        ", sp_size" if run.sp > 1 else "")

    # ---- phases
    ckpt_gpu = 0.0
    stored = 0.0
    if run.gradient_checkpointing:
        if not run.offload_activations or cpu:
            ckpt_gpu = checkpointed_input_bytes(arch, run)
    else:
        stored = stored_activation_bytes(arch, run)
    layer = layer_working_set_bytes(arch, run)["peak"]
    loss = loss_bytes(arch, run)["total"]
    step = optimizer_step_bytes(arch, run)
    static = states["params_gpu"] + states["grads_gpu"] + states["optim_gpu"]
    if cpu:  # one process holds everything, host-side states included
        static += states["params_host"] + states["params_host_pinned"] + states["grads_host"] + states["optim_host"]
    activations = ckpt_gpu + stored
    phase_loss = static + activations + comm_buffer_bytes(arch, run, "loss") + gathered_param_bytes(arch, run, "loss")
    phase_layer = (static + activations + comm_buffer_bytes(arch, run, "layer")
                   + gathered_param_bytes(arch, run, "layer"))
    phases = {"loss": phase_loss + loss, "layer": phase_layer + layer,
              "optimizer step": static + comm_buffer_bytes(arch, run, "step") + step}
    peak_phase = max(phases, key=phases.get)
    allocated = phases[peak_phase]
    in_fwd_bwd = peak_phase in ("loss", "layer")

    terms: list[Term] = []
    dev = "host" if cpu else "gpu"  # CPU mode: the process's own memory
    host_keys = ("params_host", "params_host_pinned", "grads_host", "optim_host")
    host_side = {k: (states[k] if cpu else 0.0) for k in host_keys}
    ds = run.strategy == "deepspeed"
    params_here = states["params_gpu"] + host_side["params_host"] + host_side["params_host_pinned"]
    terms.append(Term("parameters", gib(params_here),
                      f"{zl}" + (" / offload_param_device" if ds else "") + ", dtype", dev))
    terms.append(Term("gradients", gib(states["grads_gpu"] + host_side["grads_host"]),
                      f"{zl} / offload_optimizer_device" if ds else zl, dev))
    terms.append(Term("optimizer states" + (" (Adam + fp32 master)" if ds else " (Adam)"),
                      gib(states["optim_gpu"] + host_side["optim_host"]),
                      f"{zl} / offload_optimizer_device" if ds else zl, dev))
    phase_key = {"loss": "loss", "layer": "layer", "optimizer step": "step"}[peak_phase]
    gp = gathered_param_bytes(arch, run, "loss" if peak_phase == "loss" else "layer")
    if gp:
        terms.append(Term("gathered parameters", gib(gp),
                          "stage3_max_live_parameters / stage3_max_reuse_distance" if ds
                          else "fsdp_reshard_after_forward (one unit per layer)", dev, in_fwd_bwd))
    cb = comm_buffer_bytes(arch, run, phase_key)
    if cb:
        terms.append(Term("communication buffers", gib(cb),
                          "reduce_bucket_size (DeepSpeed default 5e8 with an Accelerate YAML)" if ds
                          else "DDP bucket_cap_mb / gradient_as_bucket_view" if run.strategy == "ddp"
                          else "FSDP2 reduce-scatter of one layer", dev))
    offload_knob = ("fsdp_activation_checkpointing_offload (or gradient_checkpointing_kwargs: {offload: true})"
                    if run.strategy == "fsdp2" else "gradient_checkpointing_kwargs: {offload: true}")
    if run.gradient_checkpointing:
        where_ckpt = "offloaded to host" if (run.offload_activations and not cpu) else f"offload with {offload_knob}"
        terms.append(Term("checkpointed activations (layer inputs)", gib(ckpt_gpu),
                          f"{length_setting}; {where_ckpt}", dev, in_fwd_bwd))
    else:
        terms.append(Term("stored activations (no checkpointing)", gib(stored),
                          f"{length_setting}; gradient_checkpointing", dev, in_fwd_bwd))
    layer_knobs = ["tiled_mlp_shards" if run.tiled_mlp else "tiled_mlp" if run.strategy == "deepspeed" else "",
                   "attn_implementation"]
    layer_knobs = [k for k in layer_knobs if k]
    if run.cp > 1:
        layer_knobs.append("cp_comm_strategy")
    if not run.liger_kernels:
        layer_knobs.append("use_liger_kernel")
    terms.append(Term("one layer's recompute + backward", gib(layer), f"{length_setting}; {', '.join(layer_knobs)}",
                      dev, peak_phase == "layer"))
    terms.append(Term("loss (LM head + cross-entropy)", gib(loss),
                      f"{length_setting}; loss implementation ({run.loss})", dev, peak_phase == "loss"))
    if step:
        terms.append(Term("optimizer step temporaries", gib(step),
                          "sub_group_size / offload_optimizer_device", dev, peak_phase == "optimizer step"))
    notes = []
    if cpu:
        terms.append(Term("process runtime (python, torch, transformers, deepspeed, trl)", CPU_RUNTIME_BASELINE_GIB,
                          "measured import baseline (CPU_RUNTIME_BASELINE_GIB)", dev))
        runtime = CPU_RUNTIME_BASELINE_GIB
        if ds:
            terms.append(Term("DeepSpeed engine runtime", CPU_DEEPSPEED_ENGINE_GIB,
                              "measured bare-engine overhead (CPU_DEEPSPEED_ENGINE_GIB)", dev))
            runtime += CPU_DEEPSPEED_ENGINE_GIB
        total = gib(allocated) + runtime
    else:
        ctx = OVERHEAD["cuda_context_gib"] + (OVERHEAD["nccl_gib"] if run.world_size > 1 else 0.0)
        terms.append(Term("CUDA context" + (" + NCCL buffers" if run.world_size > 1 else ""), ctx,
                          "fixed per process (OVERHEAD)", dev))
        reserve = OVERHEAD["allocator_reserve"] * gib(allocated)
        terms.append(Term("allocator reserve (fragmentation)", reserve,
                          "PYTORCH_CUDA_ALLOC_CONF (global 2% model)", dev))
        total = gib(allocated) + ctx + reserve

    # ---- host
    host: list[Term] = []
    if not cpu:
        if states["optim_host"] or states["grads_host"]:
            host.append(Term("offloaded optimizer states + fp32 master + gradients",
                             gib(states["optim_host"] + states["grads_host"]),
                             "offload_optimizer_device" if ds else "fsdp_offload_params", "host"))
        if states["params_host_pinned"] or states["params_host"]:
            pinned = states["params_host_pinned"]
            if pinned and run.strategy == "deepspeed":
                # one pinned flat buffer per parameter group (stage3.py `_create_param_groups_fp16_flat_cpu_memory`,
                # `pin_memory` -> torch's caching host allocator): rounded up to a power of two
                pinned = pow2(pinned)
            host.append(Term("offloaded parameters (pinned)", gib(pinned + states["params_host"]),
                             "offload_param_device" if ds else "fsdp_offload_params", "host"))
        act = offloaded_activation_host_bytes(arch, run)
        if act:
            host.append(Term("offloaded checkpoints" + (" (pinned, power-of-two blocks)" if run.offload_pinned else ""),
                             gib(act), f"{length_setting}; {offload_knob}", "host"))
        host.append(Term("process runtime (CPU-side, imports only)", CPU_RUNTIME_BASELINE_GIB,
                         "measured import baseline; CUDA libraries not included", "host"))
    host_proc = sum(t.gib for t in host)
    for reason, limit in kernel_length_limits(arch, run):
        if run.max_length > limit:
            notes.append(f"max_length {run.max_length} exceeds a kernel limit: {reason} -> at most {limit}")
    return Estimate(
        gpu_terms=terms,
        host_terms=host,
        gpu_peak_gib=total,
        host_per_process_gib=host_proc,
        host_per_node_gib=host_proc * run.processes_per_node,
        per_rank_length=run.per_rank_length,
        allocated_peak_gib=total if cpu else gib(allocated),
        peak_phase=peak_phase,
        device=run.device,
        notes=notes,
    )


def fits(est: Estimate, gpu_memory_gib: float, host_memory_gib: float | None = None) -> bool:
    """Whether the per-GPU peak fits the GPU budget and (when given) the node's host memory fits the host budget."""
    if est.gpu_peak_gib > gpu_memory_gib:
        return False
    if host_memory_gib is not None and est.host_per_node_gib > host_memory_gib:
        return False
    return True


def longest_length(
    arch: Architecture,
    run: RunShape,
    gpu_memory_gib: float,
    host_memory_gib: float | None = None,
    multiple: int = 1,
    *,
    respect_kernel_limits: bool = True,
) -> int:
    """Longest global max_length, a multiple of `multiple`, whose estimate fits; 0 if none does. Binary search (the
    estimate never decreases with length). With `respect_kernel_limits` (default) also at most the lengths of
    `kernel_length_limits` (a run past them crashes whatever the memory); False gives the memory limit alone."""
    multiple = max(int(multiple), 1)

    def ok(k: int) -> bool:
        return fits(estimate(arch, replace(run, max_length=k * multiple)), gpu_memory_gib, host_memory_gib)

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi * multiple > 2**40:
            break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    best = lo * multiple
    if respect_kernel_limits:
        for _reason, limit in kernel_length_limits(arch, run):
            best = min(best, (limit // multiple) * multiple)
    return best

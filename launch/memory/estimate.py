"""The estimate: the terms of a run assembled into phases and a peak (see the package docstring), whether it fits
a budget, and the longest length that does."""

from __future__ import annotations

from dataclasses import dataclass, replace

from launch.facts import calibration
from launch.memory import adapters
from launch.memory.architecture import Architecture
from launch.memory.constants import (CPU_DEEPSPEED_ENGINE_GIB, CPU_RUNTIME_BASELINE_GIB, CPU_TRAINER_RUNTIME_GIB, F32,
                                     LOSSES, NCCL_GIB, gib, pow2)
from launch.memory.results import Estimate, Term
from launch.memory.run_shape import RunShape
from launch.memory.terms import (autocast_weight_copy_bytes, checkpointed_input_bytes, unsynced_gradient_bytes,
                                 comm_buffer_bytes, gathered_param_bytes, kernel_length_limits, layer_working_set_bytes,
                                 loss_bytes, model_state_bytes, offloaded_activation_host_bytes, optimizer_step_bytes,
                                 packed_mask_bytes, stored_activation_bytes, gradients_alive_at_loss,
                                 nccl_communicators, tied_embedding_backward_bytes, without_checkpointing)

HOST_STATES = ("params_host", "params_host_pinned", "grads_host", "optim_host", "frozen_host")
# phase name -> the terms' phase argument
PHASE_KEY = {"loss": "loss", "layer": "layer", "optimizer step": "step", "end of backward": "step"}


def estimate(arch: Architecture, run: RunShape) -> Estimate:
    """Per-GPU and per-host memory of `run` training `arch`, term by term (see the package docstring): the phases
    and their peak, the device table of the peak phase, the fixed overheads on top, the host table, the notes."""
    if run.loss not in LOSSES:
        raise ValueError(f"unknown loss {run.loss!r}; expected one of {LOSSES}")
    phases = _phases(arch, run)
    overheads, total = _overheads(run, phases.allocated)
    host = _host_terms(arch, run, phases.states)
    host_proc = sum(t.gib for t in host)
    host_node = host_proc * run.layout.processes_per_machine
    if loading := _loading_term(arch, run):
        host.append(loading)  # transient, before training: the node's peak is the larger of the two
        host_node = max(host_node, loading.gib + CPU_RUNTIME_BASELINE_GIB * run.layout.processes_per_machine)
    gpu_terms = _device_terms(arch, run, phases) + overheads
    allocated, peak = gib(phases.allocated), phases.peak
    notes = _kernel_notes(arch, run) + _allocator_notes(run, phases)
    if startup := _synthetic_startup(arch, run):
        # before training, so never at the same time as the training phases: the GPU's peak is the larger of the two
        if startup.gib > allocated:  # the peak: the table's total is this line's, not the training terms'
            startup = replace(startup, counted=True)
            total += startup.gib - allocated
            allocated, peak = startup.gib, "synthetic start-up"
            notes.append(f"the synthetic start-up ({startup.gib:.1f} GiB per GPU: the whole model, before FSDP shards "
                         f"it) is this run's peak, above training's {gib(phases.allocated):.1f} GiB; a run from a "
                         "real checkpoint with fsdp_cpu_ram_efficient_loading does not have it")
        gpu_terms.append(startup)
    return Estimate(
        gpu_terms=gpu_terms,
        host_terms=host,
        gpu_peak_gib=total,
        host_per_process_gib=host_proc,
        host_per_node_gib=host_node,
        per_rank_length=run.layout.per_rank_length,
        allocated_peak_gib=total if run.device == "cpu" else allocated,
        peak_phase=peak,
        device=run.device,
        notes=notes,
    )


def _synthetic_startup(arch: Architecture, run: RunShape) -> Term | None:
    """A synthetic FSDP2 run on GPUs builds the random model whole on every GPU (launch/rank/synthetic.py: no
    checkpoint for rank 0 alone to read), and Accelerate upcasts it to fp32 under mixed precision before
    `fully_shard` (its fsdp2_prepare_model; the 16-bit copy is freed parameter by parameter): 4 bytes a parameter,
    or the load dtype's without mixed precision. Before training, so not counted with the training terms."""
    if not run.synthetic or run.device == "cpu" or run.layout.kind != "fsdp2":
        return None
    per_param = F32 if run.precision.mixed != "no" or run.precision.load_dtype == "float32" else 2
    return Term("synthetic start-up: the whole model on each GPU before FSDP2 shards it (transient)",
                gib(per_param * arch.num_params), "--synthetic (from a real checkpoint rank 0 alone reads the weights, "
                "with fsdp_cpu_ram_efficient_loading)", "gpu", counted=False)


# ---- 1. the phases of a step and their peak --------------------------------------------------------------------------
@dataclass(frozen=True)
class Phases:
    """Bytes allocated on the device in each phase of a step (which never overlap in time), and their parts."""

    states: dict  # model_state_bytes: parameters, gradients, optimizer states on the device and on the host
    checkpointed: float  # checkpointed layer inputs kept on the device (0 when offloaded)
    stored: float  # stored activations of the layers not checkpointed (all without checkpointing)
    layer: float  # one layer's recompute + backward (the backward alone for a layer not checkpointed)
    loss: float  # LM head + cross-entropy
    step: float  # optimizer step temporaries
    totals: dict  # phase name ("loss", "layer", "optimizer step") -> bytes
    stored_in_layer: bool = True  # whether the layer phase's peak comes with the stored activations alive
    mask: float = 0.0  # a padding-free row's attention mask, held by the checkpointed layers (packed_mask_bytes)

    @property
    def peak(self) -> str:
        return max(self.totals, key=self.totals.get)

    @property
    def allocated(self) -> float:
        return self.totals[self.peak]


def _phases(arch: Architecture, run: RunShape) -> Phases:
    cpu = run.device == "cpu"
    states = model_state_bytes(arch, run)
    L = arch.num_layers
    k = run.checkpointed_layers(L)  # the first k checkpointed, the last L - k not (launch/rank/partial_checkpointing)
    checkpointed = 0.0
    if k and (not run.offload_activations or cpu):
        checkpointed = checkpointed_input_bytes(arch, run)
    stored = stored_activation_bytes(arch, run)
    loss = loss_bytes(arch, run)["total"]
    step = optimizer_step_bytes(arch, run)
    static = states["params_gpu"] + states["grads_gpu"] + states["optim_gpu"] + states["frozen_gpu"]
    if cpu:  # one process holds everything, host-side states included
        static += sum(states[key] for key in HOST_STATES)
    # a packed row's mask (transformers builds it once per forward): the checkpointed layers hold it to the backward
    mask = packed_mask_bytes(arch, run)["model"] if k else 0.0
    activations = checkpointed + stored + mask
    unsynced = unsynced_gradient_bytes(arch, run)  # FSDP's no_sync gradients, from the first micro-batch on
    # the loss runs before the backward has made any gradient (zero_grad sets them to None), unless they persist
    grads_at_loss = 0.0 if gradients_alive_at_loss(run) else states["grads_gpu"]
    phase_loss = (static - grads_at_loss + activations + comm_buffer_bytes(arch, run, "loss")
                  + gathered_param_bytes(arch, run, "loss") + autocast_weight_copy_bytes(arch, run, "loss") + unsynced)
    # The backward goes from the last layer down: through the L - k layers not checkpointed first (their stored
    # activations alive, no recompute), then through the k checkpointed ones (the stored activations freed, one
    # layer recomputed at a time). Through each stretch the gradients grow as the activations shrink: at its first
    # layer its activations and the gradients made so far (at the very first, only the LM head's), at its last one
    # layer's activations and more gradients (at the very last, all); the worse end of the worse stretch counts (when
    # the gradients persist between steps, all of them count throughout, and the first end is the worse).
    head = 0.0 if run.adapter is not None else grads_at_loss * arch.lm_head_params / arch.num_params
    made_by_stored = head + (grads_at_loss - head) * (L - k) / L  # the gradients when the checkpointed stretch starts
    around = (comm_buffer_bytes(arch, run, "layer") + gathered_param_bytes(arch, run, "layer") + unsynced)
    stretches = {}
    if k < L:  # the layers not checkpointed: everything held, one layer's backward on top
        plain = without_checkpointing(run)
        ends = (activations + head, checkpointed + mask + stored / (L - k) + made_by_stored)
        stretches[True] = (max(ends) if grads_at_loss else ends[0],
                           autocast_weight_copy_bytes(arch, plain, "layer") * (L - k) / L,
                           layer_working_set_bytes(arch, plain)["peak"])
    if k:  # the checkpointed ones: their inputs held, one layer recomputed and its backward on top
        ends = (checkpointed + mask + (made_by_stored if k < L else head), checkpointed / k + mask + grads_at_loss)
        stretches[False] = (max(ends) if grads_at_loss else ends[0], autocast_weight_copy_bytes(arch, run, "layer"),
                            layer_working_set_bytes(arch, run)["peak"])
    layer_totals = {alive: static - grads_at_loss + held + around + copies + working
                    for alive, (held, copies, working) in stretches.items()}
    stored_in_layer = max(layer_totals, key=layer_totals.get)
    layer = stretches[stored_in_layer][2]
    totals = {"loss": phase_loss + loss, "layer": layer_totals[stored_in_layer],
              "optimizer step": static + comm_buffer_bytes(arch, run, "step") + step}
    if tied := tied_embedding_backward_bytes(arch, run):
        totals["end of backward"] = static + comm_buffer_bytes(arch, run, "step") + tied
    return Phases(states, checkpointed, stored, layer, loss, step, totals, stored_in_layer, mask)


# ---- 2. the device table: one term per line, the peak phase's counted ------------------------------------------------
def _zero_label(run: RunShape) -> str:
    if run.layout.sharding == "zero":
        return f"zero_stage {run.layout.zero_stage}"
    return {"replicated": "DDP (replicated)",
            "fsdp": f"{run.layout.kind.upper()} sharding (dp_shard x cp)"}[run.layout.sharding]


def _length_setting(run: RunShape) -> str:
    return "max_length, per_device_train_batch_size" + (", cp_size" if run.layout.cp > 1 else "") + (
        ", sp_size" if run.layout.sp > 1 else "")


def _offload_knob(run: RunShape) -> str:
    return ("fsdp_activation_checkpointing_offload (or gradient_checkpointing_kwargs: {offload: true})"
            if run.layout.sharding == "fsdp" else "gradient_checkpointing_kwargs: {offload: true}")


def _device_terms(arch: Architecture, run: RunShape, phases: Phases) -> list[Term]:
    """Model states, gathered parameters, communication buffers, activations, the layer, the loss and the step, in
    GiB; on CPU the process's own memory (host-side states included)."""
    cpu = run.device == "cpu"
    states, peak = phases.states, phases.peak
    in_fwd_bwd = peak in ("loss", "layer")
    zl, length_setting = _zero_label(run), _length_setting(run)
    dev = "host" if cpu else "gpu"  # CPU mode: the process's own memory
    host_side = {k: (states[k] if cpu else 0.0) for k in HOST_STATES}
    ds = run.layout.sharding == "zero"
    terms: list[Term] = []
    params_here = states["params_gpu"] + host_side["params_host"] + host_side["params_host_pinned"]
    if run.adapter is not None:
        q = run.adapter.quantization
        base = (f"{q.bits}-bit {q.quant_type} base (load_in_4bit, use_bnb_nested_quant, bnb_4bit_quant_storage)"
                if q and q.bits == 4 else "8-bit base (load_in_8bit)" if q else "dtype, or a 4-bit base (load_in_4bit)")
        terms.append(Term("frozen base parameters (no gradients)", gib(states["frozen_gpu"] + host_side["frozen_host"]),
                          f"{zl}, {base}" + (", fsdp_offload_params" if run.layout.sharding == "fsdp" else ""), dev))
    terms.append(Term("parameters" if run.adapter is None else "adapter parameters (LoRA A, B)", gib(params_here),
                      (f"{zl}" + (" / offload_param_device" if ds else "") + ", dtype") if run.adapter is None
                      else f"{zl}, lora_r, lora_target_modules", dev))
    terms.append(Term("gradients", gib(states["grads_gpu"] + host_side["grads_host"]),
                      f"{zl} / offload_optimizer_device" if ds else zl, dev,
                      peak != "loss" or gradients_alive_at_loss(run)))
    terms.append(Term("optimizer states" + (" (Adam + fp32 master)" if ds else " (Adam)"),
                      gib(states["optim_gpu"] + host_side["optim_host"]),
                      f"{zl} / offload_optimizer_device" if ds else zl, dev))
    gp = gathered_param_bytes(arch, run, "loss" if peak == "loss" else "layer")
    if gp:
        terms.append(Term("gathered parameters", gib(gp),
                          "stage3_max_live_parameters / stage3_max_reuse_distance" if ds
                          else ("fsdp_sharding_strategy" if run.layout.kind == "fsdp1"
                                else "fsdp_reshard_after_forward")
                          + " (one unit per layer)", dev, in_fwd_bwd))
    if unsynced := unsynced_gradient_bytes(arch, run):
        terms.append(Term("unsharded gradients accumulated without sync (FSDP no_sync)", gib(unsynced),
                          "gradient_accumulation_steps; "
                          "accelerator_config.gradient_accumulation_kwargs.sync_each_batch",
                          dev, in_fwd_bwd))
    if copies := autocast_weight_copy_bytes(arch, run, "loss" if peak == "loss" else "layer"):
        terms.append(Term("autocast's 16-bit copies of the fp32 weights", gib(copies),
                          "dtype float32 under bf16 (the fp32 masters); gradient_checkpointing", dev, in_fwd_bwd))
    cb = comm_buffer_bytes(arch, run, PHASE_KEY[peak])
    if cb:
        terms.append(Term("communication buffers", gib(cb),
                          "reduce_bucket_size (DeepSpeed default 5e8 with an Accelerate YAML)" if ds
                          else "DDP bucket_cap_mb / gradient_as_bucket_view" if run.layout.sharding == "replicated"
                          else f"{run.layout.kind.upper()} reduce-scatter of one layer", dev))
    L = arch.num_layers
    k = run.checkpointed_layers(L)
    partial = ", checkpointing_layers" if 0 < k < L else ""
    if k:
        where = "offloaded to host" if (run.offload_activations and not cpu) else f"offload with {_offload_knob(run)}"
        terms.append(Term("checkpointed activations (layer inputs)" if k == L else
                          f"checkpointed activations (inputs of the first {k} of {L} layers)",
                          gib(phases.checkpointed), f"{length_setting}; {where}{partial}", dev, in_fwd_bwd))
    if k < L:
        # with partial checkpointing the backward frees them before it recomputes a layer: not always in the peak
        terms.append(Term("stored activations (no checkpointing)" if not k else
                          f"stored activations (the last {L - k} of {L} layers, not checkpointed)",
                          gib(phases.stored), f"{length_setting}; gradient_checkpointing{partial}", dev,
                          in_fwd_bwd and (peak == "loss" or phases.stored_in_layer)))
    if phases.mask:
        rows, n = run.attention_rows
        terms.append(Term(f"packed row's attention mask ({n:,} x {n:,}, one per forward)", gib(phases.mask),
                          f"{length_setting}; packing / padding_free with attn_implementation "
                          f"{run.attn_implementation} (flash_attention_2/3/4 run varlen, no mask)", dev, in_fwd_bwd))
    layer_knobs = ["tiled_mlp_shards" if run.tiled_mlp else "tiled_mlp" if ds else "", "attn_implementation"]
    layer_knobs = [k for k in layer_knobs if k]
    if run.layout.cp > 1:
        layer_knobs.append("cp_comm_strategy")
    if not run.liger_kernels:
        layer_knobs.append("use_liger_kernel")
    terms.append(Term("one layer's recompute + backward", gib(phases.layer),
                      f"{length_setting}; {', '.join(layer_knobs)}", dev, peak == "layer"))
    terms.append(Term("loss (LM head + cross-entropy)", gib(phases.loss),
                      f"{length_setting}; loss implementation ({run.loss})", dev, peak == "loss"))
    if tied := tied_embedding_backward_bytes(arch, run):
        terms.append(Term("tied embedding gradient (end of backward)", gib(tied), "tie_word_embeddings, dtype", dev,
                          peak == "end of backward"))
    if phases.step:
        terms.append(Term("optimizer step temporaries", gib(phases.step),
                          "sub_group_size / offload_optimizer_device", dev, peak == "optimizer step"))
    return terms


# ---- 3. what comes on top of the allocated peak ---------------------------------------------------------------------
def _overheads(run: RunShape, allocated: float) -> tuple[list[Term], float]:
    """The fixed terms on top of the allocated bytes and the total in GiB: on CPU the process runtime (and the
    DeepSpeed engine's); on a GPU the CUDA context and workspaces (+ NCCL's buffers) and the allocator's reserve
    (`launch.facts.calibration`: measured per strategy)."""
    if run.device == "cpu":
        terms = [Term("process runtime (python, torch, transformers, deepspeed, trl)", CPU_RUNTIME_BASELINE_GIB,
                      "measured import baseline (CPU_RUNTIME_BASELINE_GIB)", "host")]
        runtime = CPU_RUNTIME_BASELINE_GIB
        if run.layout.sharding == "zero":
            # the smoke model's ddp and zero3 processes peak alike (0.55 GiB): the bare-engine measurement already
            # holds what a training process adds (its process group, thread pools), so the trainer's is not added
            terms.append(Term("DeepSpeed engine runtime", CPU_DEEPSPEED_ENGINE_GIB, "measured bare-engine overhead "
                              "(CPU_DEEPSPEED_ENGINE_GIB; it covers CPU_TRAINER_RUNTIME_GIB)", "host"))
            runtime += CPU_DEEPSPEED_ENGINE_GIB
        else:
            terms.append(Term("training process (Trainer, gloo group, data, tracking)", CPU_TRAINER_RUNTIME_GIB,
                              "measured smoke-run overhead (CPU_TRAINER_RUNTIME_GIB)", "host"))
            runtime += CPU_TRAINER_RUNTIME_GIB
        return terms, gib(allocated) + runtime
    communicators = nccl_communicators(run)  # NCCL's buffers: one allowance per communicator (2-D meshes: several)
    distributed = communicators > 0
    ctx = calibration.CUDA_CONTEXT_GIB + NCCL_GIB * communicators
    ratio = calibration.reserved_over_allocated(run.layout.sharding, run.expandable_segments)
    reserve = (ratio - 1) * gib(allocated)
    measured = not run.expandable_segments and run.layout.sharding in calibration.RESERVED_OVER_ALLOCATED
    terms = [Term("CUDA context" + (" + NCCL buffers" if distributed else ""), ctx,
                  f"fixed per process (CUDA context and workspaces {calibration.CUDA_CONTEXT_GIB:.2f} GiB, measured)"
                  + (f"; {communicators} NCCL communicator(s) (mesh dimensions)" if distributed else ""), "gpu"),
             Term("allocator reserve (fragmentation)", reserve,
                  f"reserved / allocated {ratio:.2f} ("
                  + ("measured for this strategy" if measured else "published bound; not measured for this run")
                  + "); PYTORCH_CUDA_ALLOC_CONF "
                  + ("expandable_segments:True" if run.expandable_segments else "without expandable_segments"), "gpu")]
    return terms, gib(allocated) + ctx + reserve


# ---- 4. the host table (GPU runs: what lives in the node's memory, per process) -------------------------------------
def _host_terms(arch: Architecture, run: RunShape, states: dict) -> list[Term]:
    """Offloaded optimizer states and gradients, offloaded parameters, offloaded checkpoints and the process runtime;
    none on CPU, where the device table is the process already."""
    if run.device == "cpu":
        return []
    ds = run.layout.sharding == "zero"
    host: list[Term] = []
    if states["optim_host"] or states["grads_host"]:
        host.append(Term("offloaded optimizer states + fp32 master + gradients",
                         gib(states["optim_host"] + states["grads_host"]),
                         "offload_optimizer_device" if ds else "fsdp_offload_params", "host"))
    if states["params_host_pinned"] or states["params_host"]:
        pinned = states["params_host_pinned"]
        if pinned and ds:
            # one pinned flat buffer per parameter group (stage3.py `_create_param_groups_fp16_flat_cpu_memory`,
            # `pin_memory` -> torch's caching host allocator): rounded up to a power of two
            pinned = pow2(pinned)
        host.append(Term("offloaded parameters (pinned)", gib(pinned + states["params_host"]),
                         "offload_param_device" if ds else "fsdp_offload_params", "host"))
    if states["frozen_host"]:
        host.append(Term("offloaded frozen base parameters", gib(states["frozen_host"]),
                         "offload_param_device" if ds else "fsdp_offload_params", "host"))
    act = offloaded_activation_host_bytes(arch, run)
    if act:
        host.append(Term("offloaded checkpoints" + (" (pinned, power-of-two blocks)" if run.offload_pinned else ""),
                         gib(act), f"{_length_setting(run)}; {_offload_knob(run)}", "host"))
    host.append(Term("process runtime (CPU-side, imports only)", CPU_RUNTIME_BASELINE_GIB,
                     "measured import baseline; CUDA libraries not included", "host"))
    return host


def _loading_term(arch: Architecture, run: RunShape) -> Term | None:
    """Host memory of one node while the model loads, before training (GPU runs): transformers' `from_pretrained`
    without a device_map reads the weights into host memory in their load dtype (a QLoRA base quantized as it loads)
    and the Trainer then moves them to the GPU, so every process of the node holds a whole copy at once; with FSDP's
    `fsdp_cpu_ram_efficient_loading` only rank 0 does (the others start on the meta device and receive their shards,
    accelerate/utils/fsdp_utils.py `fsdp2_load_full_state_dict`). DeepSpeed ZeRO-3 partitions while loading
    (zero.Init): not counted. Listed per node, not in the per-process total."""
    if run.device == "cpu" or (run.layout.sharding == "zero" and run.layout.zero_stage == 3):
        return None
    if run.adapter is not None:
        frozen = adapters.frozen_bytes(arch, run)
        copy = frozen["shardable"] + frozen["unshardable"]
    else:
        copy = arch.num_params * adapters.base_dtype_bytes(run)
    copies = 1 if run.cpu_ram_efficient_loading else run.layout.processes_per_machine
    how = "fsdp_cpu_ram_efficient_loading: rank 0 only" if run.cpu_ram_efficient_loading else (
        "every process reads a whole copy" + ("; fsdp_cpu_ram_efficient_loading: rank 0 only"
                                              if run.layout.sharding == "fsdp" else ""))
    return Term(f"model loading, per node ({copies} whole cop{'y' if copies == 1 else 'ies'}; transient)",
                gib(copies * copy), how, "host", counted=False)


def _kernel_notes(arch: Architecture, run: RunShape) -> list[str]:
    """A note for each kernel whose length limit the run's max_length passes (a crash, whatever the memory)."""
    length = run.layout.max_length
    return [f"max_length {length} exceeds a kernel limit: {reason} -> at most {limit}"
            for reason, limit in kernel_length_limits(arch, run) if length > limit]


# A transient at least this share of the allocated peak and this large is where the caching allocator's
# fragmentation can outgrow the reserve planned without expandable segments (measured at 2K-4K tokens, where
# transients are small: launch/facts/calibration.py): freed multi-GiB blocks of one phase cannot be
# split for the next phase's differently sized tensors (PyTorch's CUDA notes recommend expandable_segments for jobs
# whose allocation sizes change); ALST's published examples export it (ArcticTraining,
# projects/sequence-parallelism/README.md); the allocator setting of the run the published 2% bound comes from is
# not recorded. Stated thresholds for a note, not fitted figures: at the shipped GPU defaults ordinary transients are
# 10-21% of the peak and 1-8 GiB (ddp 1.2 GiB, fsdp2-70b 7.6 GiB), the long-context ones 51-90% and 33-53 GiB.
LARGE_TRANSIENT_SHARE = 1 / 3
LARGE_TRANSIENT_GIB = 8.0


def _allocator_notes(run: RunShape, phases: Phases) -> list[str]:
    """On a GPU without expandable segments: a note when one phase's transient (a layer's recompute and backward, or
    the loss) is a large share of the peak and several GiB, where fragmentation can outgrow the reserve planned."""
    if run.device == "cpu" or run.expandable_segments:
        return []
    ratio = calibration.reserved_over_allocated(run.layout.sharding, run.expandable_segments)
    transient = max(phases.layer, phases.loss)
    if transient < LARGE_TRANSIENT_SHARE * phases.allocated or gib(transient) < LARGE_TRANSIENT_GIB:
        return []
    return [f"one phase's transient tensors take {gib(transient):.1f} GiB per GPU ({transient / phases.allocated:.0%} "
            "of the allocated peak) and PYTORCH_CUDA_ALLOC_CONF does not set expandable_segments:True: the caching "
            f"allocator's fragmentation may then exceed the {ratio - 1:.0%} planned (measured with short sequences). "
            "Set it in the config's env: block, as "
            "alst-ulysses-8gpu does"]


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
        return fits(estimate(arch, run.with_length(k * multiple)), gpu_memory_gib, host_memory_gib)

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

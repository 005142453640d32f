"""The terms of the memory model, each a small function of (architecture, run shape) whose docstring says what it
counts and from which upstream code: model states, gathered parameters and communication buffers, activations,
the loss, the optimizer step, offloaded host memory, and the kernels' length limits."""

from __future__ import annotations

import math
from dataclasses import replace

from launch.memory import adapters
from launch.memory.architecture import Architecture
from launch.memory.constants import F32, INT32_ELEMENTS, TRL_TOKEN_CHUNK, TRL_VOCAB_CHUNK, pow2
from launch.memory.run_shape import RunShape
from launch.config.precision import BYTES


def param_bytes(run: RunShape) -> int:
    """Bytes per element of the trainable parameters as they are kept on the device (`run.precision`,
    launch.config.precision, says per strategy: DeepSpeed's 16-bit module with an fp32 master in its optimizer; DDP and
    one process in the load dtype; an adapter in its own dtype).

    FSDP2 (accelerate/utils/fsdp_utils.py `fsdp2_prepare_model`): with mixed_precision != "no", every trainable
    parameter is upcast to fp32 before `fully_shard` ("FSDP upcast of low precision parameters to fp32"), and
    MixedPrecisionPolicy(param_dtype=bf16) only casts the all-gathered copy. So the shard is fp32 even for a model
    loaded in bf16; without mixed precision it keeps the loaded dtype. An adapter: Accelerate skips the upcast when
    the model holds bitsandbytes 4-bit weights (`model_has_params4bit`), and TRL has cast a quantized model's adapter
    to bf16; an unquantized model's adapter is fp32 already (PEFT)."""
    return run.precision.param_bytes


def _compute_bytes(run: RunShape) -> int:
    """Bytes of an element in the compute dtype (gathered FSDP / ZeRO-3 parameters, 16-bit gradients before they are
    reduced): bf16/fp16 under mixed precision, else the weights' own."""
    return BYTES.get(run.precision.compute_dtype, 4)


def model_state_bytes(arch: Architecture, run: RunShape) -> dict:
    """Per-rank bytes of parameters, gradients and optimizer states, split into GPU and host.

    DDP (torch DistributedDataParallel via Accelerate): parameters and gradients whole, in the parameter dtype; the
      reducer's flat buckets are a second copy of the gradients (gradient_as_bucket_view=False, Accelerate's
      default) -- counted under communication buffers; AdamW states (exp_avg, exp_avg_sq) `zeros_like(param)`, so
      in the parameter dtype: 4 + 4 + 8 bytes for the fp32 load the recipes use (the parameters are the fp32
      masters), 2 + 2 + 4 for a bf16 load (pure bf16, which launch.checks.rules refuses where updates round away).
    DeepSpeed (bf16): 16-bit parameters; gradients in grad_accum_dtype, which defaults to the model dtype
      (engine.get_data_types: bf16); fp32 master copy and fp32 Adam states in the optimizer.
      ZeRO-1: parameters and gradients whole, master and Adam partitioned over the ZeRO group.
      ZeRO-2: gradients partitioned too (`grads_in_partition`). ZeRO-3: everything partitioned
      (`grad_partitions_flat_buffer`, stage3.py). `offload_optimizer_device: cpu` moves master, Adam, the fp32
      gradient buffer and (ZeRO-3) the 16-bit gradient partitions to the host (stage3.py `self.device = cpu`);
      `offload_param_device: cpu` moves the ZeRO-3 16-bit partitions to a pinned host buffer.
      Parameters under `stage3_param_persistence_threshold` (norms, biases) stay whole on every rank.
    FSDP2 (Accelerate): fp32 shards (see `param_bytes`), fp32 sharded gradients, fp32 Adam,
      over the dp_shard x cp mesh; `fsdp_offload_params` keeps all three on the host.
    Adapters (`run.adapter`): the three above count the adapter's parameters only (`adapters.trainable_params`);
      the frozen base is `frozen_gpu` / `frozen_host` (no gradient, no optimizer state), sharded as parameters are
      (FSDP and ZeRO-3 over the shard group, whole under DDP and ZeRO-1/2; see `adapters.frozen_bytes`).
    """
    P = adapters.trainable_params(arch, run)
    p = param_bytes(run)
    W = run.layout.shard_group
    out = {"params_gpu": 0.0, "grads_gpu": 0.0, "optim_gpu": 0.0, "params_host": 0.0, "grads_host": 0.0,
           "optim_host": 0.0, "params_host_pinned": 0.0, "frozen_gpu": 0.0, "frozen_host": 0.0}
    frozen = adapters.frozen_bytes(arch, run)
    shards = run.layout.sharding == "fsdp" or (run.layout.sharding == "zero" and run.layout.zero_stage == 3)
    frozen_per_rank = frozen["shardable"] / (W if shards else 1) + frozen["unshardable"]
    if run.layout.offload_params and shards:
        out["frozen_host"] = frozen_per_rank
    else:
        out["frozen_gpu"] = frozen_per_rank
    prec = run.precision
    if run.layout.sharding == "replicated":
        out.update(params_gpu=p * P, grads_gpu=prec.grad_bytes * P, optim_gpu=prec.adam_bytes * P)
        return out
    if run.layout.sharding == "zero" and not run.layout.zero_stage:
        # ZeRO stage 0 (bf16): whole 16-bit params and grads, fp32 master and Adam (not used by any recipe)
        out.update(params_gpu=p * P, grads_gpu=p * P, optim_gpu=(8 + (4 if p < 4 else 0)) * P)
        return out
    if run.layout.sharding == "fsdp":
        s = param_bytes(run)
        adam = prec.adam_bytes
        if run.layout.offload_params:
            out.update(params_host_pinned=s * P / W, grads_host=s * P / W, optim_host=adam * P / W)
        else:
            out.update(params_gpu=s * P / W, grads_gpu=s * P / W, optim_gpu=adam * P / W)
        return out
    # DeepSpeed ZeRO 1-3
    stage = run.layout.zero_stage
    g = prec.grad_bytes  # grad_accum_dtype defaults to the model dtype
    # fp32 master copy: ZeRO-1/2 always clone the partition to fp32 (`single_partition_of_fp32_groups`); ZeRO-3
    # reuses an fp32 partition that already lives on the optimizer's device (stage3.py `_create_fp32_partitions`)
    master = 0 if (stage == 3 and p == 4 and not run.layout.offload_optimizer) else 4
    adam = 8
    small = arch.small_params if run.adapter is None else 0  # an adapter's own norms and biases: none
    if stage == 1:
        out["params_gpu"] = p * P
        out["grads_gpu"] = g * P
    elif stage == 2:
        out["params_gpu"] = p * P
        out["grads_gpu"] = g * P / W
    else:
        part = (P - small) / W + small
        if run.layout.offload_params:
            out["params_host_pinned"] = p * (P - small) / W
            out["params_gpu"] = p * small
        else:
            out["params_gpu"] = p * part
        if run.layout.offload_optimizer:
            out["grads_host"] = g * P / W
        else:
            out["grads_gpu"] = g * part
    if run.layout.offload_optimizer:
        # master + Adam + the fp32 gradient the optimizer steps on (stage3.py `subgroup_gradient_buffer`,
        # stage_1_and_2.py `single_partition_of_fp32_groups[i].grad`)
        out["optim_host"] = (4 + adam + 4) * P / W
    else:
        out["optim_gpu"] = (master + adam) * P / W
    return out


# =====================================================================================================================
# Gathered parameters and communication buffers
# =====================================================================================================================
def gathered_param_bytes(arch: Architecture, run: RunShape, phase: str) -> float:
    """Unsharded parameter copies alive on a GPU at a phase ("loss" or "layer").

    ZeRO-3 (deepspeed/runtime/zero/partitioned_param_coordinator.py): gathered parameters are released only when
      their next use is farther than `stage3_max_reuse_distance` (1e9 elements) and prefetching stops at
      `stage3_max_live_parameters` (1e9); at the end of the forward the LM head and the last layers are reused
      within that distance by the backward. Modelled as max(max_live_parameters, LM head + 2 layers) 16-bit
      elements, capped at the model. A one-rank group gathers nothing (`_no_gather_coalesced`: the partition is the
      parameter) unless parameters live on the host (`NoGatherHandle` copies them to the GPU).
    FSDP2 (torch fully_shard, one unit per decoder layer): the current layer and the one prefetched, in param_dtype;
      Accelerate shards [final norm, LM head] as one tail unit with reshard_after_forward=False, so the LM head stays
      gathered from the end of the forward to its backward (loss phase). With fsdp_reshard_after_forward false,
      every unit stays gathered.
    DDP / ZeRO-1/2: parameters are whole already (nothing extra).
    Gathered copies are in the compute dtype (FSDP's param_dtype, ZeRO-3's 16-bit module).
    """
    a = _compute_bytes(run)
    if run.layout.sharding == "zero" and run.layout.zero_stage == 3:
        if run.layout.shard_group == 1 and not run.layout.offload_params:
            return 0.0
        live = max(run.max_live_parameters, arch.lm_head_params + 2 * arch.params_per_layer)
        return a * min(arch.num_params, live)
    if run.layout.sharding == "fsdp":
        # adapters: a layer's frozen weights as stored (4-bit packed under QLoRA) + its share of the adapter
        layer = (a * arch.params_per_layer if run.adapter is None else adapters.frozen_layer_bytes(arch, run)
                 + a * adapters.trainable_params(arch, run) / arch.num_layers)
        outside = a * (arch.num_params - arch.num_layers * arch.params_per_layer)  # embeddings, final norm, LM head
        if not run.fsdp_reshard_after_forward:
            return arch.num_layers * layer + outside  # every unit stays gathered from its forward to its backward
        if phase == "loss":
            return layer + a * (arch.lm_head_params + arch.hidden_size)
        return 2 * layer
    return 0.0


def autocast_weight_copy_bytes(arch: Architecture, run: RunShape, phase: str) -> float:
    """16-bit copies that autocast makes of fp32 trainable weights, at a phase ("loss" or "layer"): DDP or one process
    loading the model in fp32 under bf16/fp16 mixed precision (`run.precision.autocast_copies`: the recipes' fp32
    masters). torch's autocast caches the cast of a leaf tensor that requires grad (aten/src/ATen/autocast_mode.cpp
    `cached_cast`) until the outermost autocast region exits, and Accelerate's autocast wraps the model's whole
    forward, TRL's fused LM head included (which casts the head's weight tile by tile itself, uncached): at the loss
    every decoder layer's linear weights have a 16-bit copy. With checkpointing the backward recomputes a layer in an
    autocast region of its own, whose copies the recomputed graph keeps until that layer's backward: one layer's.
    Without checkpointing each layer's copies are saved for its backward: all of them at the first one. (FSDP's
    param_dtype and DeepSpeed's 16-bit module hand autocast 16-bit weights: nothing to copy. An adapter's own copies
    are tiny: not counted.)"""
    if not run.precision.autocast_copies or run.adapter is not None or phase not in ("loss", "layer"):
        return 0.0
    per_layer = BYTES.get(run.precision.compute_dtype, 2) * arch.matmul_params_per_layer
    if phase == "layer" and run.gradient_checkpointing:
        return float(per_layer)
    return float(per_layer * arch.num_layers)


def unsynced_gradient_bytes(arch: Architecture, run: RunShape) -> float:
    """Unsharded gradients FSDP accumulates between the micro-batches of a step. With gradient accumulation the
    Trainer runs every micro-batch but the last under `accelerator.no_sync` (transformers Trainer's training loop;
    DeepSpeed excepted), which for FSDP2 is `set_requires_gradient_sync(False)`: no reduce-scatter, each parameter's
    whole gradient kept and summed on every rank (torch fsdp/_fully_shard/_fsdp_param.py
    `unsharded_accumulated_grad`, in reduce_dtype: bf16 under Accelerate's mixed precision), until the last
    micro-batch reduce-scatters it. FSDP1's `no_sync` keeps its unsharded FlatParameter gradients likewise. Alive from
    the first micro-batch's backward through the last one's: the loss and layer phases. None with one micro-batch,
    or with Accelerate's `sync_each_batch` (a reduce-scatter per micro-batch into the sharded fp32 gradients)."""
    if run.layout.sharding != "fsdp" or run.layout.gradient_accumulation_steps <= 1 or run.sync_each_batch:
        return 0.0
    return float(BYTES.get(run.precision.reduce_dtype, 4) * adapters.trainable_params(arch, run))


def comm_buffer_bytes(arch: Architecture, run: RunShape, phase: str) -> float:
    """Gradient-reduction buffers on a GPU at a phase ("loss", "layer" or "step").

    DDP: the reducer's flat buckets, one persistent copy of all gradients in the parameter dtype
      (gradient_as_bucket_view=False, Accelerate's default); none with one process (no DDP wrapper).
    DeepSpeed ZeRO-1/2 (stage_1_and_2.py `setup_buckets`): one `reduce_bucket_size` buffer in the gradient dtype (two
      with overlap_comm, off by default for stages 1-2); during the backward also one layer's 16-bit gradients
      before they are copied in.
    DeepSpeed ZeRO-3 (stage3.py `_setup_for_real_optimizer`): the IPG bucket, `reduce_bucket_size` elements
      (contiguous_gradients); while the backward reduces a bucket, also the `torch.cat` of its partitions in
      `reduce_scatter_coalesced` (comm/coalesced_collectives.py), up to one bucket.
    FSDP2: during the layer backward one layer's unsharded gradients plus the flat reduce-scatter input
      (`foreach_reduce`), 2 x layer; the LM head's own reduce-scatter comes after the loss peak.
    The bucket size is what the run gets: with an Accelerate YAML, DeepSpeed's default 5e8 elements (1 GB in bf16),
    not transformers' "auto" hidden**2 (filled only where a DeepSpeed JSON says "auto").
    On CPU only the pages a buffer actually touches are resident (measured: an untouched 5e8-element fp32
    `torch.empty` adds no RSS; a tiny model's ZeRO-2/3 engine adds ~0.12 GiB in all), so a bucket counts at most
    the gradients that stream through it.
    """
    # the buckets hold gradients in the compute dtype (DeepSpeed's 16-bit gradients, FSDP's param_dtype ones); the
    # fp32 copies DeepSpeed reduces under Ulysses SP (`Precision.reduce_dtype`) are not counted
    a = _compute_bytes(run)
    P = adapters.trainable_params(arch, run)  # only parameters with gradients are reduced
    layer = P / arch.num_layers if run.adapter is not None else arch.params_per_layer
    bucket = run.reduce_bucket_size
    if run.device == "cpu":
        bucket = min(bucket, P)
    if run.layout.sharding == "replicated":
        # Accelerate wraps the model in DDP only with more than one process (`prepare_model`: MULTI_GPU and
        # num_processes > 1): one process has no reducer and no buckets
        return run.precision.grad_bytes * P if run.layout.world_size > 1 else 0.0
    if run.layout.sharding == "fsdp":
        return a * 2 * layer if phase == "layer" else 0.0
    if run.layout.sharding == "zero":
        if run.layout.zero_stage == 3:
            cat = min(bucket, P) if (phase == "layer" and run.device != "cpu") else 0
            return a * (bucket + cat)
        return a * (bucket + (layer if phase == "layer" else 0))
    return 0.0


# =====================================================================================================================
# Activations
# =====================================================================================================================
def checkpointed_input_bytes(arch: Architecture, run: RunShape, n_tokens: int | None = None) -> float:
    """Checkpointed activations: with gradient checkpointing each decoder layer keeps its input, the hidden states
    [micro-batch, local length, hidden] in the residual stream's dtype (`RunShape.residual_bytes`: fp32 under
    autocast over fp32 weights; transformers `GradientCheckpointingLayer`; FSDP's `checkpoint_wrapper`). Whole model:
    checkpointed layers (all, or the first `checkpointing_layers`) x tokens x hidden x bytes, plus the rotary cos/sin
    [tokens, head_dim] computed once per forward and shared by every layer. On the GPU unless offloaded (see
    `offloaded_activation_host_bytes`)."""
    n = run.layout.tokens_per_rank if n_tokens is None else n_tokens
    a = run.act_bytes
    return run.checkpointed_layers(arch.num_layers) * n * arch.hidden_size * run.residual_bytes \
        + 2 * n * arch.head_dim * a


def without_checkpointing(run: RunShape) -> RunShape:
    """The run as a layer that is not checkpointed sees it: with `checkpointing_layers: k` the last L - k layers save
    and free what they would without checkpointing (their terms are read off this run)."""
    if not run.gradient_checkpointing:
        return run
    return replace(run, gradient_checkpointing=False, offload_activations=False, checkpointing_layers=None)


def _kv_dim_attention(arch: Architecture, run: RunShape) -> int:
    """Per-local-token width of K (or V) as the attention kernel sees it. Ulysses (DeepSpeed UlyssesSPAttentionHF)
    gives each rank the full sequence with kv_heads / sp heads, or one replicated head when kv_heads < sp
    (`kv_replication_factor`): per local token that is head_dim x max(kv_heads, sp)."""
    if run.uses_ulysses:
        return arch.head_dim * max(arch.num_key_value_heads, run.layout.sp)
    if run.masked_attention and run.attn_implementation == "sdpa":
        # transformers 5.23 integrations/sdpa_attention.py: `use_gqa_in_sdpa` is False on CUDA once there is a mask,
        # so `repeat_kv` copies K and V to every query head and SDPA saves those copies
        return arch.q_dim
    return arch.kv_dim


def packed_mask_bytes(arch: Architecture, run: RunShape) -> dict:
    """The attention mask of a padding-free row (`RunShape.masked_attention`; 0 otherwise), T = the flat row's tokens:

    - "model": the mask transformers builds once per model forward (masking_utils.py `create_causal_mask` ->
      `sdpa_mask`: a boolean [1, 1, T, T], 1 byte an element; `eager_mask`: an additive one in the embeddings' dtype)
      and hands to every layer. Checkpointed layers hold it through the backward (`GradientCheckpointingLayer` binds
      the keyword arguments into the recompute's `partial`); with no layer checkpointed it dies with the model's
      forward (the attention nodes keep their own bias, below). Its construction's temporaries (the `==` of the
      conversation ids, the causal `<=`, their `&`: a few T x T booleans) come and go before the first layer.
    - "layer": SDPA's own copy, per layer call: torch turns the boolean mask into an additive bias of the query's
      dtype (aten/src/ATen/native/transformers/attention.cpp `convert_boolean_attn_mask`, `at::where` of the
      inverted mask; `convert_boolean_attn_mask_cudnn` for the cuDNN backend, the same size), T^2 x 2 bytes under
      bf16, which the memory-efficient and cuDNN attention nodes save for their backward (torch 2.13
      derivatives.yaml: `attn_bias` is an input of `_efficient_attention_backward` and of
      `_scaled_dot_product_cudnn_attention_backward`, no gradient asked of it). So a recomputed layer holds one
      through its backward, and every layer not checkpointed keeps its own until the backward reaches it. The
      inverted mask `at::where` reads (T^2 booleans) is freed as the call returns. eager adds the model's float
      mask to its scores without a copy (its [heads, T, T] scores: `layer_saved_bytes_per_token`)."""
    if not run.masked_attention:
        return {"model": 0.0, "layer": 0.0}
    rows, n = run.attention_rows
    cells = rows * n * n
    if run.attn_implementation == "eager":
        return {"model": cells * run.residual_bytes, "layer": 0.0}
    return {"model": float(cells), "layer": float(cells * run.act_bytes)}


def layer_saved_bytes_per_token(arch: Architecture, run: RunShape) -> dict:
    """Bytes per local token that ONE decoder layer saves for its backward when it is (re)computed with grad, in
    two groups: up to and including attention, and after it (norm 2 and the MLP). From the modules of transformers
    5.23 (Llama/Qwen2/Qwen3 decoder layers), Liger's kernels and DeepSpeed's TiledMLP / UlyssesSPAttentionHF:

    - RMSNorm (transformers): `hidden.to(float32)` is saved by pow/mul (fp32 copy of the input, unless already fp32)
      and the normalised 16-bit tensor by the weight multiply, so it saves fp32 + 16-bit widths; its input is not
      saved. Liger's RMSNorm saves its input X (and a per-row rstd).
    - q/k/v projections save their input (the norm output); q/k norms (Qwen3) as above on q_dim / kv_dim; RoPE
      saves only cos/sin (transformers) or works in place (Liger), so q, k, v reach the kernel once each.
    - attention (FlashAttention-2/3, SDPA flash/efficient): saves q, k, v, the output and the fp32 log-sum-exp;
      `eager` also saves the fp32 softmax and its 16-bit copy, [heads, tokens, tokens]; Ulysses saves the
      full-sequence q/k/v/output of its heads and the local output for o_proj.
    - MLP (transformers SiLU-gated): gate, up, silu(gate) and their product: 4 x intermediate; Liger SwiGLU: gate,
      up, product: 3 x intermediate; TiledMLP (`TiledMLP.forward` saves only its input x): nothing more.
    - a layer input is alive during its backward only if some op saved it (Liger norm) or the checkpoint is
      reentrant (the function frame keeps `detached_inputs`); when checkpoints stay on the GPU it is already
      counted by `checkpointed_input_bytes`.
    """
    a, H, I = run.act_bytes, arch.hidden_size, arch.intermediate_size
    qd, kvd = arch.q_dim, _kv_dim_attention(arch, run)
    nh = arch.num_attention_heads
    liger = run.liger_kernels
    # A frozen base (an adapter run) saves nothing for weight gradients: autograd keeps a matmul's or a multiply's
    # input only when the other operand requires grad, so the norms' normalised tensors (kept for the norm weights'
    # grads) and the linears' inputs (kept for their weights' grads) go; LoRA keeps its own copies (see
    # `adapters.lora_saved_bytes_per_token`).
    frozen = run.adapter is not None
    # The residual stream (each norm's input) is in `run.residual_bytes`: fp32 under autocast over fp32 weights (DDP's
    # fp32 masters), else the activations' dtype. The norm's normalised tensor is in its input's dtype
    # (`.to(input_dtype)`), and where the stream is wider than the compute dtype every projection casts the norm's
    # output to 16 bits for itself (autocast caches the casts of weights only, `cached_cast`): q, k and v keep three
    # copies, gate and up two.
    r = run.residual_bytes
    casts = {"attention": 3, "mlp": 2} if r > a else {"attention": 1, "mlp": 1}
    norm_extra = 0 if liger else (F32 * H if a < 4 else 0) + (0 if frozen else r * H)
    attn = {}
    x0_alive = (liger or run.checkpoint_reentrant) and (run.offload_activations or not run.gradient_checkpointing)
    if x0_alive and run.gradient_checkpointing:
        attn["layer input (back from host)"] = a * H
    attn["input norm"] = norm_extra
    attn["norm output"] = 0 if frozen else casts["attention"] * a * H
    if arch.qk_norm:
        # transformers: the fp32 copy + normalised 16-bit q and k; Liger: the pre-norm q and k (saved as X)
        qk = qd + arch.kv_dim
        attn["q/k norms"] = a * qk if liger or a == F32 else (F32 + a) * qk
        if frozen and not liger:
            attn["q/k norms"] -= a * qk  # the normalised q and k kept for the q/k norm weights
    attn["q, k, v"] = a * (qd + 2 * kvd)
    attn["attention output + lse"] = a * qd + F32 * nh
    if run.adapter is not None:
        attn["LoRA paths (q/k/v/o)"] = adapters.lora_saved_bytes_per_token(arch, run, "self_attn")
    if run.uses_ulysses:
        attn["Ulysses local output"] = a * qd
    if run.attn_implementation == "eager":
        n_kv = run.attention_rows[1]  # keys per query row: the flat packed row when padding-free
        attn["eager softmax (fp32 + 16-bit)"] = (F32 + a) * nh * n_kv
        attn["eager repeat_kv"] = 2 * a * (qd - arch.kv_dim)
    mlp = {}
    if liger:
        mlp["residual (saved by norm 2)"] = r * H
    mlp["post-attention norm"] = norm_extra
    mlp["norm output"] = 0 if frozen else casts["mlp"] * a * H
    if not run.tiled_mlp:
        # the product gate x up is kept by down_proj for its weight's gradient only
        mlp["MLP intermediates"] = ((3 if liger else 4) - (1 if frozen else 0)) * a * I
    if run.adapter is not None:
        mlp["LoRA paths (gate/up/down)"] = adapters.lora_saved_bytes_per_token(arch, run, "mlp")
    if run.checkpoint_reentrant:
        mlp["recomputed layer output"] = a * H
    return {"attention": attn, "mlp": mlp}


def layer_working_set_bytes(arch: Architecture, run: RunShape, n_tokens: int | None = None) -> dict:
    """Peak bytes of ONE layer's recomputation + backward (gradient checkpointing) or of one layer's backward on top
    of stored activations (no checkpointing), at the worse of two moments:

    - MLP backward: everything the layer saved + the incoming gradient + the MLP's gradient intermediates
      (transformers: grad of the product, of silu and of up, less the product freed by down_proj's backward, net
      2 x intermediate; Liger SwiGLU writes its grads in place: 1 x intermediate; TiledMLP: `x_grad =
      zeros_like(x)` for the whole sequence + one tile's forward and backward, tiles of ceil(tokens / shards) tokens,
      shards default ceil(tokens / hidden) as in ALST);
    - attention backward: the tensors saved up to attention + the residual gradient + the gradient of the attention
      output + dq/dk/dv + the kernel's workspace: FlashAttention-2 (and SDPA's flash backend) allocates an fp32
      `dq_accum` [tokens, heads, head_dim] and, for GQA, 16-bit `dk_expanded`/`dv_expanded` with all query heads
      (flash_api.cpp mha_bwd); FlashAttention-3 fp32 dq/dk/dv accumulators; eager the [heads, tokens, tokens] grads.
      Ring CP (torch.distributed.tensor.experimental._context_parallel._attention, `_templated_ring_attention*`):
      allgather keeps the whole sequence's K and V (`_AllGatherRotater`: cp x local K+V, plus the local
      `torch.cat`), alltoall a send and a receive buffer per step; the backward accumulates dq/dk/dv in fp32
      (`convert_to_f32`) and rotates fp32 dK/dV (send + receive).
    Reentrant checkpointing also keeps the incoming gradient for the whole layer backward.
    """
    n = run.layout.tokens_per_rank if n_tokens is None else n_tokens
    a, H, I = run.act_bytes, arch.hidden_size, arch.intermediate_size
    qd, kvd = arch.q_dim, _kv_dim_attention(arch, run)
    nh = arch.num_attention_heads
    saved = layer_saved_bytes_per_token(arch, run)
    s_attn = sum(saved["attention"].values())
    s_mlp = sum(saved["mlp"].values())
    held = a * H * (2 if run.checkpoint_reentrant else 1)  # residual gradient (+ the held incoming gradient)
    fixed_mlp = 0.0
    if run.tiled_mlp:
        shards = run.tiled_mlp_shards or max(math.ceil(n / H), 1)
        tile = math.ceil(n / shards)
        # one tile through the module's own MLP (DeepSpeed TiledMLP recomputes `fn` per shard; ALST turns Liger's
        # SwiGLU off when tiling): saved 4 x intermediate, backward +2 x intermediate, tile input and output
        per_tile = (4 + 2) * a * I + 2 * a * H
        mlp_bwd = a * H  # x_grad
        fixed_mlp = per_tile * tile
    else:
        # transformers: down_proj's backward frees the saved product, then mul's backward makes grad(silu) and
        # grad(up) while grad(product) is alive: +2 x intermediate net. Liger SwiGLU: grad(product) only.
        mlp_bwd = (1 if run.liger_kernels else 2) * a * I
    peak_mlp = (s_attn + s_mlp + held + mlp_bwd) * n + fixed_mlp

    grads = a * qd + a * (qd + 2 * kvd)  # d(output) + dq, dk, dv
    ws = 0.0
    fa = run.attn_implementation in ("flash_attention_2", "sdpa")
    if fa:
        ws = F32 * qd + (2 * a * qd if kvd < qd else 0)
    elif run.attn_implementation == "flash_attention_3":
        ws = F32 * (qd + 2 * kvd)
    else:  # eager: grads of the probabilities and of the scores
        n_kv = run.attention_rows[1]
        ws = (F32 + a) * nh * n_kv
    if run.layout.cp > 1:
        kv = a * 2 * arch.kv_dim
        ws += kv * (run.layout.cp + 1) if run.cp_comm_strategy == "allgather" else 2 * kv
        ws += F32 * (qd + 2 * arch.kv_dim) + 2 * F32 * 2 * arch.kv_dim
    # Reentrant checkpointing: CheckpointFunction.backward (torch/utils/checkpoint.py) keeps the recomputed layer's
    # `outputs` referenced until its `torch.autograd.backward(outputs_with_grad, args_with_grad)` returns, so the
    # layer output (counted with the MLP group) is alive through the attention backward as well.
    out_held = a * H if run.checkpoint_reentrant and run.gradient_checkpointing else 0
    peak_attn = (s_attn + held + grads + ws + out_held) * n
    deq = adapters.dequantized_weight_bytes(arch, run)  # QLoRA: a 4-bit weight dequantized for its backward
    bias = packed_mask_bytes(arch, run)["layer"]  # SDPA's additive bias of a packed row, saved with q, k, v
    peak_mlp += deq + bias
    peak_attn += deq + bias
    if not run.gradient_checkpointing:
        # stored activations are counted separately (all layers); here only the backward's transients
        peak_mlp -= (s_attn + s_mlp) * n + bias
        peak_attn -= s_attn * n + bias
    return {"mlp_backward": peak_mlp, "attention_backward": peak_attn, "peak": max(peak_mlp, peak_attn)}


def stored_activation_bytes(arch: Architecture, run: RunShape, n_tokens: int | None = None) -> float:
    """Without gradient checkpointing every layer keeps everything it saves (see `layer_saved_bytes_per_token`)
    plus its input, until the backward reaches it: all layers, or the L - k a partial checkpointing leaves out."""
    n = run.layout.tokens_per_rank if n_tokens is None else n_tokens
    stored = arch.num_layers - run.checkpointed_layers(arch.num_layers)
    run = without_checkpointing(run)
    saved = layer_saved_bytes_per_token(arch, run)
    per_token = sum(saved["attention"].values()) + sum(saved["mlp"].values()) + run.residual_bytes * arch.hidden_size
    return stored * (per_token * n + packed_mask_bytes(arch, run)["layer"])


def loss_bytes(arch: Architecture, run: RunShape, n_tokens: int | None = None) -> dict:
    """Peak bytes of the loss: the final norm, the LM head and the cross-entropy, forward and the start of backward.

    fused_chunked -- TRL 1.16 SFTTrainer (`add_fused_lm_head`, trl/kernels/chunked_logprob.py): the forward keeps a
      copy of the scored hidden states (`hidden_states[mask]`, saved for backward; the norm output itself is then
      free), fp32 per-token log_z and entropy and one 16-bit [4096 x 32768] tile; the backward allocates
      `grad_hidden` in fp32 for all local tokens, `grad_weight` in fp32 [vocab x hidden], the tile again, and
      converts both to the parameter dtype before returning (fp32 and 16-bit copies alive together; one copy when
      that dtype is fp32). On CPU (no Triton) every tile is folded in torch ops, with several fp32 tile-sized
      temporaries alive at once (`fused_tile_temporaries_cpu`).
    full_logits -- the model's own loss (transformers ForCausalLMLoss, and TRL <= 0.29's SFTTrainer, which also kept
      `outputs.logits` for its entropy/accuracy metrics): 16-bit logits, `logits.float()`, fp32 log_softmax in the
      forward (2 + 4 + 4 bytes x vocab per token); at the start of the backward the saved fp32 log_softmax, the fp32
      gradient of the NLL and of log_softmax (12 bytes x vocab per token). The peak is the larger.
    liger_flce -- Liger's fused linear cross-entropy (liger_kernel/ops/fused_linear_cross_entropy.py, used by
      ArcticTraining's `model.type: liger`): computes the gradients in the forward; keeps `grad_input` [tokens,
      hidden] and `grad_weight` [vocab, hidden] (parameter dtype) and one logits chunk of
      next_pow2(ceil(tokens / ceil(vocab / hidden))) rows x vocab.
    Plus the final RMSNorm's saved tensors and output (see `layer_saved_bytes_per_token`).
    """
    n = run.layout.tokens_per_rank if n_tokens is None else n_tokens
    a, H, V = run.act_bytes, arch.hidden_size, arch.vocab_size
    # the LM head's weight as the loss sees it (grad_weight's dtype)
    p = BYTES.get(run.precision.forward_weight_dtype, 4)
    liger = run.liger_kernels
    norm_saved = a * H if liger else (F32 * H if a < 4 else 0) + a * H  # final RMSNorm's saved tensors
    norm_out = a * H
    if run.loss == "full_logits":
        fwd = (a + F32 + F32 if a < 4 else F32 + F32) * V
        bwd = 3 * F32 * V
        per_token = norm_saved + norm_out + max(fwd, bwd)  # the norm output is saved by the LM head
        fixed = 0.0
    elif run.loss == "liger_flce":
        per_token = norm_saved + norm_out + a * H + F32  # + grad_input + loss_1d, all alive in the forward
        inc = math.ceil(V / H)
        chunk = min(pow2(math.ceil(n / inc)), n) if n > 0 else 0
        fixed = a * chunk * V + p * V * H  # logits chunk + grad_weight
    else:  # fused_chunked: at its backward the norm output is gone (only the `hidden[mask]` copy is saved)
        # grad_hidden fp32, and its copy in the activation dtype unless that is fp32 (`.to(dtype)` of an fp32 tensor
        # to fp32 returns the tensor itself)
        per_token = norm_saved + a * H + 2 * F32 + F32 * H + (a * H if a < F32 else 0)  # copy, log_z + entropy
        cells = min(n, TRL_TOKEN_CHUNK) * min(V, TRL_VOCAB_CHUNK) if n > 0 else 0
        # the tile: folded in place by a Triton kernel on a GPU; on CPU by `_backward_tile` in torch ops, whose fp32
        # temporaries are alive together (`fused_tile_temporaries_cpu`)
        tile = cells * (F32 * fused_tile_temporaries_cpu() if run.device == "cpu" else a)
        # grad_weight only when the LM head trains (`ctx.needs_input_grad`): not under an adapter that leaves it
        # frozen; fp32, plus its copy in the parameter dtype unless that is fp32 too
        fixed = tile + ((F32 + (p if p < F32 else 0)) * V * H if adapters.lm_head_trains(arch, run) else 0)
    return {"per_token": per_token, "fixed": fixed, "total": per_token * n + fixed}


def fused_tile_temporaries_cpu() -> float:
    """Tile-sized fp32 tensors alive at once in TRL 1.16's fused LM head backward without Triton (the CPU path,
    trl/kernels/chunked_logprob.py `_backward_tile`, called on every [4096 x 32768] tile). Counted from its code at
    the line `grad += grad_logprobs.unsqueeze(-1) * (is_target.float() - p)`: the projection buffer `mm_buf`, `y`,
    `z`, `log_p`, `p`, `grad`, the difference `is_target.float() - p` (its `is_target.float()` operand already freed)
    and the product: 8 fp32 tiles, plus the bool `is_target` (1 byte a cell: 1/4 tile). The forward's
    `_forward_tile` holds fewer (mm_buf, z, e, e * z: 4). Checked against the resident set of a process running the
    function at the 35M-parameter test shape (tests/test_memory.py `test_cpu_fused_lm_head_peak_is_measured`)."""
    return 8 + 1 / F32


def optimizer_step_bytes(arch: Architecture, run: RunShape) -> float:
    """Temporaries of the optimizer step (activations are freed by then).

    ZeRO-3 without offload (stage3.py `_prepare_fp32_grad_for_sub_group`): flattens a sub-group's 16-bit gradient
      partitions and converts them to fp32, up to `sub_group_size` (1e9) elements at a time: (2 + 4) bytes each.
    ZeRO-1/2 without offload: the fp32 gradient partition of the step (`single_grad_partition`), 4 bytes per
      partitioned element. DDP / FSDP2 with torch's fused AdamW: none to speak of. CPU offload: on the host.
    """
    if run.layout.sharding != "zero" or run.layout.offload_optimizer:
        return 0.0
    part = adapters.trainable_params(arch, run) / run.layout.shard_group
    if run.layout.zero_stage == 3:
        p = param_bytes(run)
        return (p + (F32 if p < F32 else 0)) * min(run.sub_group_size, part)
    return F32 * part


def offloaded_activation_host_bytes(arch: Architecture, run: RunShape, n_tokens: int | None = None) -> float:
    """Host bytes of offloaded checkpoints, per process. transformers' `gradient_checkpointing_kwargs={"offload":
    True}` wraps each checkpointed layer call in `torch.autograd.graph.save_on_cpu(pin_memory=True)`
    (modeling_utils.py `_activation_checkpointing_enable`); with non-reentrant checkpointing the only tensors that
    reach it are the layer's positional inputs saved for recomputation (`_NoopSaveInputs`): the hidden states.
    `GradientCheckpointingLayer` binds the keyword arguments (rotary cos/sin, masks) into a `partial`, so they stay
    shared on the GPU; FSDP's `checkpoint_wrapper` + `offload_wrapper` and TRL's `activation_offloading` move the
    same tensor. Each is packed into its own `torch.empty(..., pin_memory=True)`, and PyTorch's pinned caching host
    allocator rounds every block up to a power of two (ATen/core/CachingHostAllocator.h `roundSize`:
    c10::llvm::PowerOf2Ceil; `pinned_max_round_threshold` is unlimited by default): layers x pow2(tokens x hidden x
    bytes). Pageable offload (ArcticTraining's `.to("cpu")`) takes the exact size."""
    if not (run.gradient_checkpointing and run.offload_activations):
        return 0.0
    n = run.layout.tokens_per_rank if n_tokens is None else n_tokens
    hidden = n * arch.hidden_size * run.residual_bytes
    layers = run.checkpointed_layers(arch.num_layers)
    if not run.offload_pinned or run.device == "cpu":
        return layers * hidden
    return layers * pow2(hidden)


def kernel_length_limits(arch: Architecture, run: RunShape) -> list[tuple[str, int]]:
    """Hard limits that are not memory: (reason, longest global max_length) pairs. Liger's kernels address
    [tokens, hidden] with 32-bit offsets (Liger-Kernel #803), so tokens x hidden < 2**31 per rank."""
    out = []
    if run.liger_kernels and run.device == "gpu":
        layout = run.layout
        per_rank = (INT32_ELEMENTS - 1) // (arch.hidden_size * layout.per_device_train_batch_size)
        out.append(("Liger kernels index tokens x hidden with int32 (Liger-Kernel #803)",
                    per_rank * layout.cp * layout.sp))
    return out


# =====================================================================================================================
# When the gradients exist (checked against `python -m launch plan --trace`, launch/memory/trace.py)
# =====================================================================================================================
def gradients_alive_at_loss(run: RunShape) -> bool:
    """Whether the parameter gradients exist while the loss is computed. The Trainer zeroes them with
    `model.zero_grad()` (set_to_none=True) after every optimizer step, so with one micro-batch per step the forward
    and the loss run without them (they reappear layer by layer through the backward). DeepSpeed keeps its own
    gradient buffers (partitions, IPG bucket) from step to step; gradient accumulation keeps them between
    micro-batches; on CPU a freed page stays in the resident set (the peak RSS is a high-water mark)."""
    return not (run.device == "gpu" and run.layout.sharding in ("replicated", "fsdp")
                and run.layout.gradient_accumulation_steps == 1)


def tied_embedding_backward_bytes(arch: Architecture, run: RunShape) -> float:
    """End of the backward with an LM head tied to the embeddings (DDP or one process, the embedding trained): the
    tied weight's gradient reaches its `.grad` once, after both uses, so the LM head's gradient [vocab, hidden]
    waits in autograd's input buffer until the embedding's backward returns its own, and the two are summed. On a
    GPU the sum is in place (torch/csrc/autograd/input_buffer.cpp `accumulate`: the buffer holds the only
    reference), so one [vocab, hidden] copy beyond the gradients term. (Fake tensors count as tensor subclasses
    there and are summed out of place: `--trace` shows one copy more.)"""
    if not arch.tie_word_embeddings or run.layout.sharding != "replicated" or run.adapter is not None:
        return 0.0
    return run.precision.grad_bytes * arch.embedding_params


def nccl_communicators(run: RunShape) -> int:
    """NCCL communicators a process creates, each with its own buffers (cudaMalloc'ed by NCCL, outside PyTorch): one
    per mesh dimension larger than 1 (DeviceMesh makes a process group per dimension; NCCL initialises it at its
    first collective), plus the flattened group a 2-D layout also collects over (Accelerate's `dp_shard_cp` for FSDP2
    over dp_shard x cp; HSDP's whole data-parallel group dp_replicate x dp_shard). One for any distributed run
    without a mesh beyond one dimension; none for one process."""
    if run.layout.world_size <= 1:
        return 0
    sizes = {k: int(run.layout.mesh.get(k, 1) or 1) for k in ("dp_replicate", "dp_shard", "tp", "cp", "sp")}
    n = sum(1 for v in sizes.values() if v > 1)
    if (sizes["dp_shard"] > 1 and sizes["cp"] > 1) or (sizes["dp_replicate"] > 1 and sizes["dp_shard"] > 1):
        n += 1
    return max(n, 1)

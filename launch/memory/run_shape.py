"""The run as the memory model needs it: the run's `Layout` (strategy, ZeRO stage, offload of the model states, mesh,
world size, machines, batch, lengths: every layout fact and its arithmetic, read as `run.layout.<fact>`), its
`Precision` (load dtype, mixed precision, the dtype of the trainable parameters, gradients and optimizer states and
where the fp32 masters live: `run.precision`, launch.config.precision), plus what only memory needs: device,
checkpointing and its offload, attention kernel, loss, layer kernels, tiled MLP and the DeepSpeed / FSDP settings that
change memory."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from launch.config.adapter import Adapter
from launch.constants import CP_COMM_KEY
from launch.config.layout import Layout, training_value
from launch.config.precision import BYTES, Precision, load_dtype, mixed_precision
from launch.switches import is_on
from launch.config.training_args import Checkpointing, checkpointing, padding_free_batches


def _reshards(layout: Layout, fsdp: dict) -> bool:
    """Whether FSDP frees each unit's gathered parameters after its forward. FSDP2: `fsdp_reshard_after_forward`, a
    bool. FSDP1 spells it as its sharding strategy (`fsdp_sharding_strategy`, or an FSDP1 strategy name written as
    `fsdp_reshard_after_forward`, Accelerate's FSDP_SHARDING_STRATEGY): FULL_SHARD and HYBRID_SHARD reshard,
    SHARD_GRAD_OP and HYBRID_SHARD_ZERO2 keep the parameters gathered until the backward."""
    value = fsdp.get("fsdp_reshard_after_forward", True)
    if layout.kind == "fsdp1":
        strategy = str(fsdp.get("fsdp_sharding_strategy") or (value if isinstance(value, str) else "FULL_SHARD"))
        return strategy.upper() not in ("SHARD_GRAD_OP", "HYBRID_SHARD_ZERO2", "2", "5")
    return is_on(value)


def _sync_each_batch(training: dict) -> bool:
    """`accelerator_config.gradient_accumulation_kwargs.sync_each_batch` (transformers' AcceleratorConfig, a dict or
    its JSON string in the merged arguments)."""
    config = training.get("accelerator_config") or {}
    if isinstance(config, str):
        import json

        try:
            config = json.loads(config)
        except ValueError:
            return False  # a path to a JSON file: not read here
    return is_on(((config or {}).get("gradient_accumulation_kwargs") or {}).get("sync_each_batch", False))


@dataclass(frozen=True)
class RunShape:
    """What the run does, as the memory model needs it. `from_layout` reads it off a resolved run, `from_configs` off
    the two configs."""

    layout: Layout  # with a max_length: the memory model plans one global length
    device: str = "gpu"  # "gpu" or "cpu" (peak resident set of a CPU process)
    # the two precision choices of the configs; what follows from them per strategy is `precision`
    weights_dtype: str = "bfloat16"  # dtype the model is loaded in
    mixed_precision: str = "bf16"  # the Trainer's "bf16" / "fp16" / "no" (its bf16/fp16 over Accelerate's)
    gradient_checkpointing: bool = True
    # of the decoder layers, how many are checkpointed (the first ones, launch/rank/partial_checkpointing.py: the
    # recipe key `checkpointing_layers`); None: all of them. `checkpointed_layers()` reads it
    checkpointing_layers: int | None = None
    offload_activations: bool = False
    tiled_mlp: bool = False
    tiled_mlp_shards: int | None = None
    attn_implementation: str = "flash_attention_2"
    loss: str = "fused_chunked"
    cp_comm_strategy: str = "allgather"
    # layer kernels: Liger's RMSNorm / SwiGLU / RoPE (`use_liger_kernel`) instead of the transformers modules
    liger_kernels: bool = False
    # reentrant checkpointing (torch.utils.checkpoint.CheckpointFunction, transformers 4.x default; ArcticTraining)
    # keeps the recomputed layer output and the incoming gradient alive through the layer's backward
    checkpoint_reentrant: bool = False
    # offloaded checkpoints go to pinned blocks (save_on_cpu(pin_memory=True), TRL's offloader) or pageable memory
    # (ArcticTraining's `.to("cpu")`)
    offload_pinned: bool = True
    # DeepSpeed's UlyssesSPAttentionHF wraps attention (all-to-all around the kernel); None: when sp > 1
    ulysses_attention: bool | None = None
    # DeepSpeed ZeRO settings as the run really gets them. With an Accelerate YAML (no DeepSpeed JSON) the config
    # Accelerate builds has none of these keys, so HfTrainerDeepSpeedConfig has no "auto" to fill (it fills
    # reduce_bucket_size = hidden**2 etc. only where a JSON says "auto") and DeepSpeed's defaults apply
    # (deepspeed/runtime/zero/config.py).
    reduce_bucket_size: int = 500_000_000
    prefetch_bucket_size: int = 50_000_000
    max_live_parameters: int = 1_000_000_000
    sub_group_size: int = 1_000_000_000
    offload_pin_memory: bool = False  # offload_optimizer / offload_param `pin_memory` (DeepSpeed default False)
    # FSDP2
    fsdp_reshard_after_forward: bool = True
    # Accelerate's GradientAccumulationPlugin `sync_each_batch` (`accelerator_config: {gradient_accumulation_kwargs:
    # {sync_each_batch: true}}`): FSDP reduce-scatters every micro-batch instead of accumulating unsharded gradients
    sync_each_batch: bool = False
    # LoRA / QLoRA (launch.config.adapter, read once from the training arguments); None: a full fine-tune
    adapter: Adapter | None = None
    # FSDP's `fsdp_cpu_ram_efficient_loading`: rank 0 alone reads the weights into host memory, the others start on
    # the meta device and receive their shards by broadcast
    cpu_ram_efficient_loading: bool = False
    # PyTorch's caching allocator with `expandable_segments:True` (PYTORCH_CUDA_ALLOC_CONF, from the config's `env:` or
    # the environment the ranks inherit): freed blocks of a multi-GiB transient are reused by differently sized
    # ones: the allocator's reserve is planned per setting (launch.facts.calibration.reserved_over_allocated)
    expandable_segments: bool = False
    # `--synthetic` (launch.rank.synthetic): random weights built whole on each GPU, before any sharding
    synthetic: bool = False
    # the share of a planned row's tokens that are real, not padding (launch.facts.dataset: the measured dataset's
    # packing fill or 1 - its padding fraction); None unmeasured. Memory ignores it; the throughput model turns its
    # tokens/s into useful tokens/s with it
    real_token_share: float | None = None
    # padding-free batches (TRL 1.16: `packing: true` with `bfd` / `bfd_split`, or `padding_free: true`;
    # launch.config.training_args.padding_free_batches): the collator flattens each micro-batch into ONE row of
    # per_device_train_batch_size x max_length tokens, position_ids restarting at each conversation, no attention
    # mask. What that costs depends on the attention (`masked_attention`, `attention_rows`)
    padding_free: bool = False
    # padding-free: the token-weighted mean conversation length (sum of l^2 / sum of l over the measured
    # conversations, each cut at max_length: launch.facts.dataset.Profile.attention_length), what a varlen kernel's
    # causal triangles cost per token; None unmeasured: full-length conversations (max_length each)
    conversation_length: float | None = None

    def __post_init__(self):
        if not self.layout.max_length:
            raise ValueError("the memory model plans one global length: give the layout a max_length")

    def with_length(self, max_length: int) -> "RunShape":
        """The same run at another global length."""
        return replace(self, layout=self.layout.with_length(max_length))

    # ---- the run's precision: launch.config.precision's reading of the two choices above, per strategy
    @functools.cached_property
    def precision(self) -> Precision:
        """Load dtype, compute dtype, the trainable parameters', gradients' and optimizer states' dtypes and where the
        fp32 masters live (`Precision.of`, the same reading as `Setup.precision`): every byte-per-parameter of the
        memory model comes from here."""
        return Precision.of(self.layout.kind, self.weights_dtype, self.mixed_precision, self.adapter,
                            self.layout.sp if self.uses_ulysses else 1)

    @property
    def layer_kernels(self) -> str:
        """The layers' kernels by name, the key of the throughput model's kernel table (`launch.speed.model.LAYER_OPS`):
        "liger" (Liger's Triton kernels, `liger_kernels`, on a GPU) or "eager" (transformers' modules)."""
        return "liger" if self.liger_kernels and self.device == "gpu" else "eager"

    # ---- what only memory derives
    def checkpointed_layers(self, num_layers: int) -> int:
        """How many of the model's `num_layers` decoder layers are checkpointed: none without checkpointing, else all
        of them or the first `checkpointing_layers`."""
        if not self.gradient_checkpointing:
            return 0
        return num_layers if self.checkpointing_layers is None else max(0, min(self.checkpointing_layers, num_layers))

    @property
    def uses_ulysses(self) -> bool:
        return self.layout.sp > 1 if self.ulysses_attention is None else self.ulysses_attention

    @property
    def masked_attention(self) -> bool:
        """Whether attention runs over a materialised mask of the flat packed row: padding-free batches with sdpa or
        eager. transformers 5.23's `create_causal_mask` (masking_utils.py) finds the conversations from the
        position_ids (`find_packed_sequence_indices`) and, for sdpa, builds ONE boolean [1, 1, T, T] block-diagonal
        causal mask per model forward (`sdpa_mask`, `allow_is_causal_skip` off for packed sequences), which every
        layer reuses; eager gets it as an additive float mask (`eager_mask`). FlashAttention 2/3/4 run varlen over
        the collator's cu_seq_lens: no mask. A GPU run only (the CPU profile trains padded rows)."""
        return self.padding_free and self.attn_implementation in ("sdpa", "eager")

    @property
    def attention_rows(self) -> tuple[int, int]:
        """(rows, tokens per row) of one micro-batch as the attention kernel sees it on this rank: padding-free, one
        row of per_device_train_batch_size x per-rank length; else the micro-batch's rows of the per-rank length
        (Ulysses: the full sequence of its heads)."""
        layout = self.layout
        if self.padding_free:
            return 1, layout.tokens_per_rank
        return layout.per_device_train_batch_size, layout.per_rank_length * layout.sp

    @property
    def residual_bytes(self) -> int:
        """Bytes of a hidden-state element between the layers (the residual stream, each layer's input):
        `Precision.residual_dtype`, fp32 under autocast over fp32 weights (DDP's fp32 masters: the embedding and the
        residual adds are not autocast ops)."""
        return BYTES.get(self.precision.residual_dtype, 4)

    @property
    def act_bytes(self) -> int:
        """Bytes of an activation element: the compute dtype's (2 under bf16/fp16 autocast or a 16-bit model, 4 in
        fp32, the CPU path's default)."""
        return BYTES.get(self.precision.compute_dtype, 4)

    @classmethod
    def from_layout(cls, layout: Layout, accelerate: dict, training: dict, checkpointing: Checkpointing,
                    device: str = "gpu") -> "RunShape":
        """From a resolved run: its `Layout`, its Accelerate config (the FSDP and CP settings the layout does not
        hold), its merged TRL `SFTConfig` / `ModelConfig` fields (a missing key means the default the recipe's
        train.py gets: `bf16=True` unless fp16, ModelConfig's `dtype="float32"`, transformers' SDPA) and its
        `Checkpointing` (transformers' two names and FSDP's own flags resolved once, launch.config.training_args). A
        layout without a max_length (`max_length: null`, no truncation) is planned at SFTConfig's default length, the
        one length there is to plan.
        """
        accelerate = accelerate or {}
        training = training or {}
        fsdp = accelerate.get("fsdp_config") or {}
        pc = accelerate.get("parallelism_config") or {}
        if not layout.max_length:
            layout = layout.with_length(training_value({}, "max_length"))

        cpu = device == "cpu" or is_on(training.get("use_cpu", False))
        # read as launch.config.precision reads them for Setup.precision: the CPU profile's arguments say the CPU run's
        # (fp32 unless it asks for bf16; no fp16 on CPU)
        mixed = mixed_precision(accelerate, training)
        if cpu and mixed == "fp16":
            mixed = "no"
        weights = load_dtype(training)

        gc = checkpointing.on  # transformers' or FSDP's own
        offload_act = gc and (checkpointing.offload or checkpointing.fsdp_offload
                              or is_on(training.get("activation_offloading", False)))

        loss = "fused_chunked"  # TRL 1.16 SFTTrainer: fused LM head for nll and dft
        if float(training.get("label_smoothing_factor", 0) or 0) > 0:
            loss = "full_logits"  # the label smoother needs the full logits

        attn = training.get("attn_implementation") or "sdpa"  # ModelConfig default None: transformers picks sdpa
        if cpu and attn in ("flash_attention_2", "flash_attention_3"):
            attn = "sdpa"
        shards = training.get("tiled_mlp_shards")
        return cls(
            layout=layout,
            device="cpu" if cpu else "gpu",
            weights_dtype=weights,
            mixed_precision=mixed,
            gradient_checkpointing=gc,
            checkpointing_layers=checkpointing.layers if gc else None,
            offload_activations=offload_act,
            tiled_mlp=is_on(training.get("tiled_mlp", False)),
            tiled_mlp_shards=int(shards) if shards else None,
            attn_implementation=str(attn),
            loss=loss,
            cp_comm_strategy=str(pc.get(CP_COMM_KEY, "allgather") or "allgather"),
            liger_kernels=is_on(training.get("use_liger_kernel", False)) and not cpu,
            fsdp_reshard_after_forward=_reshards(layout, fsdp),
            sync_each_batch=_sync_each_batch(training),
            adapter=Adapter.from_training(training),
            cpu_ram_efficient_loading=layout.sharding == "fsdp" and is_on(fsdp.get("fsdp_cpu_ram_efficient_loading")),
            synthetic=is_on(training.get("synthetic", False)),
            padding_free=padding_free_batches(training) and not cpu,
        )

    @classmethod
    def from_configs(cls, accelerate: dict, training: dict, device: str = "gpu") -> "RunShape":
        """From the two configs alone (no resolved run): the `Layout` and `Checkpointing` built here as
        `launch.run.resolve` builds them."""
        training = training or {}
        return cls.from_layout(Layout.from_configs(accelerate or {}, training), accelerate, training,
                               checkpointing(training, accelerate), device)

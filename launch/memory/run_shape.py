"""The run as the memory model needs it: strategy and sharding (from the run's `Layout`), precision, checkpointing,
attention kernel, loss, lengths and the DeepSpeed / FSDP settings that change memory."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from launch.layout import Layout, shard_group
from launch.training_args import checkpointing

def _truthy(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _dtype_name(value) -> str:
    v = str(value or "float32").replace("torch.", "").lower()
    return {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}.get(v, v)


@dataclass(frozen=True)
class RunShape:
    """What the run does, as the memory model needs it. `from_configs` reads it off the two configs."""

    device: str = "gpu"  # "gpu" or "cpu" (peak resident set of a CPU process)
    world_size: int = 1
    num_machines: int = 1
    mesh: dict = field(default_factory=lambda: {"dp_replicate": 1, "dp_shard": 1, "tp": 1, "cp": 1, "sp": 1})
    strategy: str = "ddp"  # "ddp" | "deepspeed" | "fsdp2"
    zero_stage: int | None = None
    offload_optimizer: bool = False
    offload_params: bool = False
    weights_dtype: str = "bfloat16"  # dtype the model is loaded in
    mixed_precision: str = "bf16"  # Accelerate's "bf16" / "fp16" / "no"
    gradient_checkpointing: bool = True
    offload_activations: bool = False
    tiled_mlp: bool = False
    tiled_mlp_shards: int | None = None
    attn_implementation: str = "flash_attention_2"
    loss: str = "fused_chunked"
    per_device_batch: int = 1
    max_length: int = 1024  # global sequence length (before CP / SP split)
    cp_comm_strategy: str = "allgather"
    gradient_accumulation_steps: int = 1
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

    # ---- derived
    @property
    def cp(self) -> int:
        return int(self.mesh.get("cp", 1) or 1)

    @property
    def sp(self) -> int:
        return int(self.mesh.get("sp", 1) or 1)

    @property
    def per_rank_length(self) -> int:
        return math.ceil(self.max_length / (self.cp * self.sp))

    @property
    def tokens_per_rank(self) -> int:
        """Tokens one rank holds in a micro-batch (the N of every per-token term)."""
        return self.per_device_batch * self.per_rank_length

    @property
    def processes_per_node(self) -> int:
        return max(self.world_size // max(self.num_machines, 1), 1)

    @property
    def uses_ulysses(self) -> bool:
        return self.sp > 1 if self.ulysses_attention is None else self.ulysses_attention

    @property
    def act_bytes(self) -> int:
        """Bytes of an activation element: 2 under bf16/fp16 autocast or a 16-bit model, else 4 (the CPU path)."""
        if self.device == "cpu":
            return 4
        if self.mixed_precision in ("bf16", "fp16") or self.weights_dtype in ("bfloat16", "float16"):
            return 2
        return 4

    @property
    def shard_group(self) -> int:
        """Ranks one copy of the model states is split over (`launch.layout.shard_group`)."""
        return shard_group(self.strategy, self.world_size, self.mesh)

    @classmethod
    def from_layout(cls, layout, accelerate: dict, training: dict, checkpointing, device: str = "gpu") -> "RunShape":
        """From a resolved run: its `Layout` (strategy, ZeRO stage with Accelerate's default, offload, mesh, world
        size, batch, length), its Accelerate config (the FSDP and CP settings the layout does not hold), its merged
        TRL `SFTConfig` / `ModelConfig` fields (a missing key means the default the recipe's train.py gets:
        `max_length=1024`, `bf16=True` unless fp16, TrainingArguments' `per_device_train_batch_size=8`, ModelConfig's
        `dtype="float32"`) and its `Checkpointing` (the two checkpointing names resolved once, launch.training_args).
        """
        accelerate = accelerate or {}
        training = training or {}
        fsdp = accelerate.get("fsdp_config") or {}
        pc = accelerate.get("parallelism_config") or {}
        strategy = {"deepspeed": "deepspeed", "fsdp2": "fsdp2", "fsdp1": "fsdp2"}.get(layout.kind, "ddp")

        cpu = device == "cpu" or _truthy(training.get("use_cpu", False))
        if cpu:
            mixed = "no"
        elif training.get("fp16"):
            mixed = "fp16"
        elif training.get("bf16", not training.get("fp16", False)) is not False:
            mixed = "bf16"  # SFTConfig: bf16 defaults to True when fp16 is not set
        else:
            mixed = str(accelerate.get("mixed_precision", "no") or "no")
        weights = _dtype_name(training.get("dtype", (training.get("model_init_kwargs") or {}).get("dtype", "float32")))
        if cpu:
            weights = "float32"

        fsdp_ac = strategy == "fsdp2" and _truthy(fsdp.get("fsdp_activation_checkpointing", False))
        gc = checkpointing.enabled or fsdp_ac
        offload_act = gc and (
            checkpointing.offload
            or _truthy(training.get("activation_offloading", False))
            or (fsdp_ac and _truthy(fsdp.get("fsdp_activation_checkpointing_offload", False)))
        )

        loss = "fused_chunked"  # TRL 1.16 SFTTrainer: fused LM head for nll and dft
        if float(training.get("label_smoothing_factor", 0) or 0) > 0:
            loss = "full_logits"  # the label smoother needs the full logits

        attn = training.get("attn_implementation") or "sdpa"  # ModelConfig default None: transformers picks sdpa
        if cpu and attn in ("flash_attention_2", "flash_attention_3"):
            attn = "sdpa"
        shards = training.get("tiled_mlp_shards")
        return cls(
            device="cpu" if cpu else "gpu",
            world_size=layout.world_size,
            num_machines=layout.num_machines,
            mesh={k: int(layout.mesh.get(k, 1) or 1) for k in ("dp_replicate", "dp_shard", "tp", "cp", "sp")},
            strategy=strategy,
            zero_stage=layout.zero_stage,
            offload_optimizer=layout.offload_optimizer,
            offload_params=layout.offload_params,
            weights_dtype=weights,
            mixed_precision=mixed,
            gradient_checkpointing=gc,
            offload_activations=offload_act,
            tiled_mlp=_truthy(training.get("tiled_mlp", False)),
            tiled_mlp_shards=int(shards) if shards else None,
            attn_implementation=str(attn),
            loss=loss,
            per_device_batch=layout.per_device_train_batch_size,
            max_length=int(layout.max_length or 1024),
            cp_comm_strategy=str(pc.get("parallelism_config_cp_comm_strategy", "allgather") or "allgather"),
            gradient_accumulation_steps=layout.gradient_accumulation_steps,
            liger_kernels=_truthy(training.get("use_liger_kernel", False)) and not cpu,
            fsdp_reshard_after_forward=_truthy(fsdp.get("fsdp_reshard_after_forward", True)),
        )

    @classmethod
    def from_configs(cls, accelerate: dict, training: dict, mesh: dict | None = None, world_size: int | None = None,
                     num_machines: int | None = None, device: str = "gpu") -> "RunShape":
        """From the two configs alone (no resolved run): the `Layout` and `Checkpointing` are built here the way
        `launch.resolve` builds them, with optional mesh, world-size and machine-count overrides."""
        accelerate = dict(accelerate or {})
        if world_size is not None:
            accelerate["num_processes"] = world_size
        if num_machines is not None:
            accelerate["num_machines"] = num_machines
        layout = Layout.from_configs(accelerate, training or {})
        if mesh is not None:
            layout = replace(layout, mesh={k: int(mesh.get(k, 1) or 1) for k in ("dp_replicate", "dp_shard", "tp", "cp", "sp")})
        return cls.from_layout(layout, accelerate, training or {}, checkpointing(training or {}), device)

"""The memory model behind `python -m launch plan`: per-GPU and per-host memory of a run, term by term.

Pure Python, no I/O, no torch import. Every term is a small function of (architecture, run shape) whose docstring
says what it counts and from which upstream code (read against torch 2.13, transformers 5.23, accelerate 1.15,
deepspeed 0.19.8, trl 1.16). Sizes are bytes inside the functions and GiB (2**30 bytes) in the `Term`s.

How a peak is assembled
-----------------------
A training step goes through phases that never overlap in time, so the peak is the largest phase, not the sum:

- the *loss* phase (end of the forward, start of the backward): model states, communication buffers, gathered
  parameters, checkpointed activations kept on the GPU, and the loss working set (logits or fused-loss buffers);
- the *layer* phase (backward through the decoder): the same static terms and checkpoints, plus the working set of
  ONE layer's recomputation and backward (every tensor that layer saves for its backward, plus the gradients and
  kernel workspaces alive at the worst moment of its backward);
- the *optimizer step*: model states plus the step's temporaries (activations are gone by then).

The terms of the phase that gives the peak are summed (`Term.counted`); the other phase's term is listed for
information. On top of the allocated peak, one global overhead model (see `OVERHEAD`): CUDA context, NCCL buffers
and the caching allocator's reserve.

Calibration (tests/test_memory.py) uses published measurements only, each with its source beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

GIB = 2**30
F32 = 4  # bytes of an fp32 element

# ---- the one global overhead model (device memory outside PyTorch's allocated bytes) -------------------------------
# CUDA_CONTEXT_GIB: the CUDA context, cuBLAS/cuBLASLt workspaces and kernel images that every CUDA process holds and
#   that `torch.cuda.max_memory_allocated` does not count (typical nvidia-smi reading of an idle torch process on an
#   H100 with lazy module loading: 0.4-0.6 GiB). A stated model parameter, not fitted.
# NCCL_GIB: NCCL's communicator buffers (cudaMalloc'ed by NCCL itself, so also outside PyTorch's accounting) in a
#   distributed run: NCCL_BUFFSIZE 4 MiB x channels x peers for the ring/tree protocols of one node. Stated, not fitted.
# ALLOCATOR_RESERVE: the caching allocator's reserved-but-unallocated bytes at the peak (fragmentation), as a
#   fraction of the allocated peak. 2%: bounded above by the calibration data itself -- the Ulysses blog's 1-GPU
#   run peaked at 76.4 GiB allocated and ran on an H100 whose total capacity is 79.1 GiB, so its reserve was at most
#   (79.1 - 0.5 - 76.4) / 76.4 = 2.9%. One global constant for every run (expandable_segments lowers it further).
OVERHEAD = {"cuda_context_gib": 0.5, "nccl_gib": 0.5, "allocator_reserve": 0.02}

# CPU mode: the resident set of a process before any model exists (python + torch + transformers + accelerate +
# deepspeed + trl with SFTTrainer imported). MEASURED on this repository's CPU environment (torch 2.13 CPU,
# transformers 5.23, accelerate 1.15, deepspeed 0.19.8, trl 1.16, Python 3.11): VmRSS after the imports = 0.44 GiB
# (`measure_cpu_runtime_baseline_gib()` re-measures it; tests/test_memory.py runs it when MEMORY_MEASURE=1).
CPU_RUNTIME_BASELINE_GIB = 0.44
# CPU mode with DeepSpeed: what a ZeRO engine adds to a process beyond its model states (communication groups, the
# optimizer wrapper, thread pools). MEASURED with a bare engine (one gloo process, a 0.5M-parameter model, ZeRO-2 and
# ZeRO-3, default 5e8-element buckets): VmRSS after `deepspeed.initialize` and two steps minus before it =
# 0.14-0.16 GiB (`measure_cpu_deepspeed_engine_gib()`). Note: the untouched pages of the 5e8-element bucket add
# nothing to the RSS (a 2 GB `torch.empty` is virtual until written).
CPU_DEEPSPEED_ENGINE_GIB = 0.15

# Usable capacity of the GPUs the calibration ran on, as PyTorch reports it ("GPU 0 has a total capacity of 79.1x GiB"
# in an out-of-memory message on an H100 80GB HBM3). Callers pass their own budget; this is a convenience.
H100_80GB_GIB = 79.1

# TRL 1.16 `trl/kernels/chunked_logprob.py` and `trl/trainer/utils.py`: the fused LM head's tile shape
TRL_TOKEN_CHUNK = 4096  # TOKEN_CHUNK_SIZE
TRL_VOCAB_CHUNK = 32768  # _CHUNKED_LOGPROB_CHUNK_SIZE

# Liger kernels index [tokens, hidden] tensors with 32-bit offsets: Liger-Kernel issue #803 (ALST's author: RMSNorm
# crashes with "illegal memory access" once tokens x hidden reaches 2**31; ArcticTraining's run-h100-sp1-llama-8b.yml
# notes the crash at max_length 555000). A kernel limit, not a memory limit; `longest_length` honours it by default.
INT32_ELEMENTS = 2**31

LOSSES = ("fused_chunked", "full_logits", "liger_flce")
ATTENTIONS = ("flash_attention_2", "flash_attention_3", "sdpa", "eager")
STRATEGIES = ("ddp", "deepspeed", "fsdp2")


def _gib(nbytes: float) -> float:
    return nbytes / GIB


def _pow2(n: float) -> int:
    """Next power of two >= n (PyTorch's pinned host allocator rounds every block this way)."""
    n = int(math.ceil(n))
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# =====================================================================================================================
# Architecture
# =====================================================================================================================
def _get(config, key, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


@dataclass(frozen=True)
class Architecture:
    """A decoder-only dense transformer (Llama / Qwen2 / Qwen3 / Mistral style): RMSNorm, GQA attention with RoPE,
    SiLU-gated MLP (gate, up, down), an LM head tied to the embeddings or not."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2)
    qk_norm: bool = False  # RMSNorm on q and k per head (Qwen3)
    model_type: str = "llama"

    @classmethod
    def from_config(cls, config) -> "Architecture":
        """From a transformers `PretrainedConfig` (its text config is used) or a dict of `config.json`.

        `head_dim` defaults to hidden / heads; `num_key_value_heads` to the head count; `tie_word_embeddings` to False
        (the default of LlamaConfig, Qwen2Config, Qwen3Config, MistralConfig). Qwen2 has q/k/v biases
        (`Qwen2Attention`), Qwen3 has q/k norms (`Qwen3Attention.q_norm/k_norm`).
        """
        if not isinstance(config, dict) and hasattr(config, "get_text_config"):
            config = config.get_text_config()
        elif isinstance(config, dict) and isinstance(config.get("text_config"), dict):
            config = config["text_config"]
        hidden = int(_get(config, "hidden_size"))
        heads = int(_get(config, "num_attention_heads"))
        kv = _get(config, "num_key_value_heads") or heads
        head_dim = _get(config, "head_dim") or hidden // heads
        model_type = str(_get(config, "model_type", "llama") or "llama")
        bias = _get(config, "attention_bias")
        if bias is None:
            bias = model_type == "qwen2"
        return cls(
            hidden_size=hidden,
            num_layers=int(_get(config, "num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(kv),
            head_dim=int(head_dim),
            intermediate_size=int(_get(config, "intermediate_size")),
            vocab_size=int(_get(config, "vocab_size")),
            tie_word_embeddings=bool(_get(config, "tie_word_embeddings", False)),
            attention_bias=bool(bias) or model_type == "qwen2",
            qk_norm=model_type in ("qwen3",),
            model_type=model_type,
        )

    # ---- shapes
    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    # ---- parameter counts
    @property
    def attention_matmul_params_per_layer(self) -> int:
        """q, k, v and o projections."""
        h, q, kv = self.hidden_size, self.q_dim, self.kv_dim
        return h * q + 2 * h * kv + q * h

    @property
    def attention_params_per_layer(self) -> int:
        q, kv = self.q_dim, self.kv_dim
        n = self.attention_matmul_params_per_layer
        if self.attention_bias:
            n += q + 2 * kv
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    @property
    def mlp_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def params_per_layer(self) -> int:
        """One decoder layer: attention q/k/v/o (+ biases, + q/k norms), MLP gate/up/down, two RMSNorm weights."""
        return self.attention_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden_size

    @property
    def matmul_params_per_layer(self) -> int:
        return self.attention_matmul_params_per_layer + self.mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """The LM head's weight (shared with the embeddings when tied: counted once in `num_params`)."""
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Embeddings + layers + final norm + LM head unless tied."""
        n = self.embedding_params + self.num_layers * self.params_per_layer + self.hidden_size
        if not self.tie_word_embeddings:
            n += self.lm_head_params
        return n

    @property
    def matmul_params(self) -> int:
        """N for MFU (torchtitan's convention): all parameters minus the embedding table, i.e. the layers' matrices,
        norms and an untied LM head. FLOPs/token = 6 N + 12 L heads head_dim seq (state causal discount or not)."""
        return self.num_params - self.embedding_params

    @property
    def small_params(self) -> int:
        """Parameters below DeepSpeed's `stage3_param_persistence_threshold` (1e5): norms, biases, q/k norms. ZeRO-3
        keeps these whole on every rank."""
        per_layer = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        if self.attention_bias:
            per_layer += self.q_dim + 2 * self.kv_dim
        return self.num_layers * per_layer + self.hidden_size


# =====================================================================================================================
# Run shape
# =====================================================================================================================
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
        """Ranks one copy of the model states is split over: ZeRO partitions over all ranks (DeepSpeed's
        seq_data_parallel_group, i.e. dp x sp); FSDP2 over the dp_shard x cp mesh; DDP over none."""
        if self.strategy == "deepspeed":
            return max(self.world_size // max(int(self.mesh.get("tp", 1) or 1), 1), 1)
        if self.strategy == "fsdp2":
            return max(int(self.mesh.get("dp_shard", 1) or 1) * self.cp, 1)
        return 1

    @classmethod
    def from_configs(
        cls,
        accelerate: dict,
        training: dict,
        mesh: dict | None = None,
        world_size: int | None = None,
        num_machines: int | None = None,
        device: str = "gpu",
    ) -> "RunShape":
        """From the Accelerate YAML (a dict) and the TRL `SFTConfig` / `ModelConfig` fields (a dict; a missing key
        means the default the recipe's train.py gets: SFTConfig's `gradient_checkpointing=True`, `max_length=1024`,
        `bf16=True` unless fp16; TrainingArguments' `per_device_train_batch_size=8`; ModelConfig's
        `dtype="float32"`, which train.py passes to the model).
        """
        accelerate = accelerate or {}
        training = training or {}
        ds = accelerate.get("deepspeed_config") or {}
        fsdp = accelerate.get("fsdp_config") or {}
        pc = accelerate.get("parallelism_config") or {}
        dist = str(accelerate.get("distributed_type", "NO")).upper()
        world = int(world_size if world_size is not None else accelerate.get("num_processes", 1) or 1)
        machines = int(num_machines if num_machines is not None else accelerate.get("num_machines", 1) or 1)
        if mesh is None:
            mesh = {
                name: int(pc.get(f"parallelism_config_{name}_size", 1) or 1)
                for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp")
            }
            if not pc:
                mesh["dp_shard" if dist == "FSDP" else "dp_replicate"] = world
        mesh = {k: int(mesh.get(k, 1) or 1) for k in ("dp_replicate", "dp_shard", "tp", "cp", "sp")}

        if dist == "DEEPSPEED":
            strategy = "deepspeed"
            stage = int(ds.get("zero_stage", 2))  # Accelerate's DeepSpeedPlugin default stage
        elif dist == "FSDP":
            strategy, stage = "fsdp2", None
        else:
            strategy, stage = "ddp", None

        def _on(v) -> bool:
            return v not in (None, "none", "None", False, "")

        offload_opt = _on(ds.get("offload_optimizer_device")) if strategy == "deepspeed" else False
        offload_par = _on(ds.get("offload_param_device")) if strategy == "deepspeed" else False
        if strategy == "fsdp2" and _truthy(fsdp.get("fsdp_offload_params", False)):
            offload_opt = offload_par = True  # the optimizer steps on the host copy

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
        gc = _truthy(training.get("gradient_checkpointing", training.get("activation_checkpointing", True))) or fsdp_ac
        gc_kwargs = (training.get("gradient_checkpointing_kwargs") or training.get("activation_checkpointing_kwargs")
                     or {})
        offload_act = gc and (
            _truthy(gc_kwargs.get("offload", False) if isinstance(gc_kwargs, dict) else False)
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
            world_size=world,
            num_machines=machines,
            mesh=mesh,
            strategy=strategy,
            zero_stage=stage,
            offload_optimizer=offload_opt,
            offload_params=offload_par,
            weights_dtype=weights,
            mixed_precision=mixed,
            gradient_checkpointing=gc,
            offload_activations=offload_act,
            tiled_mlp=_truthy(training.get("tiled_mlp", False)),
            tiled_mlp_shards=int(shards) if shards else None,
            attn_implementation=str(attn),
            loss=loss,
            per_device_batch=int(training.get("per_device_train_batch_size", 8)),
            max_length=int(training.get("max_length", 1024) or 1024),
            cp_comm_strategy=str(pc.get("parallelism_config_cp_comm_strategy", "allgather") or "allgather"),
            gradient_accumulation_steps=int(training.get("gradient_accumulation_steps", 1) or 1),
            liger_kernels=_truthy(training.get("use_liger_kernel", False)) and not cpu,
            fsdp_reshard_after_forward=_truthy(fsdp.get("fsdp_reshard_after_forward", True)),
        )


# =====================================================================================================================
# Result types
# =====================================================================================================================
@dataclass
class Term:
    name: str
    gib: float
    setting: str  # the config setting that controls it
    where: str  # "gpu" or "host"
    counted: bool = True  # part of the peak (False: another phase's term, shown for information)


@dataclass
class Estimate:
    gpu_terms: list[Term]
    host_terms: list[Term]
    gpu_peak_gib: float  # per GPU (CPU mode: peak resident set of one process)
    host_per_process_gib: float
    host_per_node_gib: float
    per_rank_length: int
    allocated_peak_gib: float = 0.0  # what torch.cuda.max_memory_allocated would report (no context / reserve)
    peak_phase: str = ""
    device: str = "gpu"
    notes: list[str] = field(default_factory=list)

    def largest_gpu_term(self) -> Term:
        counted = [t for t in self.gpu_terms if t.counted and t.gib > 0]
        return max(counted or self.gpu_terms, key=lambda t: t.gib)

    def advice(self) -> str:
        """The largest term and the setting that would shrink it, in one sentence."""
        t = self.largest_gpu_term()
        return f"The largest term is {t.name} ({t.gib:.1f} GiB); to shrink it, change {t.setting}."


# =====================================================================================================================
# Model states (parameters, gradients, optimizer states) per GPU and per host process
# =====================================================================================================================
def _param_bytes(run: RunShape) -> int:
    """Bytes per element of the parameters as they are trained: DeepSpeed with bf16/fp16 casts the module to 16 bits
    (fp32 master in the optimizer); DDP keeps the loaded dtype (a bf16 model trains pure bf16 under autocast);
    FSDP2 under Accelerate's mixed precision keeps its shards in fp32 (see `fsdp2_sharded_bytes_per_param`)."""
    if run.device == "cpu":
        return 4
    if run.strategy == "deepspeed":
        return 2 if run.mixed_precision in ("bf16", "fp16") or run.weights_dtype != "float32" else 4
    return 2 if run.weights_dtype in ("bfloat16", "float16") else 4


def fsdp2_sharded_bytes_per_param(run: RunShape) -> int:
    """accelerate/utils/fsdp_utils.py `fsdp2_prepare_model`: with mixed_precision != "no", every trainable
    parameter is upcast to fp32 before `fully_shard` ("FSDP upcast of low precision parameters to fp32"), and
    MixedPrecisionPolicy(param_dtype=bf16) only casts the all-gathered copy. So the shard is fp32 even for a model
    loaded in bf16; without mixed precision it keeps the loaded dtype."""
    if run.device == "cpu" or run.mixed_precision != "no":
        return 4
    return 2 if run.weights_dtype in ("bfloat16", "float16") else 4


def model_state_bytes(arch: Architecture, run: RunShape) -> dict:
    """Per-rank bytes of parameters, gradients and optimizer states, split into GPU and host.

    DDP (torch DistributedDataParallel via Accelerate): parameters and gradients whole, in the parameter dtype; the
      reducer's flat buckets are a second copy of the gradients (gradient_as_bucket_view=False, Accelerate's
      default) -- counted under communication buffers; AdamW states (exp_avg, exp_avg_sq) `zeros_like(param)`, so
      in the parameter dtype (pure bf16 for a bf16 model).
    DeepSpeed (bf16): 16-bit parameters; gradients in grad_accum_dtype, which defaults to the model dtype
      (engine.get_data_types: bf16); fp32 master copy and fp32 Adam states in the optimizer.
      ZeRO-1: parameters and gradients whole, master and Adam partitioned over the ZeRO group.
      ZeRO-2: gradients partitioned too (`grads_in_partition`). ZeRO-3: everything partitioned
      (`grad_partitions_flat_buffer`, stage3.py). `offload_optimizer_device: cpu` moves master, Adam, the fp32
      gradient buffer and (ZeRO-3) the 16-bit gradient partitions to the host (stage3.py `self.device = cpu`);
      `offload_param_device: cpu` moves the ZeRO-3 16-bit partitions to a pinned host buffer.
      Parameters under `stage3_param_persistence_threshold` (norms, biases) stay whole on every rank.
    FSDP2 (Accelerate): fp32 shards (see `fsdp2_sharded_bytes_per_param`), fp32 sharded gradients, fp32 Adam,
      over the dp_shard x cp mesh; `fsdp_offload_params` keeps all three on the host.
    """
    P = arch.num_params
    p = _param_bytes(run)
    W = run.shard_group
    out = {"params_gpu": 0.0, "grads_gpu": 0.0, "optim_gpu": 0.0, "params_host": 0.0, "grads_host": 0.0,
           "optim_host": 0.0, "params_host_pinned": 0.0}
    if run.strategy == "ddp":
        out.update(params_gpu=p * P, grads_gpu=p * P, optim_gpu=2 * p * P)
        return out
    if run.strategy == "deepspeed" and not run.zero_stage:
        # ZeRO stage 0 (bf16): whole 16-bit params and grads, fp32 master and Adam (not used by any recipe)
        out.update(params_gpu=p * P, grads_gpu=p * P, optim_gpu=(8 + (4 if p < 4 else 0)) * P)
        return out
    if run.strategy == "fsdp2":
        s = fsdp2_sharded_bytes_per_param(run)
        adam = 2 * s
        if run.offload_params:
            out.update(params_host_pinned=s * P / W, grads_host=s * P / W, optim_host=adam * P / W)
        else:
            out.update(params_gpu=s * P / W, grads_gpu=s * P / W, optim_gpu=adam * P / W)
        return out
    # DeepSpeed ZeRO 1-3
    stage = run.zero_stage
    g = p  # grad_accum_dtype defaults to the model dtype
    # fp32 master copy: ZeRO-1/2 always clone the partition to fp32 (`single_partition_of_fp32_groups`); ZeRO-3
    # reuses an fp32 partition that already lives on the optimizer's device (stage3.py `_create_fp32_partitions`)
    master = 0 if (stage == 3 and p == 4 and not run.offload_optimizer) else 4
    adam = 8
    small = arch.small_params
    if stage == 1:
        out["params_gpu"] = p * P
        out["grads_gpu"] = g * P
    elif stage == 2:
        out["params_gpu"] = p * P
        out["grads_gpu"] = g * P / W
    else:
        part = (P - small) / W + small
        if run.offload_params:
            out["params_host_pinned"] = p * (P - small) / W
            out["params_gpu"] = p * small
        else:
            out["params_gpu"] = p * part
        if run.offload_optimizer:
            out["grads_host"] = g * P / W
        else:
            out["grads_gpu"] = g * part
    if run.offload_optimizer:
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
    """
    a = 2 if run.mixed_precision in ("bf16", "fp16") and run.device != "cpu" else 4
    if run.strategy == "deepspeed" and run.zero_stage == 3:
        if run.shard_group == 1 and not run.offload_params:
            return 0.0
        live = max(run.max_live_parameters, arch.lm_head_params + 2 * arch.params_per_layer)
        return a * min(arch.num_params, live)
    if run.strategy == "fsdp2":
        if not run.fsdp_reshard_after_forward:
            return a * arch.num_params  # every unit stays gathered from its forward to its backward
        n = 2 * arch.params_per_layer
        if phase == "loss":
            n = arch.params_per_layer + arch.lm_head_params + arch.hidden_size
        return a * n
    return 0.0


def comm_buffer_bytes(arch: Architecture, run: RunShape, phase: str) -> float:
    """Gradient-reduction buffers on a GPU at a phase ("loss", "layer" or "step").

    DDP: the reducer's flat buckets, one persistent copy of all gradients in the parameter dtype
      (gradient_as_bucket_view=False, Accelerate's default).
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
    a = 2 if run.mixed_precision in ("bf16", "fp16") and run.device != "cpu" else 4
    P = arch.num_params
    layer = arch.params_per_layer
    bucket = run.reduce_bucket_size
    if run.device == "cpu":
        bucket = min(bucket, P)
    if run.strategy == "ddp":
        return _param_bytes(run) * P
    if run.strategy == "fsdp2":
        return a * 2 * layer if phase == "layer" else 0.0
    if run.strategy == "deepspeed":
        if run.zero_stage == 3:
            cat = min(bucket, P) if (phase == "layer" and run.device != "cpu") else 0
            return a * (bucket + cat)
        return a * (bucket + (layer if phase == "layer" else 0))
    return 0.0


# =====================================================================================================================
# Activations
# =====================================================================================================================
def checkpointed_input_bytes(arch: Architecture, run: RunShape, n_tokens: int | None = None) -> float:
    """Checkpointed activations: with gradient checkpointing each decoder layer keeps its input, the hidden states
    [micro-batch, local length, hidden] in the activation dtype (transformers `GradientCheckpointingLayer`; FSDP's
    `checkpoint_wrapper`). Whole model: layers x tokens x hidden x bytes, plus the rotary cos/sin [tokens, head_dim]
    computed once per forward and shared by every layer. On the GPU unless offloaded (see
    `offloaded_activation_host_bytes`)."""
    n = run.tokens_per_rank if n_tokens is None else n_tokens
    a = run.act_bytes
    return arch.num_layers * n * arch.hidden_size * a + 2 * n * arch.head_dim * a


def _kv_dim_attention(arch: Architecture, run: RunShape) -> int:
    """Per-local-token width of K (or V) as the attention kernel sees it. Ulysses (DeepSpeed UlyssesSPAttentionHF)
    gives each rank the full sequence with kv_heads / sp heads, or one replicated head when kv_heads < sp
    (`kv_replication_factor`): per local token that is head_dim x max(kv_heads, sp)."""
    if run.uses_ulysses:
        return arch.head_dim * max(arch.num_key_value_heads, run.sp)
    return arch.kv_dim


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
    norm_extra = 0 if liger else (F32 * H if a < 4 else 0) + a * H
    attn = {}
    x0_alive = (liger or run.checkpoint_reentrant) and (run.offload_activations or not run.gradient_checkpointing)
    if x0_alive and run.gradient_checkpointing:
        attn["layer input (back from host)"] = a * H
    attn["input norm"] = norm_extra
    attn["norm output"] = a * H
    if arch.qk_norm:
        # transformers: the fp32 copy + normalised 16-bit q and k; Liger: the pre-norm q and k (saved as X)
        qk = qd + arch.kv_dim
        attn["q/k norms"] = a * qk if liger or a == F32 else (F32 + a) * qk
    attn["q, k, v"] = a * (qd + 2 * kvd)
    attn["attention output + lse"] = a * qd + F32 * nh
    if run.uses_ulysses:
        attn["Ulysses local output"] = a * qd
    if run.attn_implementation == "eager":
        n_kv = run.per_rank_length * run.sp
        attn["eager softmax (fp32 + 16-bit)"] = (F32 + a) * nh * n_kv
        attn["eager repeat_kv"] = 2 * a * (qd - arch.kv_dim)
    mlp = {}
    if liger:
        mlp["residual (saved by norm 2)"] = a * H
    mlp["post-attention norm"] = norm_extra
    mlp["norm output"] = a * H
    if not run.tiled_mlp:
        mlp["MLP intermediates"] = (3 if liger else 4) * a * I
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
    n = run.tokens_per_rank if n_tokens is None else n_tokens
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
        n_kv = run.per_rank_length * run.sp
        ws = (F32 + a) * nh * n_kv
    if run.cp > 1:
        kv = a * 2 * arch.kv_dim
        ws += kv * (run.cp + 1) if run.cp_comm_strategy == "allgather" else 2 * kv
        ws += F32 * (qd + 2 * arch.kv_dim) + 2 * F32 * 2 * arch.kv_dim
    peak_attn = (s_attn + held + grads + ws) * n
    if not run.gradient_checkpointing:
        # stored activations are counted separately (all layers); here only the backward's transients
        peak_mlp -= (s_attn + s_mlp) * n
        peak_attn -= s_attn * n
    return {"mlp_backward": peak_mlp, "attention_backward": peak_attn, "peak": max(peak_mlp, peak_attn)}


def stored_activation_bytes(arch: Architecture, run: RunShape, n_tokens: int | None = None) -> float:
    """Without gradient checkpointing every layer keeps everything it saves (see `layer_saved_bytes_per_token`)
    plus its input, for all layers, until the backward reaches it."""
    n = run.tokens_per_rank if n_tokens is None else n_tokens
    saved = layer_saved_bytes_per_token(arch, run)
    per_token = sum(saved["attention"].values()) + sum(saved["mlp"].values()) + run.act_bytes * arch.hidden_size
    return arch.num_layers * per_token * n


def loss_bytes(arch: Architecture, run: RunShape, n_tokens: int | None = None) -> dict:
    """Peak bytes of the loss: the final norm, the LM head and the cross-entropy, forward and the start of backward.

    fused_chunked -- TRL 1.16 SFTTrainer (`add_fused_lm_head`, trl/kernels/chunked_logprob.py): the forward keeps a
      copy of the scored hidden states (`hidden_states[mask]`, saved for backward; the norm output itself is then
      free), fp32 per-token log_z and entropy and one 16-bit [4096 x 32768] tile; the backward allocates
      `grad_hidden` in fp32 for all local tokens, `grad_weight` in fp32 [vocab x hidden], the tile again, and
      converts both to the parameter dtype before returning (fp32 and 16-bit copies alive together).
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
    n = run.tokens_per_rank if n_tokens is None else n_tokens
    a, H, V = run.act_bytes, arch.hidden_size, arch.vocab_size
    p = _param_bytes(run)
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
        chunk = min(_pow2(math.ceil(n / inc)), n) if n > 0 else 0
        fixed = a * chunk * V + p * V * H  # logits chunk + grad_weight
    else:  # fused_chunked: at its backward the norm output is gone (only the `hidden[mask]` copy is saved)
        per_token = norm_saved + a * H + 2 * F32 + F32 * H + a * H  # copy, log_z + entropy, grad_hidden fp32 + 16-bit
        tile = min(n, TRL_TOKEN_CHUNK) * min(V, TRL_VOCAB_CHUNK) * a if n > 0 else 0
        fixed = tile + F32 * V * H + p * V * H
    return {"per_token": per_token, "fixed": fixed, "total": per_token * n + fixed}


def optimizer_step_bytes(arch: Architecture, run: RunShape) -> float:
    """Temporaries of the optimizer step (activations are freed by then).

    ZeRO-3 without offload (stage3.py `_prepare_fp32_grad_for_sub_group`): flattens a sub-group's 16-bit gradient
      partitions and converts them to fp32, up to `sub_group_size` (1e9) elements at a time: (2 + 4) bytes each.
    ZeRO-1/2 without offload: the fp32 gradient partition of the step (`single_grad_partition`), 4 bytes per
      partitioned element. DDP / FSDP2 with torch's fused AdamW: none to speak of. CPU offload: on the host.
    """
    if run.strategy != "deepspeed" or run.offload_optimizer:
        return 0.0
    part = arch.num_params / run.shard_group
    if run.zero_stage == 3:
        p = _param_bytes(run)
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
    n = run.tokens_per_rank if n_tokens is None else n_tokens
    hidden = n * arch.hidden_size * run.act_bytes
    if not run.offload_pinned or run.device == "cpu":
        return arch.num_layers * hidden
    return arch.num_layers * _pow2(hidden)


def kernel_length_limits(arch: Architecture, run: RunShape) -> list[tuple[str, int]]:
    """Hard limits that are not memory: (reason, longest global max_length) pairs. Liger's kernels address
    [tokens, hidden] with 32-bit offsets (Liger-Kernel #803), so tokens x hidden < 2**31 per rank."""
    out = []
    if run.liger_kernels and run.device == "gpu":
        per_rank = (INT32_ELEMENTS - 1) // (arch.hidden_size * run.per_device_batch)
        out.append(("Liger kernels index tokens x hidden with int32 (Liger-Kernel #803)", per_rank * run.cp * run.sp))
    return out


# =====================================================================================================================
# The estimate
# =====================================================================================================================
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
    terms.append(Term("parameters", _gib(params_here),
                      f"{zl}" + (" / offload_param_device" if ds else "") + ", dtype", dev))
    terms.append(Term("gradients", _gib(states["grads_gpu"] + host_side["grads_host"]),
                      f"{zl} / offload_optimizer_device" if ds else zl, dev))
    terms.append(Term("optimizer states" + (" (Adam + fp32 master)" if ds else " (Adam)"),
                      _gib(states["optim_gpu"] + host_side["optim_host"]),
                      f"{zl} / offload_optimizer_device" if ds else zl, dev))
    phase_key = {"loss": "loss", "layer": "layer", "optimizer step": "step"}[peak_phase]
    gp = gathered_param_bytes(arch, run, "loss" if peak_phase == "loss" else "layer")
    if gp:
        terms.append(Term("gathered parameters", _gib(gp),
                          "stage3_max_live_parameters / stage3_max_reuse_distance" if ds
                          else "fsdp_reshard_after_forward (one unit per layer)", dev, in_fwd_bwd))
    cb = comm_buffer_bytes(arch, run, phase_key)
    if cb:
        terms.append(Term("communication buffers", _gib(cb),
                          "reduce_bucket_size (DeepSpeed default 5e8 with an Accelerate YAML)" if ds
                          else "DDP bucket_cap_mb / gradient_as_bucket_view" if run.strategy == "ddp"
                          else "FSDP2 reduce-scatter of one layer", dev))
    offload_knob = ("fsdp_activation_checkpointing_offload (or gradient_checkpointing_kwargs: {offload: true})"
                    if run.strategy == "fsdp2" else "gradient_checkpointing_kwargs: {offload: true}")
    if run.gradient_checkpointing:
        where_ckpt = "offloaded to host" if (run.offload_activations and not cpu) else f"offload with {offload_knob}"
        terms.append(Term("checkpointed activations (layer inputs)", _gib(ckpt_gpu),
                          f"{length_setting}; {where_ckpt}", dev, in_fwd_bwd))
    else:
        terms.append(Term("stored activations (no checkpointing)", _gib(stored),
                          f"{length_setting}; gradient_checkpointing", dev, in_fwd_bwd))
    layer_knobs = ["tiled_mlp_shards" if run.tiled_mlp else "tiled_mlp" if run.strategy == "deepspeed" else "",
                   "attn_implementation"]
    layer_knobs = [k for k in layer_knobs if k]
    if run.cp > 1:
        layer_knobs.append("cp_comm_strategy")
    if not run.liger_kernels:
        layer_knobs.append("use_liger_kernel")
    terms.append(Term("one layer's recompute + backward", _gib(layer), f"{length_setting}; {', '.join(layer_knobs)}",
                      dev, peak_phase == "layer"))
    terms.append(Term("loss (LM head + cross-entropy)", _gib(loss),
                      f"{length_setting}; loss implementation ({run.loss})", dev, peak_phase == "loss"))
    if step:
        terms.append(Term("optimizer step temporaries", _gib(step),
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
        total = _gib(allocated) + runtime
    else:
        ctx = OVERHEAD["cuda_context_gib"] + (OVERHEAD["nccl_gib"] if run.world_size > 1 else 0.0)
        terms.append(Term("CUDA context" + (" + NCCL buffers" if run.world_size > 1 else ""), ctx,
                          "fixed per process (OVERHEAD)", dev))
        reserve = OVERHEAD["allocator_reserve"] * _gib(allocated)
        terms.append(Term("allocator reserve (fragmentation)", reserve,
                          "PYTORCH_CUDA_ALLOC_CONF (global 2% model)", dev))
        total = _gib(allocated) + ctx + reserve

    # ---- host
    host: list[Term] = []
    if not cpu:
        if states["optim_host"] or states["grads_host"]:
            host.append(Term("offloaded optimizer states + fp32 master + gradients",
                             _gib(states["optim_host"] + states["grads_host"]),
                             "offload_optimizer_device" if ds else "fsdp_offload_params", "host"))
        if states["params_host_pinned"] or states["params_host"]:
            pinned = states["params_host_pinned"]
            if pinned and run.strategy == "deepspeed":
                # one pinned flat buffer per parameter group (stage3.py `_create_param_groups_fp16_flat_cpu_memory`,
                # `pin_memory` -> torch's caching host allocator): rounded up to a power of two
                pinned = _pow2(pinned)
            host.append(Term("offloaded parameters (pinned)", _gib(pinned + states["params_host"]),
                             "offload_param_device" if ds else "fsdp_offload_params", "host"))
        act = offloaded_activation_host_bytes(arch, run)
        if act:
            host.append(Term("offloaded checkpoints" + (" (pinned, power-of-two blocks)" if run.offload_pinned else ""),
                             _gib(act), f"{length_setting}; {offload_knob}", "host"))
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
        allocated_peak_gib=total if cpu else _gib(allocated),
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


def format_table(est: Estimate, gpu_memory_gib: float, host_memory_gib: float | None = None) -> str:
    """The per-GPU table (term, GiB, setting), the host table, total vs budget, headroom and a verdict line."""
    unit = "per process (CPU)" if est.device == "cpu" else "per GPU"
    lines = [f"Memory {unit} (peak phase: {est.peak_phase}; per-rank length {est.per_rank_length} tokens)"]
    w = max([len(t.name) for t in est.gpu_terms + est.host_terms] + [20])
    lines.append(f"  {'term':<{w}}  {'GiB':>8}  setting")
    for t in est.gpu_terms:
        mark = "" if t.counted else "  (other phase, not in the total)"
        lines.append(f"  {t.name:<{w}}  {t.gib:8.2f}  {t.setting}{mark}")
    lines.append(f"  {'total':<{w}}  {est.gpu_peak_gib:8.2f}  budget {gpu_memory_gib:.2f} GiB, "
                 f"headroom {gpu_memory_gib - est.gpu_peak_gib:+.2f} GiB")
    if est.host_terms:
        lines.append("Host memory per process")
        for t in est.host_terms:
            lines.append(f"  {t.name:<{w}}  {t.gib:8.2f}  {t.setting}")
        budget = f"budget {host_memory_gib:.1f} GiB" if host_memory_gib is not None else "no budget given"
        lines.append(f"  {'total per process':<{w}}  {est.host_per_process_gib:8.2f}")
        lines.append(f"  {'total per node':<{w}}  {est.host_per_node_gib:8.2f}  {budget}")
    ok = fits(est, gpu_memory_gib, host_memory_gib)
    verdict = "fits" if ok else "does NOT fit"
    lines.append(f"Verdict: {verdict}. {est.advice()}")
    for note in est.notes:
        lines.append(f"Note: {note}")
    return "\n".join(lines)


def measure_cpu_runtime_baseline_gib() -> float:
    """Re-measure CPU_RUNTIME_BASELINE_GIB: VmRSS of a fresh interpreter after importing the training stack. Runs a
    subprocess (several seconds); used by the tests only on request."""
    import subprocess
    import sys

    code = (
        "import torch, transformers, accelerate, deepspeed, trl\n"
        "from trl import SFTTrainer, SFTConfig\n"
        "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) / 2**20


def measure_cpu_deepspeed_engine_gib(stage: int = 3) -> float:
    """Re-measure CPU_DEEPSPEED_ENGINE_GIB: a fresh process builds a bare ZeRO engine (gloo, one rank, a 0.5M-parameter
    model, DeepSpeed's default buckets), takes two steps, and reports the VmRSS growth since before
    `deepspeed.initialize` (minus the model states, 16 bytes per parameter). Runs a subprocess (~30 s)."""
    import os
    import subprocess
    import sys

    code = f"""
import os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import torch, deepspeed
def rss():
    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]) * 1024
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
cfg = {{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {{"stage": {stage}}},
       "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3, "torch_adam": True}}}}}}
deepspeed.init_distributed(dist_backend="gloo")
before = rss()
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
for _ in range(2):
    loss = engine(torch.randn(4, 512)).sum()
    engine.backward(loss)
    engine.step()
states = 16 * sum(p.numel() for p in model.parameters())
print(rss() - before - states)
"""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return int(out.stdout.strip().splitlines()[-1]) / 2**30

"""The throughput model: a run shape's predicted step time and tokens per second per GPU, before any step runs.

A step is the kernels one GPU runs in it, and each kernel takes as long as the slower of what it does and what it
costs to issue (a roofline with a floor):

    kernel time = max(FLOPs / (peak x MATMUL_FRACTION_OF_PEAK) + bytes / MEMORY_BOUND_BYTES_PER_S, KERNEL_ISSUE_S)
    step time   = sum over the step's kernels + offloaded bytes / HOST_LINK_BYTES_PER_S
                  + an offloaded optimizer's host bytes / HOST_MEMORY_BYTES_PER_S_PER_GPU

- The kernels are counted from the code the run executes (`Op` tables below: transformers 5.23's modules in eager
  PyTorch, Liger 0.8.5's Triton kernels, PEFT 0.21's LoRA layer, TRL 1.16's fused LM head, torch's fused AdamW,
  FSDP2's parameter copies, autocast's casts of fp32 weights), per layer and pass: forward, the forward again where
  activation checkpointing recomputes it (and DeepSpeed's tiled MLP its MLP), backward. GEMMs carry their FLOPs (no
  weight gradients for a frozen base; causal attention at half the formula's, the kernel skips the masked blocks); the
  other kernels the bytes they read and write. Liger's kernels replace several unfused ones (an RMSNorm reads and
  writes its rows once instead of through eight kernels): what turning Liger on buys is counted, not fitted.
- The constants are calibration (`launch.facts.calibration`): the matmul fraction measured on an H100; the memory-bound
  bandwidth and the per-kernel issue time, two constants fitted together to the measured rows (`fit`). The issue
  floor is what makes small micro-batches and small models slower per token: their kernels are too short to hide
  eager PyTorch's per-op host work. tests/test_fastest.py checks every measured row within 20%.

With more than one process the step adds the communication it waits for (`launch.speed.communication`: each
strategy's collectives, their time at the links' bus bandwidth, what the layers' compute hides of them):
step = compute + exposed communication. One process has none: its prediction is the compute alone.

An optimizer stepped on the host (DeepSpeed's CPU Adam under optimizer offload) adds its host-memory traffic at a
stated bandwidth per GPU, exposed (`host_step_bytes`). Not modelled, and said where it matters: dataloading.
The peak is the target GPU's dense BF16 peak (`launch.facts.gpus`); the rates were measured on the calibration GPU, an
H100 SXM, and carry to another GPU by the rule of `rates_for` (the fractions and the issue time kept, the bandwidth
scaled by the GPU's memory bandwidth, the host link the GPU's), until that GPU has measured rates of its own.

Reports (`flops_by_convention`) give each convention beside the others: the model FLOPs of the MFU (6N + 12 L H d S,
non-causal, recomputation not counted: `launch.speed.measured`), the hardware FLOPs of the HFU (what the GPU executes:
the causal FLOPs, since the attention kernels skip the masked half, plus checkpointing's recomputed forward; so the HFU
cannot pass the matmul ceiling the model itself runs at), and for an adapter run the FLOPs a frozen base really costs:
NeMo Automodel scales the full fine-tune's causal FLOPs by (2 + trainable / frozen) / 3 (no weight-gradient matmuls for
the frozen base), so a LoRA row can be set against NeMo's published figure in its own convention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from launch.config.training_args import FSDP_CHECKPOINTING, FSDP_CHECKPOINTING_OFFLOAD
from launch.facts import calibration, gpus
from launch.memory import adapters
from launch.memory.architecture import Architecture
from launch.memory.run_shape import RunShape
from launch.speed import communication as comm
from launch.speed.measured import flops_params, flops_per_token  # the one MFU formula


# ---- what a layer runs: memory-bound ops, bytes per element and kernels, forward and backward ------------------------
@dataclass(frozen=True)
class Op:
    """A memory-bound operation: bytes read + written per element of its [tokens, width] tensors, and the kernels it
    launches, in the forward and the backward (the bytes spread evenly over its kernels). Tiny per-row reductions and
    the weights are left out of the bytes."""

    bytes_fwd: float
    bytes_bwd: float
    kernels_fwd: int
    kernels_bwd: int


# By layer kernels (`RunShape.layer_kernels`): "eager", transformers 5.23's module in eager PyTorch; "liger", Liger
# 0.8.5's Triton kernel. Another kernel option is one more key in each row (and its memory terms, launch.memory.terms).
LAYER_OPS = {
    # Qwen3RMSNorm / LlamaRMSNorm: to(fp32) 2+4, pow 4+4, mean 4, (+ eps, rsqrt on one value a row), mul 4+4,
    # to(bf16) 4+2, weight mul 2+2 = 36 bytes in 8 kernels; autograd's backward of those ops: the weight's grad
    # (mul, sum over tokens), the casts, the rsqrt path (mul, sum, rsqrt's and mean's backward), pow's backward and the
    # two paths into the input summed, ~76 bytes in 16 kernels. Liger's RMSNorm: one kernel reads X and writes Y (4);
    # backward reads dY and X and writes dX (6), then sums the per-program weight grads (2 kernels).
    "rmsnorm": {"eager": Op(36, 76, 8, 16), "liger": Op(4, 6, 1, 2)},
    # apply_rotary_pos_emb on q and k: q*cos 2+2, rotate_half (neg 1+1 on half, cat 2+2), *sin 2+2, add 4+2 = 20 per
    # element in 5 kernels a tensor; backward: the muls 4+4, neg's 2, the two slices' zero-filled grads 8, the three
    # contributions summed 6 = 24 in 9 kernels a tensor. Liger: one kernel for q and k, in place, 4 / 4.
    "rope": {"eager": Op(20, 24, 10, 18), "liger": Op(4, 4, 1, 1)},
    # act_fn(gate) * up: silu 2+2, mul 4+2 = 10 per intermediate element in 2 kernels; backward: two muls 6+6, silu's
    # 6 = 18 in 3. Liger's SwiGLU: reads gate and up, writes the product (6); backward reads dY, gate, up and writes
    # the two grads (10), one kernel each way.
    "swiglu": {"eager": Op(10, 18, 2, 3), "liger": Op(6, 10, 1, 1)},
}
# A packed row's mask under SDPA (`RunShape.masked_attention`): per layer call torch converts transformers' boolean
# [T, T] mask into the query dtype's additive bias (attention.cpp `convert_boolean_attn_mask`: `logical_not` reads
# and writes T^2 bytes, `at::where` reads them and writes T^2 x 2), 5 bytes per cell in 2 kernels, in every forward
# pass (the recomputed one too); the model builds the boolean mask once per forward (masking_utils `sdpa_mask`: the
# conversation ids compared, the causal test, their `&`: about 1 + 1 + 3 bytes per cell in 3 kernels).
MASK_TO_BIAS = Op(5, 0, 2, 0)
MASK_BUILD = Op(5, 0, 3, 0)
RESIDUAL_ADD = Op(6, 6, 1, 1)  # residual + x: read 4 write 2; backward: the two gradient paths summed
GRAD_SUM = Op(0, 6, 0, 1)  # a tensor several matmuls read (the norm output into q/k/v, into gate/up): grads summed
ATTN_OUTPUT_COPY = Op(4, 4, 1, 1)  # sdpa_attention_forward's transpose(1, 2).contiguous() of the output, its grad
# PEFT's LoRA Linear (`result + lora_B(lora_A(dropout(x))) * scaling`) per wrapped module, for an fp32 adapter under
# bf16 autocast. Per element of its input: x.to(fp32) 2+4, dropout 4+4+1 (its mask), autocast's cast back to bf16 for
# lora_A 4+2, lora_A's read 2 = 23 in 4 kernels; backward: lora_A's two grads read/write 2 + 2, the casts back 6 + 6,
# dropout's 9, the sum into x's grad 6 = 31 in 6 kernels. Per element of its output: lora_B writes 2, `* scaling`
# 2+2, the add 4+2 = 12 in 3 kernels; backward: scaling's 4, lora_B's two grads read 2 + 2 = 8 in 3 kernels. Without
# dropout (p = 0: nn.Identity) 9 bytes and a kernel less each way; a 16-bit adapter (QLoRA, ZeRO-3) has no casts:
# 12 bytes and 2 kernels less each way.
LORA_INPUT = Op(23, 31, 4, 6)
LORA_DROPOUT = Op(9, 9, 1, 1)
LORA_CASTS = Op(12, 12, 2, 2)
LORA_OUTPUT = Op(12, 8, 3, 3)
# bitsandbytes' 4-bit base (QLoRA): each matmul first dequantizes its weight (read 0.5, write 2 bytes per weight), in
# each pass (forward, recomputed forward, the backward's input gradient).
QLORA_DEQUANT_BYTES = 2.5
# TRL's fused LM head (trl/kernels/chunked_logprob.py) works in [4096 tokens x 32768 vocabulary] tiles: per tile the
# logits GEMM and a Triton fold that reads the tile (forward); the backward recomputes the GEMM, folds (reads the
# tile, writes its gradient in place), and runs the hidden states' and (when the head trains) the weight's GEMMs.
LOSS_TILE_BYTES = Op(2, 4, 1, 1)
# The optimizer step, bytes per trainable element on the GPU: torch's fused AdamW reads param, grad, exp_avg,
# exp_avg_sq and writes three of them (7 x the state's bytes); clip_grad_norm_ reads the grads for the norm and
# reads + writes them to scale (3 x the grad's bytes). DeepSpeed's fp32 master step: master, fp32 grad, two Adam
# states read, three written (4 x 7), the 16-bit grad converted (2 + 4), the 16-bit params written back (4 + 2).
ADAMW_ACCESSES = 7
CLIP_ACCESSES = 3
DEEPSPEED_STEP_BYTES = 4 * 7 + 6 + 6
# Gradient accumulation: every micro-batch after the first adds into each gradient (read two, write one; one
# kernel per parameter tensor under DDP, as autograd accumulates `.grad`).
ACCUMULATE_ACCESSES = 3
# FSDP2 per micro-batch and parameter: each all-gather copies the fp32 shard in as bf16 (4 + 2 per sharded element)
# and the gathered bf16 buffer out into the unsharded parameters (2 + 2 + 2 per element); forward, and again for the
# backward after `reshard_after_forward`. The reduce-scatter copies the bf16 grads in (2 + 2) and adds its fp32 output
# shard into the sharded grad (4 x 3 per sharded element). Kernels per layer: copy-in, all-gather, copy-out per
# gather; copy-in, reduce-scatter, the add per reduction.
FSDP_GATHER = (6, 6, 3)  # (bytes per element, bytes per sharded element, kernels per layer)
FSDP_REDUCE = (4, 12, 3)
# DeepSpeed per micro-batch and parameter: ZeRO-3 gathers each 16-bit partition for the forward and the backward
# (the gathered copy written 2, read 2) and reduce-scatters the grads (2 + 2); ZeRO-1/2 copy the grads into their
# reduction bucket (2 + 2).
ZERO3_GATHER_BYTES = 4
ZERO_REDUCE_BYTES = 4
# Autocast's casts of fp32 weights (DDP or one process loaded in fp32 under bf16 autocast: `Precision.autocast_copies`).
# torch's autocast casts a matmul's fp32 weight to bf16 (`cached_cast`, aten/src/ATen/autocast_mode.cpp) and caches
# the cast of a leaf that requires grad until the outermost autocast region exits (torch/amp/autocast_mode.py
# `__exit__`: `clear_autocast_cache` when the nesting drops to 0). Accelerate's autocast wraps the model's forward,
# so each decoder weight is cast once per forward; the backward runs outside it and reuses the bf16 copy autograd
# saved, but the cast's own backward (ToCopyBackward0) converts the bf16 weight gradient to fp32; checkpointing's
# recomputed forward runs in an autocast region of its own (torch/utils/checkpoint.py) and casts its layer's weights
# again. Each cast reads 4 and writes 2 bytes per weight element, the gradient's reads 2 and writes 4, one kernel a
# weight. TRL's fused LM head casts the head's weight itself, tile by tile, in the forward and again in the backward.
CAST_BYTES = 4 + 2
# The host's optimizer step under optimizer offload (DeepSpeed's ZeRO-Offload, DeepSpeedCPUAdam), bytes of host
# memory per parameter of the rank's shard: Adam reads the fp32 master, gradient and two moments (4 x 4) and writes
# the master and the moments (3 x 4); before it, the step converts the bf16 gradient partition the backward
# offloaded (stage3.py `grad_partitions_flat_buffer`, in the accumulation dtype) to the fp32 gradient (2 + 4); with
# the parameters offloaded too, their bf16 partitions live on the host and the update is copied into them there
# (stage3.py `_reassign_or_swap_out_partitioned_parameters`, 4 + 2).
HOST_ADAM_BYTES = 4 * 4 + 3 * 4
HOST_GRAD_CAST_BYTES = 2 + 4
HOST_PARAM_COPY_BYTES = 4 + 2
# Host memory bandwidth per GPU, NOT measured here: an NVIDIA DGX H100
# (https://www.nvidia.com/en-us/data-center/dgx-h100/) has two Xeon Platinum 8480C, each with 8 channels of DDR5-4800
# (Intel's data sheet: 8 x 38.4 GB/s), 614 GB/s for 8 GPUs: 76.8 GB/s a GPU. Accelerate gives each rank its share of
# the host's cores (OMP_NUM_THREADS = physical cores / processes), so a rank's CPU Adam streams at about its share; at
# the data sheet's peak the host step's time is a lower bound. Nothing of it overlaps the GPU's work: DeepSpeed runs
# it in `step()` after the backward (overlap_comm, on by default for ZeRO-3, overlaps the gradients' reduction and
# offload with the backward, not the CPU Adam; ZeRO-Offload's one-step delayed parameter update, arXiv 2101.06840,
# is not in DeepSpeed's ZeRO-3 config), so it adds to the step, exposed.
HOST_MEMORY_BYTES_PER_S_PER_GPU = 2 * 8 * 38.4e9 / 8


@dataclass(frozen=True)
class Kernels:
    """`count` kernels, each computing `flops` and moving `bytes` (the memory-bound bytes; a GEMM's own traffic is in
    its fraction of the peak). `attention`: the attention kernel, whose FLOPs run at the attention fraction."""

    count: float
    flops: float = 0.0
    bytes: float = 0.0
    attention: bool = False


@dataclass(frozen=True)
class Rates:
    """The calibrated rates a prediction uses (launch.facts.calibration), as one value: `fit` varies them."""

    matmul: float = calibration.MATMUL_FRACTION_OF_PEAK
    attention: float = calibration.ATTENTION_FRACTION_OF_PEAK
    bandwidth: float = calibration.MEMORY_BOUND_BYTES_PER_S
    issue_s: float = calibration.KERNEL_ISSUE_S
    host_link: float = calibration.HOST_LINK_BYTES_PER_S

    def seconds(self, k: Kernels, peak: float) -> tuple[float, float, float]:
        """(compute-bound, memory-bound, issue-bound) seconds of `k`: each kernel takes the longer of its work and
        the issue floor, booked under what set it."""
        compute = k.flops / (peak * (self.attention if k.attention else self.matmul))
        memory = k.bytes / self.bandwidth
        if compute + memory >= self.issue_s:
            return k.count * compute, k.count * memory, 0.0
        return 0.0, 0.0, k.count * self.issue_s


@dataclass(frozen=True)
class StepCost:
    """The predicted cost of one optimizer step of a run on one GPU: its compute (`seconds`, by part) and the
    communication the step waits for (`communication`: every collective, what of each is exposed); `step_s` is the
    two together."""

    step_s: float
    tokens_per_step_per_gpu: int
    seconds: dict  # "matmul", "memory-bound", "kernel issue", "host link"
    flops: dict  # per token: "model", "model_causal", "hardware", "executed", ["frozen_base", "frozen_base_causal"]
    peak_flops: float
    communication: comm.Communication | None = field(default=None, compare=False)
    # the share of the step's tokens that are real (`RunShape.real_token_share`: the measured dataset's padding or
    # packing fill); None unmeasured: every planned token counted as real
    real_token_share: float | None = field(default=None, compare=False)

    @property
    def compute_s(self) -> float:
        """The step's compute: its kernels and the host link, without communication."""
        return sum(self.seconds.values())

    @property
    def exposed_communication_s(self) -> float:
        return self.communication.exposed if self.communication else 0.0

    @property
    def communication_bound(self) -> bool:
        """The collectives take longer than the compute (nothing can hide them all), or the step waits for them a
        stated share of its time (`launch.speed.communication.BOUND_SHARE`) or more."""
        return bool(self.communication) and comm.bound(self.compute_s, self.communication)

    def step_json(self) -> dict:
        """`plan --json`'s "step_s": compute, exposed communication and the step, seconds."""
        return {"compute": round(self.compute_s, 4), "exposed_communication": round(self.exposed_communication_s, 4),
                "step": round(self.step_s, 4)}

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_step_per_gpu / self.step_s

    @property
    def useful_tokens_per_s_per_gpu(self) -> float | None:
        """The non-pad tokens/s: all tokens/s x the real share. The step is predicted at the planned row length (a
        padded run's longest row), so for shorter batches this errs low (their attention costs less per token)."""
        return None if self.real_token_share is None else self.tokens_per_s_per_gpu * self.real_token_share

    def utilization(self, key: str = "model") -> float:
        """FLOPs per token (`flops[key]`) x predicted tokens/s / the GPU's peak: `model` is the MFU (non-causal),
        `hardware` the HFU, `frozen_base_causal` NeMo's LoRA convention."""
        return self.flops[key] * self.tokens_per_s_per_gpu / self.peak_flops

    def as_json(self) -> dict:
        return {"step_s": round(self.step_s, 4), "tokens_per_step_per_gpu": self.tokens_per_step_per_gpu,
                "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1),
                **({"useful_tokens_per_s_per_gpu": round(self.useful_tokens_per_s_per_gpu, 1)}
                   if self.real_token_share is not None else {}),
                "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
                "mfu": round(self.utilization("model"), 4), "hfu": round(self.utilization("hardware"), 4),
                **({"mfu_frozen_base_causal": round(self.utilization("frozen_base_causal"), 4)}
                   if "frozen_base_causal" in self.flops else {}),
                "flops_per_token": {k: round(v) for k, v in self.flops.items()},
                **({"step_parts_s": self.step_json()} if self.communication else {})}


# ---- FLOPs per token, in each convention ----------------------------------------------------------------------------
def flops_by_convention(arch: Architecture, run: RunShape) -> dict:
    """FLOPs per token in each convention (see the module docstring): "model" (6N + 12 L H d S, the MFU's:
    `launch.speed.measured.flops_per_token`, N every matmul parameter), "model_causal" (attention halved), "hardware"
    (what the GPU executes: the causal FLOPs plus checkpointing's recomputed forward, 2 N_layers + 2 L H d S, and a
    tiled MLP's 2 N_mlp; the non-causal count would credit the GPU with the masked half of attention, which SDPA's
    and FlashAttention's causal kernels skip, and put a long-context HFU above what the matmuls can run at),
    "executed" (what the GPU runs: `_kernels`); for an adapter run also "frozen_base" and "frozen_base_causal" (NeMo's:
    x (2 + trainable / frozen) / 3)."""
    mfu_args = (flops_params(arch), arch.num_layers, arch.num_attention_heads, arch.head_dim, run.layout.max_length)
    out = {"model": flops_per_token(*mfu_args), "model_causal": flops_per_token(*mfu_args, causal=True)}
    # the attention the kernels execute, forward, per token (`attention_forward_flops`: the causal half of the
    # 12 L H d S / 3 for unmasked rows; a packed row's whole square under SDPA's mask; conversations' triangles
    # under varlen), run forward, backward (twice) and again where checkpointing recomputes the forward
    executed = arch.num_layers * attention_forward_flops(arch, run) / run.layout.tokens_per_rank
    share = recomputed_share(arch, run)
    causal = out["model"] - out["model_causal"]  # 6 L H d S: the causal attention of the forward and backward
    recompute = 2 * arch.num_layers * arch.matmul_params_per_layer * share
    if run.tiled_mlp:
        recompute += 2 * arch.num_layers * arch.mlp_params_per_layer
    out["hardware"] = out["model_causal"] - causal + executed * (3 + share) + recompute
    kernels = _micro_batch_kernels(arch, run)
    out["executed"] = sum(k.count * k.flops for k in kernels) / run.layout.tokens_per_rank
    if run.adapter is not None:
        trainable = adapters.trainable_params(arch, run)
        ratio = (2 + trainable / max(arch.num_params - trainable, 1)) / 3
        out["frozen_base"] = out["model"] * ratio
        out["frozen_base_causal"] = out["model_causal"] * ratio
    return out


# ---- the kernels of one micro-batch -------------------------------------------------------------------------------
def masked_sdpa_backend(gpu: gpus.GPU) -> str:
    """The SDPA backend a packed row's boolean mask gets on `gpu` in the image (torch 2.13 built for CUDA 13.0 with
    the cuDNN wheel of requirements/image.lock, 9.20), by torch's dispatch (aten/src/ATen/native/transformers/cuda/
    sdp_utils.cpp): `check_prefer_cudnn_attention` puts cuDNN attention first on compute capability 9.x and 10.x
    once the loaded cuDNN is newer than 9.15 (a CUDA 13 build), and cuDNN takes a mask (`check_attn_mask_shape`);
    the flash backend refuses one (`check_for_attn_mask`), so elsewhere the memory-efficient kernel (CUTLASS, sm50
    to sm121) runs it. Read from the source, not measured here: `python -m launch doctor`'s "SDPA backend" line
    reports what a GPU picks (`launch.checks.traps.check_sdpa_backend`, a boolean mask among its probes)."""
    major, _minor = gpus.COMPUTE_CAPABILITY[gpu.name]
    return "cuDNN attention" if major in (9, 10) else "memory-efficient attention"


def attention_forward_flops(arch: Architecture, run: RunShape) -> float:
    """Forward FLOPs of one layer's attention on one micro-batch (4 x q_dim per query-key pair: QK^T and PV; the
    backward is twice this), by what the kernel computes:

    - rows of one sequence each (padded or synthetic rows; ring CP's share of them), causal without a mask: the
      flash / cuDNN kernels skip the masked blocks, half the square: 4 q_dim x T x S / 2 (T the rank's tokens, S
      max_length);
    - a padding-free row under a mask (`RunShape.masked_attention`: sdpa, eager): transformers passes the mask with
      `is_causal=False` (integrations/sdpa_attention.py), and SDPA's kernels that take a mask (memory-efficient,
      cuDNN, math) add the bias to every block of the row's T x T scores and skip none: 4 q_dim x T^2, a micro-batch
      of b full conversations costing 2 b times their causal attention padded;
    - a padding-free row under FlashAttention 2/3/4 (varlen over cu_seq_lens): each conversation's own causal
      triangle, sum of l^2 / 2 = T x l / 2 with l the token-weighted mean conversation length
      (`RunShape.conversation_length`, from the measured dataset), or full-length conversations (l = max_length)
      where the dataset is not measured: then the padded formula.
    The kernel's rate is the calibrated attention fraction for every kernel (measured on causal flash/cuDNN
    attention: launch.facts.calibration); the masked kernels' own rate is not measured (the memory-efficient kernel,
    an sm80 CUTLASS kernel, runs below the flash rate on Hopper), so a packed-SDPA prediction errs fast."""
    T, S, q = run.layout.tokens_per_rank, run.layout.max_length, arch.q_dim
    if run.masked_attention:
        rows, n = run.attention_rows
        return 4 * q * rows * n * n
    if run.padding_free:
        length = min(run.conversation_length or S, S)
        return 4 * q * T * length / 2
    return 4 * q * S * T / 2


def recomputed_share(arch: Architecture, run: RunShape) -> float:
    """The share of the decoder layers whose forward the backward runs again: 1 with checkpointing, 0 without, k / L
    with `checkpointing_layers: k` (RunShape.checkpointed_layers)."""
    return run.checkpointed_layers(arch.num_layers) / arch.num_layers


def _passes(arch: Architecture, run: RunShape) -> tuple[float, int]:
    """(forward passes, backward passes) of each layer per micro-batch, on average over the layers: checkpointing
    runs a checkpointed layer's forward twice."""
    return 1 + recomputed_share(arch, run), 1


def _minus(a: Op, *others: Op) -> Op:
    return Op(*(getattr(a, f.name) - sum(getattr(o, f.name) for o in others) for f in fields(Op)))


def layer_ops(arch: Architecture, run: RunShape) -> list[tuple[int, Op]]:
    """(width, op) of every memory-bound op of one decoder layer. Liger's instance patch (transformers'
    `apply_liger_kernel` -> `_apply_liger_kernel_to_instance`) replaces the layers' two norms, RoPE and the MLP's
    SwiGLU (not under DeepSpeed's tiled MLP, which wraps the MLP itself); Qwen3's per-head q/k norms stay
    transformers' modules. An adapter adds PEFT's LoRA paths, one per wrapped linear layer."""
    kernels = run.layer_kernels
    H, I, q, kv = arch.hidden_size, arch.intermediate_size, arch.q_dim, arch.kv_dim
    ops = [(2 * H, LAYER_OPS["rmsnorm"][kernels]), (q + kv, LAYER_OPS["rope"][kernels]),
           (I, LAYER_OPS["swiglu"]["eager" if run.tiled_mlp else kernels]), (2 * H, RESIDUAL_ADD), (3 * H, GRAD_SUM),
           (q, ATTN_OUTPUT_COPY)]
    if arch.qk_norm:
        ops.append((q + kv, LAYER_OPS["rmsnorm"]["eager"]))
    if run.masked_attention and kv < q:
        # transformers' `repeat_kv` under a mask (integrations/sdpa_attention.py: no `enable_gqa` on CUDA with a mask):
        # K and V copied to every query head, per element of the copy a 16-bit write and kv / q of a read; backward,
        # the copies' gradients read and summed down to the kv heads
        ops.append((2 * q, Op(2 + 2 * kv / q, 2 + 2 * kv / q, 2, 2)))
    if run.adapter is not None:
        less = ([] if run.adapter.dropout > 0 else [LORA_DROPOUT]) + (
            [] if adapters.adapter_dtype_bytes(run) == 4 else [LORA_CASTS])
        shapes = arch.linear_layers()
        inp = _minus(LORA_INPUT, *less)
        for name in _wrapped(arch, run):
            ops += [(shapes[name][1], inp), (shapes[name][2], LORA_OUTPUT)]
    return ops


def _wrapped(arch: Architecture, run: RunShape) -> list[str]:
    """The suffixes of the linear layers of one decoder layer that the adapter wraps."""
    shapes = arch.linear_layers()
    names = [t.rsplit(".", 1)[-1] for t in run.adapter.targets(arch.linear_module_names())
             if t.startswith("model.layers.0.")]
    return [n for n in names if n in shapes]


def _op_kernels(width: float, op: Op, tokens: int, passes: tuple[float, int], times: int) -> list[Kernels]:
    out = []
    for nbytes, kernels, npass in ((op.bytes_fwd, op.kernels_fwd, passes[0]),
                                   (op.bytes_bwd, op.kernels_bwd, passes[1])):
        if kernels:
            out.append(Kernels(kernels * npass * times, bytes=width * nbytes * tokens / kernels))
    return out


def _micro_batch_kernels(arch: Architecture, run: RunShape) -> list[Kernels]:
    """Every kernel of one micro-batch on one GPU: the layers' GEMMs, attention and memory-bound ops, the final norm,
    TRL's fused LM head, a 4-bit base's dequantization, the sharded strategies' per-micro-batch copies."""
    L, T = arch.num_layers, run.layout.tokens_per_rank
    passes = _passes(arch, run)
    fwd = passes[0]
    frozen = run.adapter is not None
    out: list[Kernels] = []
    for width, op in layer_ops(arch, run):
        out += _op_kernels(width, op, T, passes, L)
    for _parent, fan_in, fan_out in arch.linear_layers().values():
        gemm = 2 * T * fan_in * fan_out
        out.append(Kernels(L * (fwd + 1 + (0 if frozen else 1)), flops=gemm))  # forward(s), input grad, weight grad
    if frozen:  # LoRA's two small GEMMs per wrapped layer are in its memory-bound ops; their FLOPs here, once each
        out.append(Kernels(1, flops=2 * T * adapters.adapter_params(arch, run) * (fwd + 2)))
    attention = attention_forward_flops(arch, run)  # one layer's forward
    out += [Kernels(L * fwd, flops=attention, attention=True), Kernels(L, flops=2 * attention, attention=True)]
    if run.masked_attention and run.attn_implementation == "sdpa":
        rows, n = run.attention_rows
        cells = rows * n * n
        out += _op_kernels(cells, MASK_TO_BIAS, 1, (fwd, 1), L) + _op_kernels(cells, MASK_BUILD, 1, (1, 1), 1)
    if run.tiled_mlp:  # DeepSpeed's TiledMLP recomputes each shard's MLP forward in the backward
        out.append(Kernels(L * 3, flops=2 * T * arch.hidden_size * arch.intermediate_size))
    out += _op_kernels(arch.hidden_size, LAYER_OPS["rmsnorm"][run.layer_kernels], T, (1, 1), 1)  # the final norm
    out += _lm_head_kernels(arch, run)
    if frozen and run.adapter.quantization is not None:
        for _parent, fan_in, fan_out in arch.linear_layers().values():
            out.append(Kernels(L * (fwd + 1), bytes=QLORA_DEQUANT_BYTES * fan_in * fan_out))
    return out + autocast_cast_kernels(arch, run) + _sharded_kernels(arch, run)


def autocast_cast_kernels(arch: Architecture, run: RunShape) -> list[Kernels]:
    """The casts of one micro-batch that bf16 autocast makes of fp32 weights (see CAST_BYTES): a full fine-tune whose
    trainable parameters are the fp32 masters (`Precision.autocast_copies`: DDP or one process loaded in fp32); none
    where FSDP's param_dtype or DeepSpeed's 16-bit module hands the matmuls bf16 weights, or in pure bf16. Each
    decoder weight once per forward pass (checkpointing's recomputed forward casts again) and its gradient once back;
    the LM head's weight tile by tile in the forward and the backward. (An adapter's own casts are tiny: not counted;
    a frozen base is cast only if loaded in fp32, which no recipe does.)"""
    if not run.precision.autocast_copies or run.adapter is not None:
        return []
    from launch.memory.constants import TRL_TOKEN_CHUNK, TRL_VOCAB_CHUNK

    L, fwd = arch.num_layers, _passes(arch, run)[0]
    out = []
    for _parent, fan_in, fan_out in arch.linear_layers().values():
        out.append(Kernels(L * (fwd + 1), bytes=CAST_BYTES * fan_in * fan_out))
    T, V, H = run.layout.tokens_per_rank, arch.vocab_size, arch.hidden_size
    vocab_tiles = math.ceil(V / TRL_VOCAB_CHUNK)
    tiles = math.ceil(T / TRL_TOKEN_CHUNK) * vocab_tiles
    out.append(Kernels(2 * tiles, bytes=CAST_BYTES * V * H / vocab_tiles))
    return out


def _lm_head_kernels(arch: Architecture, run: RunShape) -> list[Kernels]:
    """TRL's fused LM head, tile by tile (see LOSS_TILE_BYTES)."""
    from launch.memory.constants import TRL_TOKEN_CHUNK, TRL_VOCAB_CHUNK

    T, V, H = run.layout.tokens_per_rank, arch.vocab_size, arch.hidden_size
    tiles = math.ceil(T / TRL_TOKEN_CHUNK) * math.ceil(V / TRL_VOCAB_CHUNK)
    gemm = 2 * T * V * H / tiles
    cells = T * V / tiles
    gemms = 3 + (1 if adapters.lm_head_trains(arch, run) else 0)  # forward, recomputed, grad hidden, grad weight
    return [Kernels(tiles * gemms, flops=gemm), Kernels(tiles, bytes=cells * LOSS_TILE_BYTES.bytes_fwd),
            Kernels(tiles, bytes=cells * LOSS_TILE_BYTES.bytes_bwd)]


def _sharded_kernels(arch: Architecture, run: RunShape) -> list[Kernels]:
    """FSDP's and ZeRO's per-micro-batch parameter gathers and gradient reductions on this GPU, layer by layer. The
    collectives' own traffic between GPUs is `launch.speed.communication`'s."""
    layout, L = run.layout, arch.num_layers
    P = adapters.trainable_params(arch, run)
    W = layout.shard_group
    if layout.sharding == "fsdp":
        gathers = 2 if run.fsdp_reshard_after_forward else 1
        base = arch.num_params if run.adapter is None else P  # a frozen base is gathered as stored: counted as P
        gather = (FSDP_GATHER[0] * base + FSDP_GATHER[1] * base / W) / L / FSDP_GATHER[2]
        reduce = (FSDP_REDUCE[0] * P + FSDP_REDUCE[1] * P / W) / L / FSDP_REDUCE[2]
        return [Kernels(L * gathers * FSDP_GATHER[2], bytes=gather), Kernels(L * FSDP_REDUCE[2], bytes=reduce)]
    if layout.sharding == "zero":
        nbytes = (2 * ZERO3_GATHER_BYTES * arch.num_params if layout.zero_stage == 3 else 0) + ZERO_REDUCE_BYTES * P
        return [Kernels(L, bytes=nbytes / L)]
    return []


def _step_kernels(arch: Architecture, run: RunShape) -> list[Kernels]:
    """The kernels once per optimizer step: gradient accumulation's adds (micro-batches after the first, one kernel
    per parameter tensor), the optimizer step and gradient clipping (fused, bandwidth-bound). An optimizer in host
    memory steps there: `host_step_bytes`."""
    from launch.memory.terms import param_bytes  # the trained dtype, one source

    layout = run.layout
    P = adapters.trainable_params(arch, run)
    W = layout.shard_group
    local = P / W if layout.sharding in ("fsdp", "zero") else P
    state = param_bytes(run)
    grads = local if layout.sharding == "fsdp" or (layout.sharding == "zero" and layout.zero_stage >= 2) else P
    tensors = arch.num_layers * (2 * len(_wrapped(arch, run)) if run.adapter is not None
                                 else len(arch.linear_layers()) + 2) + 2
    out = []
    if layout.gradient_accumulation_steps > 1:
        out.append(Kernels((layout.gradient_accumulation_steps - 1) * tensors,
                           bytes=ACCUMULATE_ACCESSES * state * grads / tensors))
    optimizer = 0.0
    if layout.sharding == "zero":
        optimizer = 0.0 if layout.offload_optimizer else DEEPSPEED_STEP_BYTES * local
    elif not layout.offload_params:
        optimizer = ADAMW_ACCESSES * state * local
    return out + [Kernels(1, bytes=optimizer + CLIP_ACCESSES * state * grads)]


def host_link_bytes(arch: Architecture, run: RunShape) -> float:
    """Bytes crossing the host link in one optimizer step: offloaded checkpoints out and back per micro-batch;
    offloaded 16-bit parameters in for the forward and the backward; an offloaded optimizer's gradients out and
    parameters back once per step."""
    layout = run.layout
    total = 0.0
    if run.gradient_checkpointing and run.offload_activations:
        hidden = layout.tokens_per_rank * arch.hidden_size * run.act_bytes
        total += 2 * run.checkpointed_layers(arch.num_layers) * hidden * layout.gradient_accumulation_steps
    W = layout.shard_group
    if layout.offload_params:
        total += 2 * 2 * arch.num_params / W * layout.gradient_accumulation_steps
    if layout.offload_optimizer:
        # each micro-batch's bf16 gradient partition down into the host's accumulation buffer and back up for its
        # norm (stage3.py `partition_grads`); the updated bf16 parameters up, unless they live on the host too
        shard = adapters.trainable_params(arch, run) / W
        total += 2 * 2 * shard * layout.gradient_accumulation_steps + (0 if layout.offload_params else 2 * shard)
    return total


def host_step_bytes(arch: Architecture, run: RunShape) -> float:
    """Bytes of host memory the optimizer step moves on the host under optimizer offload (HOST_ADAM_BYTES and its
    neighbours: Adam over the rank's shard, the gradient's conversion, the offloaded parameters' update); 0 without."""
    layout = run.layout
    if not layout.offload_optimizer:
        return 0.0
    per = HOST_ADAM_BYTES + HOST_GRAD_CAST_BYTES + (HOST_PARAM_COPY_BYTES if layout.offload_params else 0)
    return per * adapters.trainable_params(arch, run) / layout.shard_group


def step_kernels(arch: Architecture, run: RunShape) -> list[tuple[Kernels, int]]:
    """Every kernel group of one optimizer step, with how many times it runs in the step (per micro-batch groups
    once per micro-batch)."""
    steps = run.layout.gradient_accumulation_steps
    return [(k, steps) for k in _micro_batch_kernels(arch, run)] + [(k, 1) for k in _step_kernels(arch, run)]


def step_seconds(groups: list[tuple[Kernels, int]], host_bytes: float, peak: float, rates: Rates,
                 host_step: float = 0.0) -> dict:
    """The step's time by part: "matmul" (GEMMs and attention), "memory-bound", "kernel issue", "host link", and
    with an optimizer on the host "host optimizer" (`host_step` bytes at HOST_MEMORY_BYTES_PER_S_PER_GPU)."""
    parts = [0.0, 0.0, 0.0]
    for kernels, times in groups:
        for i, s in enumerate(rates.seconds(kernels, peak)):
            parts[i] += s * times
    out = {"matmul": parts[0], "memory-bound": parts[1], "kernel issue": parts[2],
           "host link": host_bytes / rates.host_link}
    if host_step:
        out["host optimizer"] = host_step / HOST_MEMORY_BYTES_PER_S_PER_GPU
    return out


def rates_for(gpu: gpus.GPU | None) -> Rates:
    """The rates a prediction for `gpu` uses (None: the calibration GPU). Measured on it
    (`calibration.MEASURED_RATES`): its own. Otherwise the calibration GPU's, carried by this rule, the one place it
    is written:
    - matmul and attention fractions of the peak: kept. They say how close the tensor-core kernels (cuBLAS GEMMs,
      cuDNN / flash attention) come to the data sheet's dense peak, which on NVIDIA's data-center parts of the last
      generations sits in one band (large bf16 GEMMs at 70-80% of the peak); the peak itself is the GPU's.
    - memory-bound bandwidth: the calibration GPU's fitted bandwidth x the GPU's memory bandwidth / the calibration
      GPU's (2.46 of 3.35 TB/s on the H100: 73% of the data sheet, kept as that fraction). The memory-bound kernels
      (norms, RoPE, SwiGLU, casts, the optimizer) stream HBM or GDDR at a share of its peak.
    - issue time per kernel: kept. It is eager PyTorch's host-side dispatch and autograd work per op, a CPU cost that
      does not depend on the GPU (a faster GPU waits for it more often).
    - host link (offloaded checkpoints and states): the GPU's own PCIe generation, per direction.
    Not carried: anything measured on the calibration GPU about another GPU's clocks or power limit."""
    gpu = gpu or gpus.CALIBRATION
    measured = calibration.MEASURED_RATES.get(gpu.name)
    if measured is not None:
        return Rates(**measured, host_link=gpu.host_link_bytes_per_s)
    base = Rates(**calibration.MEASURED_RATES[gpus.CALIBRATION_GPU])
    return replace(base, bandwidth=base.bandwidth * gpu.memory_bytes_per_s / gpus.CALIBRATION.memory_bytes_per_s,
                   host_link=gpu.host_link_bytes_per_s)


def predict(arch: Architecture, run: RunShape, peak_flops: float | None = None, rates: Rates | None = None,
            gpu: gpus.GPU | None = None, network_gbps: float = comm.DEFAULT_NETWORK_GBPS) -> StepCost:
    """The predicted step of `run` on one of its GPUs: `gpu` (a row of `launch.facts.gpus`, at its peak and
    `rates_for` it), or one whose dense BF16 peak is `peak_flops` (default: the calibration GPU's) at the calibrated
    rates; `rates` replaces the rates. With more than one process the step adds the communication it waits for
    (`launch.speed.communication`: the GPU's link within a node, `network_gbps` per GPU between nodes); one process
    has none."""
    peak = peak_flops or (gpu.peak_bf16 if gpu else gpus.CALIBRATION_PEAK)
    rates = rates or (rates_for(gpu) if gpu else Rates())
    seconds = step_seconds(step_kernels(arch, run), host_link_bytes(arch, run), peak, rates,
                           host_step_bytes(arch, run))
    found = None
    if comm.collectives(arch, run):
        found = comm.communication(arch, run, compute_windows(arch, run, peak, rates),
                                   comm.Network.of(gpu, network_gbps))
    exposed = found.exposed if found else 0.0
    return StepCost(sum(seconds.values()) + exposed,
                    run.layout.tokens_per_rank * run.layout.gradient_accumulation_steps,
                    seconds, flops_by_convention(arch, run), peak, found, run.real_token_share)


def compute_windows(arch: Architecture, run: RunShape, peak: float, rates: Rates) -> dict:
    """The compute of one micro-batch a collective can hide behind (`launch.speed.communication.exposed`):
    "forward" and "backward" (checkpointing's recomputed forward in it) split by FLOPs, a backward costing two
    forwards; "attention", the attention kernels of every pass."""
    kernels = _micro_batch_kernels(arch, run)
    total = sum(step_seconds([(k, 1) for k in kernels], 0.0, peak, rates).values())
    attention = sum(sum(rates.seconds(k, peak)) for k in kernels if k.attention)
    f = _passes(arch, run)[0]
    return {"forward": total / (f + 2), "backward": total * (f + 1) / (f + 2), "attention": attention}


# ---- calibration --------------------------------------------------------------------------------------------------
def row_run(row: calibration.MeasuredRow, dtype: str | None = None) -> tuple[Architecture, RunShape]:
    """(architecture, run shape) of a measured row: its recipe's configs on the row's process count, synthetic, at
    the row's model, length, batch layout, Liger, checkpointing and load dtype (as the measurement ran it; `dtype`:
    another load dtype, e.g. the recipe's own today)."""
    from launch.facts import hub
    from launch.recipe.discovery import find_recipe

    arch = Architecture.from_config(hub.read_model_config(str(hub.SHIPPED_CONFIGS / row.model)).config)
    recipe = find_recipe(row.recipe)
    training = {**recipe.config, "max_length": row.max_length, "use_liger_kernel": row.liger,
                "per_device_train_batch_size": row.per_device_train_batch_size,
                "gradient_accumulation_steps": row.gradient_accumulation_steps, "synthetic": True,
                # the measured rows ran unpacked: full rows of max_length, causal attention without a mask
                "packing": False, "padding_free": False,
                "dtype": dtype or row.dtype,
                "activation_checkpointing": row.checkpointing == "transformers",
                "activation_checkpointing_kwargs": {"offload": row.offload} if row.checkpointing == "transformers"
                else {}}
    accelerate = {**recipe.accelerate, "num_processes": row.num_processes}
    if fsdp := recipe.accelerate.get("fsdp_config"):
        accelerate["fsdp_config"] = {**fsdp, FSDP_CHECKPOINTING: row.checkpointing == "fsdp",
                                     FSDP_CHECKPOINTING_OFFLOAD: row.checkpointing == "fsdp" and row.offload}
    return arch, RunShape.from_configs(accelerate, training)


def row_errors(rows=None, rates: Rates | None = None) -> list[tuple[calibration.MeasuredRow, StepCost, float]]:
    """(row, prediction, predicted / measured step time - 1) for each measured row."""
    out = []
    for row in rows or calibration.MEASURED_ROWS:
        arch, run = row_run(row)
        cost = predict(arch, run, row.peak_flops, rates)
        out.append((row, cost, cost.step_s / row.step_s - 1))
    return out


def fit(rows=None) -> Rates:
    """The rates that best fit the `fit` rows of `calibration.MEASURED_ROWS` (the matmul fraction and the host link
    stay as measured / specified). The memory-bound bandwidth and the issue time: least squares of log(predicted /
    measured step time) over the rows measured at ordinary lengths, on a grid of 10 GB/s and 0.5 microseconds (the
    precision `launch.facts.calibration` holds them at) around a coarse search. The attention fraction: the long-context
    row, whose step is almost all attention, matched exactly (bisection; 0.01). Alternated until they settle."""
    rows = [r for r in (rows or calibration.MEASURED_ROWS) if r.fit]
    prepared = []
    for row in rows:
        arch, run = row_run(row)
        prepared.append((row, step_kernels(arch, run), host_link_bytes(arch, run), host_step_bytes(arch, run)))
    short = [p for p in prepared if not p[0].long_context]
    long = [p for p in prepared if p[0].long_context]

    def time(p, rates: Rates) -> float:
        return sum(step_seconds(p[1], p[2], p[0].peak_flops or gpus.CALIBRATION_PEAK, rates, p[3]).values())

    def loss(rates: Rates) -> float:
        return sum(math.log(time(p, rates) / p[0].step_s) ** 2 for p in short)

    rates = Rates()
    bw, issue = min(((b * 1e11, i * 5e-6) for b in range(5, 41) for i in range(0, 21)),
                    key=lambda g: loss(replace(rates, bandwidth=g[0], issue_s=g[1])))
    for _ in range(3):
        fine = [(bw + db * 1e10, issue + di * 5e-7) for db in range(-10, 11) for di in range(-10, 11)
                if bw + db * 1e10 > 0 and issue + di * 5e-7 >= 0]
        bw, issue = min(fine, key=lambda g: loss(replace(rates, bandwidth=g[0], issue_s=g[1])))
        rates = replace(rates, bandwidth=round(bw / 1e10) * 1e10, issue_s=round(issue * 2e6) / 2e6)
        if long:
            lo, hi = 0.05, 1.0  # a slower attention (smaller fraction) makes the step longer
            for _ in range(40):
                mid = (lo + hi) / 2
                slow = sum(time(p, replace(rates, attention=mid)) / p[0].step_s for p in long) / len(long) > 1
                lo, hi = (mid, hi) if slow else (lo, mid)
            rates = replace(rates, attention=round((lo + hi) / 2, 2))
    return rates

"""Every constant measured on a GPU, in one place, each with its source beside it: the device memory outside
PyTorch's allocator, the allocator's reserve per strategy (both read by the memory model, `launch.memory`), and the
throughput model's constants (`launch.speed.model`), with the measured rows they come from as data.

Pure data and arithmetic, no I/O: the memory model and the throughput model import it. It imports only the GPU
table (`launch.facts.gpus`: the calibration GPU and its peak).

Where the figures come from: the repository's first GPU run (`H100_2026_11_27`), the one-GPU check
(`benchmarks/gpu/check.py` throughput rows at main e8d8fc4): one process, synthetic inputs (random weights, random
tokens of exactly max_length), 2 warm-up + 6 measured steps, each recipe's own settings (activation checkpointing on;
FSDP's own for fsdp2), SDPA (the dispatcher picked cuDNN in every row). Its machine and every row it measured are in
`RESULTS` (benchmarks/results/h100-2026-11-27.json, and its table in the .md beside it); `MEASURED_ROWS` below holds
the rows the throughput model is fitted to and checked against. A constant measured elsewhere says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from launch.facts import gpus

# The first GPU run's report, in the repository: the machine, its software, and each row as measured.
RESULTS = "benchmarks/results/h100-2026-11-27.json"


@dataclass(frozen=True)
class Source:
    """Where a measured figure comes from: the machine, its driver and software, the date, how it was measured."""

    gpu: str
    driver: str
    software: str
    date: str
    how: str


H100_2026_11_27 = Source(
    gpu="NVIDIA H100 80GB HBM3 (81,559 MiB, 700 W power limit), 16 CPU cores",
    driver="580.159.04, CUDA 13.0, cuDNN 9.19",
    software="torch 2.11.0+cu130 (the machine's own, not the 2.13 pin), accelerate 1.15.0, transformers 5.23.0, "
             "trl 1.16.0, datasets 5.2.0, peft 0.21.2, deepspeed 0.19.8, liger-kernel 0.8.5, Python 3.12.3",
    date="2026-11-27",
    how="benchmarks/gpu/check.py throughput rows (main at e8d8fc4): one process, synthetic inputs, 2 warm-up + 6 "
        "measured steps, each recipe's own settings (activation checkpointing on), SDPA (cuDNN); every row in "
        + RESULTS,
)

# =====================================================================================================================
# Memory: what the driver sees beyond PyTorch's allocated bytes (read by launch/memory/estimate.py)
# =====================================================================================================================
# The device memory in use (the driver's `cudaMemGetInfo` total - free) minus PyTorch's peak reserved bytes, in every
# row of H100_2026_11_27: 1.30 GiB (CUDA context, cuBLAS/cuBLASLt and cuDNN workspaces, kernel images of this stack).
# The planner counted 0.5 GiB before this measurement. One process: NCCL's buffers come on top (not measured here).
CUDA_CONTEXT_GIB = 1.30  # source: H100_2026_11_27 (device in use - peak reserved, every row of RESULTS)

# Peak reserved / peak allocated (torch.cuda.max_memory_reserved / max_memory_allocated), per strategy, without
# `expandable_segments:True` (H100_2026_11_27): DDP and one process 1.03-1.05 (Qwen3-0.6B/1.7B ddp, Qwen3-8B lora),
# FSDP2 1.09-1.12 (Qwen3-1.7B at 2K, Qwen3-4B at 4K). The planner plans the upper end of each range. Keyed by
# `Layout.sharding`.
RESERVED_OVER_ALLOCATED = {"replicated": 1.05, "fsdp": 1.12}  # source: H100_2026_11_27 (the rows of RESULTS)
# Where nothing was measured (DeepSpeed ZeRO; any run with expandable segments): the published bound the planner used
# before -- the Hugging Face Ulysses blog's one-GPU Qwen3-4B ZeRO-3 run peaked at 76.4 GiB allocated on an H100 whose
# capacity is 79.1 GiB, so its reserve was at most (79.1 - 0.5 - 76.4) / 76.4 = 2.9%; 2% planned. Not measured here.
RESERVED_OVER_ALLOCATED_UNMEASURED = 1.02


def reserved_over_allocated(sharding: str, expandable_segments: bool) -> float:
    """The allocator's reserved / allocated ratio the planner plans for a run: measured per strategy without
    expandable segments, else the published bound (`RESERVED_OVER_ALLOCATED_UNMEASURED`)."""
    if expandable_segments:
        return RESERVED_OVER_ALLOCATED_UNMEASURED
    return RESERVED_OVER_ALLOCATED.get(sharding, RESERVED_OVER_ALLOCATED_UNMEASURED)


# =====================================================================================================================
# Throughput (read by launch/speed/model.py)
# =====================================================================================================================
# A bf16 8192 x 8192 x 8192 matmul ran at 775 TFLOP/s on the H100 of H100_2026_11_27 (RESULTS, "matmul"), against
# the calibration GPU's dense peak (launch.facts.gpus): the fraction of the peak a large GEMM reaches, used for every
# matmul and attention FLOP of a step.
MATMUL_FLOPS = 775e12  # source: H100_2026_11_27
MATMUL_FRACTION_OF_PEAK = MATMUL_FLOPS / gpus.CALIBRATION_PEAK

# Fitted by `throughput_model.fit` (the rest of the model is counted, not fitted), to the FIT rows of MEASURED_ROWS
# below: the bandwidth the memory-bound kernels reach (bytes/s; the H100 SXM's HBM3 peak is 3.35 TB/s) and the floor
# under every kernel's time, what it costs to issue one (eager PyTorch's per-op dispatch and autograd bookkeeping on
# the host, which the GPU waits for when a kernel is shorter), together, by least squares over the H100 rows; and the
# fraction of the peak the attention kernel reaches (cuDNN SDPA, forward and backward; under ring CP its K/V exchange
# included), from the published long-context row, whose step is almost all attention. tests/test_fastest.py
# re-fits them and fails when these values are not what the rows give.
# Source of the three: fitted to MEASURED_ROWS (H100_2026_11_27; TRL_LONG_CONTEXT for the attention fraction).
MEMORY_BOUND_BYTES_PER_S = 2.46e12
KERNEL_ISSUE_S = 54.5e-6
ATTENTION_FRACTION_OF_PEAK = 0.46

# The rates above as measured, by the GPU they were measured on (a row of `launch.facts.gpus.GPUS`): a GPU with its
# own entry uses its own; another carries the calibration GPU's by the rule of `launch.speed.model.rates_for`. A new
# GPU's measured rows (MEASURED_ROWS, each naming its GPU) re-fitted by `throughput_model.fit` are one entry more.
MEASURED_RATES = {
    gpus.CALIBRATION_GPU: {"matmul": MATMUL_FRACTION_OF_PEAK, "attention": ATTENTION_FRACTION_OF_PEAK,
                           "bandwidth": MEMORY_BOUND_BYTES_PER_S, "issue_s": KERNEL_ISSUE_S},
}

# The host link of an H100 SXM: PCIe Gen5 x16, 64 GB/s per direction (NVIDIA H100 data sheet,
# https://www.nvidia.com/en-us/data-center/h100/). NOT measured here: the time of offloaded checkpoints and states
# crossing it is a lower bound.
HOST_LINK_BYTES_PER_S = 64e9


# Published, not measured here: TRL's long-context guide, added by TRL PR #6846
# (https://github.com/huggingface/trl/pull/6846; TRL v1.13.0's release notes): Qwen3-8B at 1,048,576 tokens,
# ring-attention CP over 8 x H100 80GB on FSDP2, YaRN, checkpoints offloaded, cuDNN SDPA: 373 s/step at 34.7% MFU
# (causal-discounted); 380 s/step in the PR.
TRL_LONG_CONTEXT = Source(
    gpu="8 x NVIDIA H100 80GB (TRL's)", driver="not published", software="TRL (PR #6846), transformers >= 5.16, "
    "cuDNN SDPA", date="2026", how="TRL's long-context guide: the Qwen3-8B 1M-token run, 373 s/step at 34.7% MFU")


@dataclass(frozen=True)
class MeasuredRow:
    """One throughput row of a GPU measurement: the run (recipe, model, length, Liger, batch layout) and its median
    step time. `fit`: the row the calibrated constant was fitted to; the others were kept back to check the model."""

    model: str  # a folder of docs/model_configs
    recipe: str
    max_length: int
    liger: bool
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    step_s: float  # median step time
    tokens_per_s_per_gpu: float
    fit: bool
    source: Source
    checkpointing: str = "transformers"  # who checkpointed every layer: transformers' or FSDP's own ("fsdp")
    offload: bool = False  # the checkpoints offloaded to host memory
    num_processes: int = 1
    long_context: bool = False  # the row the attention fraction is fitted to
    peak_flops: float | None = None  # the GPU's dense BF16 peak; None: the calibration GPU's (launch.facts.gpus)
    gpu: str = gpus.CALIBRATION_GPU  # the GPU it was measured on: a row of launch.facts.gpus.GPUS
    # peak memory of the row, GiB: torch's max allocated and max reserved, and the driver's device memory in use
    memory_gib: tuple[float, float, float] | None = None
    note: str = ""
    # the load dtype the row ran with: every recipe then loaded bf16 (the ddp rows trained pure bf16, before the
    # recipes' fp32 masters)
    dtype: str = "bfloat16"


MEASURED_ROWS = (
    MeasuredRow("Qwen--Qwen3-0.6B", "ddp", 2048, False, 4, 1, 0.278, 29_519, True, H100_2026_11_27,
                memory_gib=(5.15, 5.40, 6.70)),
    MeasuredRow("Qwen--Qwen3-1.7B", "ddp", 2048, False, 4, 1, 0.388, 21_120, True, H100_2026_11_27,
                memory_gib=(13.93, 14.64, 15.94)),
    MeasuredRow("Qwen--Qwen3-1.7B", "ddp", 2048, True, 4, 1, 0.250, 32_835, True, H100_2026_11_27,
                memory_gib=(13.56, 14.06, 15.36)),
    MeasuredRow("Qwen--Qwen3-1.7B", "fsdp2", 2048, False, 2, 1, 0.311, 13_190, True, H100_2026_11_27, "fsdp",
                memory_gib=(26.87, 30.02, 31.33)),
    MeasuredRow("Qwen--Qwen3-4B", "fsdp2", 4096, False, 2, 1, 0.935, 8_764, True, H100_2026_11_27, "fsdp",
                memory_gib=(62.07, 67.52, 68.83)),
    MeasuredRow("Qwen--Qwen3-8B", "lora", 4096, False, 2, 2, 2.974, 5_508, True, H100_2026_11_27,
                memory_gib=(21.45, 21.82, 23.12)),
    MeasuredRow("Qwen--Qwen3-8B", "ring-cp-8gpu", 1_048_576, False, 1, 1, 373.0, 1_048_576 / 373.0 / 8, True,
                TRL_LONG_CONTEXT, offload=True, num_processes=8, long_context=True),
    # Kept back from the table (RESULTS, "kept_back"): +26% tokens/s with Liger in the measurement's notes, 6,959
    # tokens/s: a check of the model, not fitted. Its step time is tokens per step / tokens per second.
    MeasuredRow("Qwen--Qwen3-8B", "lora", 4096, True, 2, 2, 16_384 / 6_959, 6_959, False, H100_2026_11_27,
                note="kept back; tokens/s as measured (6,959), the step time derived from it"),
)

# The throughput model's error band: the smallest and the largest leave-one-out error over MEASURED_ROWS (each row
# predicted by the rates refitted without it, `launch.speed.error_band`; error = predicted / measured tokens/s - 1):
# the Qwen3-8B Liger LoRA row kept back (-8.6%) and Qwen3-0.6B ddp (+13.0%). Kept here like the fitted rates, since
# recomputing it takes six refits (seconds) that every plan would pay; tests/test_error_band.py recomputes it.
ERROR_BAND = (-0.0858, 0.1301)

"""The memory model's units and stated constants: the global overhead model, the CPU-mode baselines, the
capacities and kernel tile shapes the terms use. Each constant says where its value comes from."""

from __future__ import annotations

import math

from launch.facts.gpus import H100_80GB_TORCH_GIB

GIB = 2**30
F32 = 4  # bytes of an fp32 element

# ---- the overhead model (device memory outside PyTorch's allocated bytes) ------------------------------------------
# The GPU-measured parts live in launch/facts/calibration.py with their source: the CUDA context and workspaces
# (`CUDA_CONTEXT_GIB`, what the driver sees beyond PyTorch's reserved bytes) and the caching allocator's reserve
# (`reserved_over_allocated`: reserved / allocated per strategy, fragmentation). Not measured, stated:
# NCCL_GIB: NCCL's communicator buffers (cudaMalloc'ed by NCCL itself, so also outside PyTorch's accounting) in a
#   distributed run: NCCL_BUFFSIZE 4 MiB x channels x peers for the ring/tree protocols of one node, PER COMMUNICATOR
#   (a 2-D mesh makes one per dimension and a flattened one: `terms.nccl_communicators`). Stated, not fitted.
NCCL_GIB = 0.5

# CPU mode: the resident set of a process before any model exists (python + torch + transformers + accelerate +
# deepspeed + trl with SFTTrainer imported). MEASURED on this repository's CPU environment (torch 2.13 CPU,
# transformers 5.23, accelerate 1.15, deepspeed 0.19.8, trl 1.16, Python 3.11): VmRSS after the imports = 0.44 GiB
# (`measure_cpu_runtime_baseline_gib()` re-measures it; tests/test_memory.py runs it when MEMORY_MEASURE=1).
CPU_RUNTIME_BASELINE_GIB = 0.44
# CPU mode: what a training process holds beyond those imports and its model terms -- the Trainer and Accelerator,
# the gloo process group, the dataset and collator, trackio's run. MEASURED: peak RSS per process of
# `python -m launch ddp --smoke --cpu --bench` (2 processes, the 82K-parameter smoke model, so the model terms are
# < 0.01 GiB) = 0.55 GiB, minus the import baseline (0.44-0.49 GiB re-measured on the same machine): 0.06-0.11 GiB.
# Re-measure: run that command and subtract; its "peak RSS per process" row then reads a ratio of about 1. The
# zero3 smoke run peaks alike (0.55 GiB), so under DeepSpeed CPU_DEEPSPEED_ENGINE_GIB is taken to include it.
CPU_TRAINER_RUNTIME_GIB = 0.1
# CPU mode with DeepSpeed: what a ZeRO engine adds to a process beyond its model states (communication groups, the
# optimizer wrapper, thread pools). MEASURED with a bare engine (one gloo process, a 0.5M-parameter model, ZeRO-2 and
# ZeRO-3, default 5e8-element buckets): VmRSS after `deepspeed.initialize` and two steps minus before it =
# 0.14-0.16 GiB (`measure_cpu_deepspeed_engine_gib()`). Note: the untouched pages of the 5e8-element bucket add
# nothing to the RSS (a 2 GB `torch.empty` is virtual until written).
CPU_DEEPSPEED_ENGINE_GIB = 0.15

# Usable capacity of the GPU the calibration ran on, as PyTorch reports it (its owner: launch.facts.gpus, the table
# of GPU models). Callers pass their own budget; this is a convenience.
H100_80GB_GIB = H100_80GB_TORCH_GIB

# TRL 1.16 `trl/kernels/chunked_logprob.py` and `trl/trainer/utils.py`: the fused LM head's tile shape
TRL_TOKEN_CHUNK = 4096  # TOKEN_CHUNK_SIZE
TRL_VOCAB_CHUNK = 32768  # _CHUNKED_LOGPROB_CHUNK_SIZE

# Liger kernels index [tokens, hidden] tensors with 32-bit offsets: Liger-Kernel #803
# (https://github.com/linkedin/Liger-Kernel/issues/803; ALST's author: RMSNorm crashes with "illegal memory access"
# once tokens x hidden reaches 2**31; ArcticTraining's run-h100-sp1-llama-8b.yml notes the crash at max_length 555000).
# A kernel limit, not a memory limit; `longest_length` honours it by default.
INT32_ELEMENTS = 2**31

LOSSES = ("fused_chunked", "full_logits", "liger_flce")


def gib(nbytes: float) -> float:
    return nbytes / GIB


def pow2(n: float) -> int:
    """Next power of two >= n (PyTorch's pinned host allocator rounds every block this way)."""
    n = int(math.ceil(n))
    return 1 if n <= 1 else 1 << (n - 1).bit_length()

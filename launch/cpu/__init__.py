"""Everything that exists only so that the real distributed path runs on CPU (gloo, no CUDA kernels).

`train.py` imports this package only when `use_cpu` is set; nothing on the GPU path imports it. Each workaround
lives in its own module, names the upstream behaviour it works around, and has a test:
- fsdp: an FSDP2 Accelerate config (plain, HSDP or under CP) really shards under MULTI_CPU, as it does on GPUs
  (tests/test_cpu_fsdp.py);
- context_parallel: ring-attention CP through Accelerate + FSDP2 with a CPU SDPA kernel
  (tests/test_cpu_cp_attention.py);
- gloo_alltoall: torch.distributed.nn's all-to-all inside a subgroup on gloo, for 2D SP
  (tests/test_cpu_gloo_alltoall.py);
- gloo_exit: a rank aborting at interpreter exit after a successful run (tests/test_cpu_cp_attention.py uses it);
- activation_offload: TRL's activation offloader built for a machine without an accelerator (tests/test_alst_tiling.py);
- pinned_offload: transformers' checkpoint offload (`activation_checkpointing_kwargs: {offload: true}`) without pinned
  memory (tests/test_offload.py);
- deepspeed_shm: DeepSpeed's inference-only shared-memory all-reduce op not compiled at the start of a DeepSpeed run
  (minutes of silence on a first run; tests/test_cpu_deepspeed_shm.py);
- deepspeed_build: DeepSpeed's CPU op cpu_adam (the optimizer offload's) compiled as one translation unit without
  debug information: 35 s of CPU at its first run instead of about two minutes (tests/test_cpu_deepspeed_build.py);
- fast_exit: a rank's interpreter teardown without the garbage collector's passes over every object (1.3 CPU-s per
  process of a run that trains for under a second; tests/test_cpu_fast_exit.py);
- portable_bf16: a bf16 CPU run (QLoRA) computes bit for bit alike on every x86-64-v3 CPU: oneDNN off in the ranks,
  ATen's AVX2 kernels and MKL's compatible branch through the ranks' environment (tests/test_cpu_portable_bf16.py).
"""


def enable_cpu_path(training_args) -> None:
    """Apply the CPU-only workarounds. Each is inert unless its layout (FSDP2, CP, SP subgroups) is in use."""
    from launch.cpu import (activation_offload, context_parallel, deepspeed_build, deepspeed_shm, fast_exit, fsdp,
                            gloo_alltoall, gloo_exit, pinned_offload, portable_bf16)

    portable_bf16.apply()  # first: before any bf16 matmul (only where the launcher pinned the run)
    deepspeed_shm.skip_build()
    deepspeed_build.drop_debug_info()
    deepspeed_build.one_translation_unit()
    fsdp.enable()
    context_parallel.enable()
    gloo_alltoall.install()
    gloo_exit.let_gloo_workers_finish_at_exit()
    fast_exit.skip_collection_at_exit()
    if getattr(training_args, "activation_offloading", False):
        activation_offload.install()
    if (getattr(training_args, "activation_checkpointing_kwargs", None) or {}).get("offload"):
        pinned_offload.install()

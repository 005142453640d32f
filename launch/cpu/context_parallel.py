"""Ring-attention context parallelism (Accelerate `cp_size > 1`, `cp_backend="torch"`) on CPU over gloo.

The CP machinery stays upstream: Accelerate builds the cp device mesh, shards the model with FSDP2 over it and
enters torch's `context_parallel()` every step; the Trainer shards input_ids/labels/position_ids (torch's head-tail
load balancer reorders them first) and rescales the loss across the cp ranks; torch's `_templated_ring_attention`
and `_templated_ring_attention_backward` rotate K/V (allgather or alltoall) and merge the partial results. Two
upstream behaviours stop that path on a machine without CUDA; `enable()` works around them (the gloo exit crash
that CP runs hit too is handled for every CPU run in launch/cpu/gloo_exit.py):

1. accelerate/state.py, `AcceleratorState.__init__`: the branch that turns a requested FSDP plugin (or
   `cp_size > 1`) into `DistributedType.FSDP` runs only for GPU-like distributed types (MULTI_GPU, MULTI_XPU, ...).
   Under `use_cpu` the state stays `MULTI_CPU`, FSDP is silently dropped, and accelerate/parallelism_config.py
   `ParallelismConfig._validate_accelerator` refuses the config ("ParallelismConfig is only compatible
   DistributedType.FSDP (version 2) ... but got DistributedType.MULTI_CPU"). launch/cpu/fsdp.py runs the same
   promotion, with upstream's own checks and messages, for MULTI_CPU: for CP as for every FSDP2 run.

2. torch/distributed/tensor/experimental/_context_parallel/_attention.py, `_sdpa_handler` (the DTensor handler that
   `context_parallel()` installs for SDPA): it maps only the CUDA flash, efficient and cuDNN SDPA ops to the ring
   routines. On CPU, SDPA dispatches to `aten._scaled_dot_product_flash_attention_for_cpu`, which has no handler
   ("... does not have a sharding strategy registered"). We add that op and its backward to the module's
   `custom_ops` table, which torch merges into the DTensor dispatcher only while `context_parallel()` is active,
   and hand them to torch's own ring routines with the CPU flash kernel as the per-block op. That kernel returns
   the logsumexp the ring merge needs, takes grouped-query K/V as is, and has the CUDA flash op's argument names,
   so the ring code (causal skip/partial blocks of the load-balanced layout, LSE merge, gradient rotation) runs
   unchanged.

Imported only from `launch.cpu.enable_cpu_path`, i.e. only for `use_cpu` runs; nothing on the GPU path imports it.
Workaround 2 is inert unless context parallelism is configured; workaround 1 acts for any FSDP2 config.
"""

from __future__ import annotations

import torch

from launch.cpu import fsdp

_SEQ_DIM = 2  # torch's SDPA ring routines hard-code the sequence dim of (batch, heads, seq, head_dim)
_enabled = False


def enable() -> None:
    """Apply the CPU-only workarounds for ring-attention CP (idempotent)."""
    global _enabled
    if not _enabled:
        fsdp.enable()  # workaround 1, shared with every FSDP2 run on CPU
        register_cpu_ring_attention()
        _enabled = True


# --------------------------------------------------------------------------------------------------------------
# 2. torch: CPU flash SDPA -> torch's ring attention
# --------------------------------------------------------------------------------------------------------------


def register_cpu_ring_attention() -> None:
    """Add the CPU SDPA ops to torch's CP handler table (used only while `context_parallel()` is active)."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

    aten = torch.ops.aten
    for op in (
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    ):
        cp_attention.custom_ops[op] = _cpu_ring_sdpa_handler


def _bind(op_call, args, kwargs) -> dict:
    """The op's arguments by name, defaults filled in."""
    schema_args = op_call._schema.arguments
    bound = {a.name: a.default_value for a in schema_args if a.has_default_value()}
    bound.update(zip((a.name for a in schema_args), args))
    bound.update(kwargs)
    return bound


def _local_shard(name: str, tensor, mesh):
    """The local shard of an SDPA operand laid out as `context_parallel()` lays them out: Shard(2) on a 1-D mesh."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(tensor, DTensor):
        raise AssertionError(f"CPU ring attention: `{name}` is not a DTensor")
    if tuple(tensor.placements) != (Shard(_SEQ_DIM),) or tensor.device_mesh.ndim != 1:
        raise AssertionError(f"CPU ring attention: `{name}` has placements {tensor.placements}, expected (Shard(2),)")
    if mesh is not None and tensor.device_mesh != mesh:
        raise AssertionError(f"CPU ring attention: `{name}` lives on another device mesh")
    return tensor._local_tensor, tensor.device_mesh


def _cpu_ring_sdpa_handler(op_call, args, kwargs):
    """Like torch's `_sdpa_handler`, for the CPU flash op: unwrap the shards, run torch's ring routine, rewrap."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

    aten = torch.ops.aten
    bound = _bind(op_call, args, kwargs)
    if bound.get("attn_mask") is not None:
        raise NotImplementedError("attn_mask is not supported with context parallelism (causal attention only)")
    backward = op_call == aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    names = ("grad_out", "query", "key", "value", "out", "logsumexp") if backward else ("query", "key", "value")
    mesh, local = None, {}
    for name in names:
        local[name], mesh = _local_shard(name, bound[name], mesh)
    options = dict(is_causal=bound["is_causal"], dropout_p=bound["dropout_p"], scale=bound["scale"])

    if backward:
        results = cp_attention._templated_ring_attention_backward(
            mesh.get_group(), _SEQ_DIM, op_call, grad_out_name="grad_out", **local, **options
        )
    else:
        results = cp_attention._templated_ring_attention(mesh.get_group(), _SEQ_DIM, op_call, **local, **options)
    # Every output (out, logsumexp / grad_query, grad_key, grad_value) is sharded on the sequence dim, as upstream.
    return tuple(DTensor.from_local(r, mesh, [Shard(_SEQ_DIM)], run_check=False) for r in results)

"""Gloo only: the differentiable all-to-all of `torch.distributed.nn` inside a process subgroup.

PyTorch behaviour worked around (torch 2.13, `torch/distributed/nn/functional.py`, `_AlltoAll.forward`): on gloo,
which has no all-to-all for this path, the all-to-all is emulated with one `dist.scatter` per group member, and the
member's *group-local* index `i` is passed as `src`, which `dist.scatter` reads as a *global* rank. Inside a
subgroup that does not hold global ranks 0..n-1 in that order, this raises "Global rank 0 is not part of group"
(or scatters from the wrong process). NCCL takes the `dist.all_to_all` branch and is not affected.

Who hits it: the backward of `torch.distributed.nn.functional.all_gather` on gloo runs this all-to-all. transformers'
`deepspeed_sp_compute_loss` all-gathers the per-rank losses across the sequence-parallel group, so any layout with
more than one SP group (sp 2 x dp 2 on 4 processes: groups [0, 1] and [2, 3]) fails in the first backward on CPU.

The fix: the same scatter loop with the group-relative `group_src=i`. It replaces `_AlltoAll.forward` and hands
every non-gloo group straight back to PyTorch's own forward; it is installed only from `enable_cpu_path`.
Tested by tests/test_cpu_gloo_alltoall.py.
"""

import torch.distributed as dist
from torch.distributed.nn import functional as dist_nn

_PYTORCH_FORWARD = dist_nn._AlltoAll.forward


def _alltoall_forward(ctx, group, out_tensor_list, *tensors):
    if dist.get_backend(group=group) != dist.Backend.GLOO:
        return _PYTORCH_FORWARD(ctx, group, out_tensor_list, *tensors)
    # As PyTorch's gloo branch, except `group_src=i` (a rank within `group`) instead of the positional global `src`.
    ctx.group = group
    ctx.input_tensor_size_list = [tensors[i].size() for i in range(dist.get_world_size(group=group))]
    my_rank = dist.get_rank(group=group)
    tensors = tuple(t.contiguous() for t in tensors)
    for i in range(dist.get_world_size(group=group)):
        dist.scatter(out_tensor_list[i], list(tensors) if i == my_rank else None, group=group, group_src=i)
    return tuple(out_tensor_list)


def install() -> None:
    """Route `torch.distributed.nn`'s all-to-all on gloo through `_alltoall_forward`. Idempotent."""
    dist_nn._AlltoAll.forward = staticmethod(_alltoall_forward)

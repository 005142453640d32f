"""launch/cpu/gloo_alltoall.py: the differentiable all-gather's backward inside gloo subgroups.

Four gloo processes form two groups, [0, 1] and [2, 3], the sequence-parallel groups of sp 2 x dp 2. Each rank
all-gathers a tensor with `torch.distributed.nn.functional.all_gather` (what transformers' `deepspeed_sp_compute_loss`
does with the per-rank losses) and back-propagates a weighted sum, whose gradient is known in closed form.
"""

import os
import traceback

import pytest
import torch
import torch.multiprocessing as mp

from helpers.launcher import free_port

WORLD_SIZE = 4
GROUP_SIZE = 2


def _worker(rank: int, port: int, install_fix: bool, results) -> None:
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_nn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        if install_fix:
            from launch.cpu import gloo_alltoall

            gloo_alltoall.install()
        groups = [dist.new_group(list(range(g, g + GROUP_SIZE))) for g in range(0, WORLD_SIZE, GROUP_SIZE)]
        group = groups[rank // GROUP_SIZE]
        x = torch.full((3,), float(rank + 1), requires_grad=True)
        gathered = dist_nn.all_gather(x * 2, group=group)
        # member j's tensor is weighted by (j + 1); each member receives the sum over the group of its own share
        loss = sum((j + 1) * t.sum() for j, t in enumerate(gathered))
        loss.backward()
        results[rank] = ("ok", torch.stack(gathered).tolist(), x.grad.tolist())
    except Exception as e:  # reported to the test process, which asserts on it
        results[rank] = ("error", f"{type(e).__name__}: {e}", traceback.format_exc())
    finally:
        dist.destroy_process_group()


def _run(install_fix: bool) -> dict:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        port = free_port()
        procs = [ctx.Process(target=_worker, args=(r, port, install_fix, results)) for r in range(WORLD_SIZE)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        for p in procs:
            if p.is_alive():  # a rank waiting on a peer that failed
                p.kill()
                p.join()
        return dict(results)


@pytest.mark.long
def test_differentiable_all_gather_backward_in_subgroups_on_gloo():
    results = _run(install_fix=True)
    assert sorted(results) == list(range(WORLD_SIZE)), results
    for rank in range(WORLD_SIZE):
        status, gathered, grad = results[rank]
        assert status == "ok", f"rank {rank}: {gathered}\n{grad}"
        first = rank // GROUP_SIZE * GROUP_SIZE
        expected = [[2.0 * (first + j + 1)] * 3 for j in range(GROUP_SIZE)]
        torch.testing.assert_close(torch.tensor(gathered), torch.tensor(expected))
        # d loss / d x = 2 * sum over the group's members of (own index + 1): every member back-propagates
        # the same weighted sum, so rank's gradient is GROUP_SIZE copies of its weight, times 2
        member = rank % GROUP_SIZE
        torch.testing.assert_close(torch.tensor(grad), torch.full((3,), 2.0 * GROUP_SIZE * (member + 1)))


@pytest.mark.long
def test_pytorch_still_needs_the_fix():
    """When this fails, PyTorch's gloo all-to-all handles subgroups itself: drop launch/cpu/gloo_alltoall.py."""
    results = _run(install_fix=False)
    errors = [r[1] for r in results.values() if r[0] == "error"]
    assert any("Global rank 0 is not part of group" in e for e in errors), results


if __name__ == "__main__":
    pytest.main([__file__, "-v"])

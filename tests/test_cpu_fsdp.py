"""FSDP2 really shards on CPU (launch/cpu/fsdp.py): each rank holds 1/N of every parameter and of its Adam state.

Four gloo processes build Accelerate's state the way `accelerate launch` + train.py do (`use_cpu`): the
ACCELERATE_* / FSDP_* / PARALLELISM_CONFIG_* environment comes from Accelerate's own launcher code applied to our
YAML files, then `Accelerator(cpu=True)` prepares a small Qwen3 model and AdamW and takes one optimizer step.
Read back from the DTensors: their mesh, their placements and the size of each rank's local shard.

- accelerate_configs/fsdp2.yaml on 4 processes: every parameter is Shard(0) over a mesh of 4, its local shard 1/4
  of dim 0, and Adam's exp_avg / exp_avg_sq are sharded alike;
- accelerate_configs/fsdp2_multinode.yaml as the fsdp2-70b smoke profile runs it (HSDP, dp_replicate 2 x
  dp_shard 2): placements (Replicate(), Shard(0)), local shard 1/2, the two replicas equal;
- upstream alone (no patch): the state stays MULTI_CPU and every parameter is a full plain tensor, i.e. the
  smoke profile would train unsharded and still pass its metrics. If that case fails, Accelerate shards on CPU
  itself: drop launch/cpu/fsdp.py.
"""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from helpers.launcher import REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.long]  # four processes, three Accelerator set-ups: ~60 s on 2 busy cores

WORLD = 4
# dims divisible by 4: every shard of dim 0 is exactly 1/4 (FSDP2 pads uneven shards; here none are uneven)
MODEL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=False)
CASES = {
    "fsdp2": ("accelerate_configs/fsdp2.yaml", {}),
    "hsdp": ("accelerate_configs/fsdp2_multinode.yaml", {"dp_replicate": 2, "dp_shard": 2}),
}


def launch_env(config_file: str, mesh: dict) -> dict[str, str]:
    """The variables `accelerate launch --config_file F --num_processes 4 --mixed_precision no [--parallelism_config_*]`
    sets for the training processes (accelerate's own `prepare_multi_gpu_env`, as for an FSDP config)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    argv = ["--config_file", str(REPO / config_file), "--num_processes", str(WORLD), "--num_machines", "1",
            "--mixed_precision", "no", "--main_process_port", "29500"]
    for name, size in mesh.items():
        argv += [f"--parallelism_config_{name}_size", str(size)]
    args, _defaults, _mp = _validate_launch_command(launch_command_parser().parse_args([*argv, "train.py"]))
    assert args.use_fsdp and not args.cpu, f"{config_file} is not launched as FSDP"
    env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))}


def _measure() -> dict:
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from torch.distributed.tensor import DTensor
    from transformers import Qwen3Config, Qwen3ForCausalLM

    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)  # the same full weights on every rank (rank 0's are broadcast anyway)
    model = Qwen3ForCausalLM(Qwen3Config(**MODEL))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    ids = torch.randint(0, MODEL["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    accelerator.backward(loss)
    optimizer.step()

    params, states = {}, {}
    for name, p in model.named_parameters():
        name = name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")
        if isinstance(p, DTensor):
            params[name] = dict(placements=[repr(x) for x in p.placements], mesh=list(p.device_mesh.shape),
                                local=list(p.to_local().shape), full=list(p.shape), checksum=p.to_local().sum().item())
        else:
            params[name] = dict(placements=None, local=list(p.shape), full=list(p.shape))
        state = optimizer.state[p]
        for key in ("exp_avg", "exp_avg_sq"):
            t = state[key]
            states[f"{name}.{key}"] = list((t.to_local() if isinstance(t, DTensor) else t).shape)
    return dict(distributed_type=str(accelerator.distributed_type), params=params, states=states)


def _worker(rank: int, port: int, envs: dict, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    from launch.cpu import fsdp, gloo_exit

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    gloo_exit.let_gloo_workers_finish_at_exit()
    results = {}
    keys = [k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))]
    for case, env in envs.items():  # "upstream" first: before the patch is installed
        for k in keys + list(env):
            os.environ.pop(k, None)
        os.environ.update(env)
        if case != "upstream":
            fsdp.enable()
        try:
            results[case] = _measure()
        except Exception as e:  # noqa: BLE001 - reported by the test of this case, with the others still measured
            results[case] = dict(error=f"{type(e).__name__}: {e}")
        dist.barrier()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> list[dict]:
    import torch.multiprocessing as mp

    envs = {"upstream": launch_env(*CASES["fsdp2"])}
    envs.update({case: launch_env(*spec) for case, spec in CASES.items()})
    out_dir = tmp_path_factory.mktemp("cpu_fsdp")
    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed"])
    mp.start_processes(_worker, args=(free_port(), envs, str(out_dir)), nprocs=WORLD, join=True,
                       start_method="forkserver")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("case,shards,placements", [
    ("fsdp2", 4, ["Shard(dim=0)"]),
    ("hsdp", 2, ["Replicate()", "Shard(dim=0)"]),
])
def test_each_rank_holds_one_shard_of_every_parameter(measured, case, shards, placements):
    for rank, results in enumerate(measured):
        r = results[case]
        assert "error" not in r, r.get("error")
        assert r["distributed_type"] == "DistributedType.FSDP", (case, rank)
        assert r["params"], "no parameters measured"
        for name, p in r["params"].items():
            assert p["placements"] == placements, (case, rank, name, p)
            assert p["mesh"] == ([WORLD] if case == "fsdp2" else [2, 2]), (case, name, p)
            # 1/N of dim 0, the other dims whole
            assert p["local"] == [p["full"][0] // shards, *p["full"][1:]], (case, rank, name, p)
            for key in ("exp_avg", "exp_avg_sq"):
                assert r["states"][f"{name}.{key}"] == p["local"], (case, rank, name, key)
    # shards differ across the shard group (each rank a different slice); under HSDP the two copies are equal
    name = "model.embed_tokens.weight"
    sums = [results[case]["params"][name]["checksum"] for results in measured]
    if case == "fsdp2":
        assert len({round(s, 4) for s in sums}) == WORLD, sums
    else:  # ranks (0, 1) and (2, 3) are the two replicas; within each, the two shards differ
        assert sums[0] == pytest.approx(sums[2], abs=1e-5) and sums[1] == pytest.approx(sums[3], abs=1e-5)
        assert sums[0] != pytest.approx(sums[1], abs=1e-5)


def test_upstream_alone_trains_unsharded_on_cpu(measured):
    """What launch/cpu/fsdp.py exists for: without it the FSDP config silently trains full replicas."""
    for results in measured:
        r = results["upstream"]
        assert r["distributed_type"] == "DistributedType.MULTI_CPU"
        assert all(p["placements"] is None and p["local"] == p["full"] for p in r["params"].values())

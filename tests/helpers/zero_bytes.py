"""Per-rank bytes of ZeRO state, measured in a real multi-process CPU (gloo) DeepSpeed run.

Used by tests/test_zero_sharding.py; also runnable by hand (prints the measurements as JSON):

    python tests/helpers/zero_bytes.py zero1 zero2 zero3 zero3_offload   (JSON after a marker line)

How the engine is built: the way `accelerate launch --config_file accelerate_configs/<name>.yaml --num_processes N
--mixed_precision no` + train.py (`use_cpu=True`), i.e. `python -m launch <recipe> --cpu`, builds it. The ACCELERATE_*
environment comes from Accelerate's own launcher code (`_validate_launch_command` + `prepare_deepspeed_cmd_env`)
applied to our YAML file, so the ZeRO stage and offload settings are exactly what a recipe gets. Then, as the Trainer
does with `use_cpu=True`: `PartialState(cpu=True)` (CPU device, gloo) and `Accelerator()`, which builds its
DeepSpeedPlugin from that environment; the smoke model is loaded with `from_pretrained` (under `zero.Init` for
stage 3, as `zero3_init_flag` asks) and `accelerator.prepare` builds the DeepSpeed engine around torch AdamW (the
Trainer's two parameter groups; with optimizer offload Accelerate swaps in DeepSpeedCPUAdam, as for the Trainer).
One real optimizer step follows, over GRAD_ACCUM micro-batches of PER_DEVICE_BATCH smoke chat examples per rank.

To pay the process start-up cost (importing torch, transformers and deepspeed takes seconds) once, each of the N
processes runs all the requested configurations one after the other, resetting Accelerate's state in between.

What is measured, per rank, from DeepSpeed's own data structures (bytes of the distinct storages, so a small view
into a big buffer counts the whole buffer):
  - optimizer: the fp32 master partition(s) the inner optimizer steps (`single_partition_of_fp32_groups` for
    stage 1/2, `fp32_partitioned_groups_flat` for stage 3) and their Adam state (`exp_avg`, `exp_avg_sq`) after the
    step;
  - gradients (`grad_bytes`), split by where they live: `param_grads` (every parameter's `.grad` / `.grad_accum`),
    `zero_buffers` (ZeRO's partition buffers: `averaged_gradients`, `all_grad_tensors`, `grads_in_partition` for
    stage 1/2, `grad_partitions_flat_buffer` for stage 3) and `master_grads` (the fp32 partitions' `.grad`, where
    optimizer offload copies the gradients). Taken after `accelerator.backward` of the first micro-batch (a
    non-boundary micro-step: what is held between micro-batches) and right before the optimizer step;
    `grads_after_autograd` (before ZeRO's reduction epilogue) is diagnostic only: it includes the in-flight reduce
    bucket, which is DeepSpeed's default reduce_bucket_size (5e8 elements) since our configs leave it unset;
  - parameters, after the step: every module parameter's `.data` and, for stage 3, its partition `ds_tensor`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from common import OFFLINE_ENV, free_port  # noqa: E402 (this folder is on sys.path)

REPO = Path(__file__).resolve().parents[2]
# name: (accelerate config, overrides of its zero_optimization section, applied on top of what Accelerate builds)
CONFIGS = {
    "zero1": ("accelerate_configs/zero1.yaml", {}),
    "zero2": ("accelerate_configs/zero2.yaml", {}),
    "zero3": ("accelerate_configs/zero3.yaml", {}),
    # zero3.yaml with DeepSpeed's stage3_param_persistence_threshold (default 1e5 elements) at 0: every smoke-model
    # tensor is below 1e5 elements, so with the default ZeRO-3 keeps all of them gathered ("persistent") between
    # steps; at 0 the gathered copies are released after use and only the partitions stay.
    "zero3_no_persist": ("accelerate_configs/zero3.yaml", {"stage3_param_persistence_threshold": 0}),
    "zero3_offload": ("accelerate_configs/zero3_offload.yaml", {}),
}
PER_DEVICE_BATCH = 2
GRAD_ACCUM = 2  # two micro-batches per optimizer step, so gradients held between micro-batches can be measured


def accelerate_launch_env(config_file: str, num_processes: int) -> dict[str, str]:
    """The ACCELERATE_* variables `accelerate launch --config_file F --num_processes N --mixed_precision no` sets."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    parser = launch_command_parser()
    args = parser.parse_args(
        ["--config_file", str(REPO / config_file), "--num_processes", str(num_processes),
         "--mixed_precision", "no", "--main_process_port", str(free_port()), "train.py"]
    )
    args, defaults, mp_from_config_flag = _validate_launch_command(args)
    assert args.use_deepspeed and not args.cpu, f"{config_file} is not launched as DeepSpeed"
    # as in accelerate's launch_command()
    fields = list(defaults.deepspeed_config.keys()) if defaults else []
    if mp_from_config_flag:
        fields.append("mixed_precision")
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    _, env = prepare_deepspeed_cmd_env(args)
    return {k: v for k, v in env.items() if k.startswith("ACCELERATE_")}


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (None and empty tensors are skipped)."""
    import torch

    seen: dict[int, int] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _flatten(obj):
    import torch

    if obj is None:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _flatten(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _flatten(v)
    elif hasattr(obj, "flat_partition"):  # stage 1/2 GradPartitionBufferGroup
        yield obj.flat_partition


def grad_components(model, zopt) -> dict[str, list]:
    """Every gradient storage ZeRO (stages 1-3) may hold, by where it lives."""
    param_grads = []
    for p in model.parameters():
        param_grads += list(_flatten(p.grad)) + list(_flatten(getattr(p, "grad_accum", None)))
    zero_buffers = []
    for name in ("averaged_gradients", "all_grad_tensors", "grads_in_partition", "grad_partitions_flat_buffer"):
        zero_buffers += list(_flatten(getattr(zopt, name, None)))
    master_grads = [t for flat in _master_partitions(zopt) for t in _flatten(flat.grad)]
    return {"param_grads": param_grads, "zero_buffers": zero_buffers, "master_grads": master_grads}


def grad_bytes(model, zopt) -> dict[str, int]:
    comps = grad_components(model, zopt)
    out = {k: storage_bytes(v) for k, v in comps.items()}
    out["total"] = storage_bytes([t for v in comps.values() for t in v])
    return out


def _master_partitions(zopt):
    if hasattr(zopt, "fp32_partitioned_groups_flat"):  # stage 3
        return list(zopt.fp32_partitioned_groups_flat)
    return list(zopt.single_partition_of_fp32_groups)  # stage 1/2


def measure_one(name: str, env: dict[str, str], zero_overrides: dict, model_dir: str, data_dir: str,
                world_size: int) -> dict:
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from accelerate.utils import DistributedType
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations import unset_hf_deepspeed_config

    for k in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        del os.environ[k]
    os.environ.update(env)
    unset_hf_deepspeed_config()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()

    # What the Trainer does with use_cpu=True: TrainingArguments creates PartialState(cpu=True) (CPU device, gloo),
    # then the Trainer's Accelerator() picks DeepSpeed from ACCELERATE_USE_DEEPSPEED.
    PartialState(cpu=True)
    accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM)
    assert accelerator.distributed_type == DistributedType.DEEPSPEED, accelerator.distributed_type
    assert accelerator.num_processes == world_size
    plugin = accelerator.state.deepspeed_plugin
    plugin.deepspeed_config["zero_optimization"].update(zero_overrides)

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(model_dir)
    n_rows = PER_DEVICE_BATCH * world_size * GRAD_ACCUM
    rows = [json.loads(line) for line in open(Path(data_dir) / "train.jsonl")][:n_rows]
    texts = [tok.apply_chat_template(r["messages"], tokenize=False) for r in rows]
    enc = tok(texts, padding=True, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    dataset = torch.utils.data.TensorDataset(enc["input_ids"], enc["attention_mask"], labels)
    loader = torch.utils.data.DataLoader(dataset, batch_size=PER_DEVICE_BATCH, shuffle=False)

    # torch AdamW with the Trainer's two groups (no weight decay on 1-D tensors)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3
    )
    engine, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    zopt = engine.optimizer
    params = list(engine.module.parameters())
    numel = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in params)
    zcfg = engine._config.zero_config

    out: dict = {
        "config": name, "stage": engine.zero_optimization_stage(), "numel": numel, "rank": accelerator.process_index,
        "world_size": accelerator.num_processes, "dtype_bytes": params[0].element_size(),
        "optimizer_class": type(zopt).__name__, "inner_optimizer": type(zopt.optimizer).__name__,
        "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
        "offload_optimizer": str(getattr(zcfg.offload_optimizer.device, "value", zcfg.offload_optimizer.device))
        if zcfg.offload_optimizer else "none",
        "offload_param": str(getattr(zcfg.offload_param.device, "value", zcfg.offload_param.device))
        if zcfg.offload_param else "none",
        "reduce_bucket_size": int(zcfg.reduce_bucket_size),
        "param_persistence_threshold": int(zcfg.param_persistence_threshold),
        "max_param_numel": max(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in params),
    }

    # gradient storage right after autograd's backward, before ZeRO's reduction epilogue (diagnostic only: for
    # stage 2/3 it includes the in-flight reduce bucket, reduce_bucket_size elements)
    orig_epilogue = engine._backward_epilogue
    autograd_probe = []

    def epilogue_probe():
        autograd_probe.append(grad_bytes(engine.module, zopt))  # noqa: F821 (runs before the `del` below)
        orig_epilogue()

    engine._backward_epilogue = epilogue_probe
    orig_step = zopt.step

    def step_probe(*a, **kw):
        out["grads_before_step"] = grad_bytes(engine.module, zopt)  # noqa: F821 (runs before the `del` below)
        return orig_step(*a, **kw)

    zopt.step = step_probe

    engine.train()
    losses = []
    for micro, (input_ids, attention_mask, labels) in enumerate(loader):
        with accelerator.accumulate(engine):
            loss = engine(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            accelerator.backward(loss)  # engine.backward (+ engine.step at the accumulation boundary)
        losses.append(float(loss.detach()))
        if micro == 0:
            # held between micro-batches: stage 1 keeps the full local gradients, stage 2/3 only reduced partitions
            out["grads_between_micro_batches"] = grad_bytes(engine.module, zopt)
    out["grads_after_autograd"] = autograd_probe
    out["losses"] = losses
    out["global_steps"] = engine.global_steps

    masters = _master_partitions(zopt)
    out["master_bytes"] = storage_bytes(masters)
    out["master_device"] = str(masters[0].device)
    out["master_checksum"] = float(sum(m.double().sum() for m in masters))
    states = [zopt.optimizer.state[m] for m in masters if m in zopt.optimizer.state]
    out["exp_avg_bytes"] = storage_bytes(s["exp_avg"] for s in states)
    out["exp_avg_sq_bytes"] = storage_bytes(s["exp_avg_sq"] for s in states)
    out["exp_avg_sq_nonzero"] = int(sum((s["exp_avg_sq"] != 0).sum() for s in states))

    # parameters at rest, after the step
    out["param_data_bytes"] = storage_bytes(p.data for p in params)
    partitions = [p.ds_tensor for p in params if hasattr(p, "ds_tensor")]
    out["param_partition_bytes"] = storage_bytes(partitions)
    out["param_bytes"] = storage_bytes([p.data for p in params] + partitions)
    persistent = [p for p in params if getattr(p, "ds_persist", False)]
    out["params_persistent"] = len(persistent)
    out["persistent_param_bytes"] = sum(p.ds_numel * p.element_size() for p in persistent)
    out["params_total"] = len(params)

    accelerator.free_memory()
    del engine, optimizer, zopt, model, params, masters, states, partitions
    unset_hf_deepspeed_config()
    return out


def worker(rank: int, world_size: int, port: int, jobs: list, model_dir: str, data_dir: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.update(OFFLINE_ENV)
    import torch

    torch.set_num_threads(1)
    for name, env, overrides in jobs:
        try:
            results[(name, rank)] = ("ok", measure_one(name, env, overrides, model_dir, data_dir, world_size))
        except Exception as e:  # reported to the parent, which asserts on it
            results[(name, rank)] = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
            break
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def run(names: list[str], world_size: int = 2, timeout: float = 300) -> dict:
    """Measure every named config in one group of `world_size` spawned processes; {name: [per-rank dicts]}."""
    import torch.multiprocessing as mp

    sys.path.insert(0, str(REPO))
    from launch.config import smoke

    assets = smoke.ensure_smoke_assets(progress=lambda *_: None)
    jobs = [(n, accelerate_launch_env(CONFIGS[n][0], world_size), CONFIGS[n][1]) for n in names]
    ctx = mp.get_context("spawn")
    port = free_port()
    with ctx.Manager() as manager:
        results = manager.dict()
        procs = [ctx.Process(target=worker, args=(r, world_size, port, jobs, assets["model"], assets["data"], results))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=timeout)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        results = dict(results)
    out: dict = {}
    for n in names:
        per_rank = []
        for r in range(world_size):
            status, payload = results.get((n, r), ("error", "no result (process died or timed out)"))
            if status != "ok":
                raise RuntimeError(f"{n} rank {r}: {payload}")
            per_rank.append(payload)
        out[n] = per_rank
    return out


if __name__ == "__main__":
    result = json.dumps(run(sys.argv[1:] or list(CONFIGS)), indent=1)
    print("=== zero_bytes results ===")
    print(result)

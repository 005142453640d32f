"""The effective setup of a run, computed from the two configs and the overrides: strategy, mesh, batch, tokens.

Nothing here starts a process; `python -m launch RECIPE --dry-run` prints this plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from launch.accelerate_config import parallelism
from launch.constants import MESH_KEYS


@dataclass
class Plan:
    strategy: str
    distributed_type: str
    zero_stage: int | None
    num_machines: int
    world_size: int
    mesh: dict = field(default_factory=dict)
    dp_world_size: int = 1
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    effective_batch: int = 1
    max_length: int | None = None
    per_rank_seq_len: float | None = None
    tokens_per_step: int | None = None

    @property
    def processes_per_machine(self) -> int:
        return self.world_size // max(self.num_machines, 1)

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items())
        lines = [
            f"strategy                 {self.strategy}",
            f"world size               {self.world_size} process(es) on {self.num_machines} machine(s)",
            f"mesh                     {mesh}",
            f"data-parallel size       {self.dp_world_size}",
            f"per-device batch         {self.per_device_train_batch_size}",
            f"gradient accumulation    {self.gradient_accumulation_steps}",
            f"effective global batch   {self.effective_batch} sequences per optimizer step",
        ]
        if self.max_length:
            lines.append(f"sequence length          {self.max_length} tokens (global)")
            lines.append(f"per-rank sequence length {self.per_rank_seq_len:g} tokens")
            lines.append(f"tokens per step          at most {self.tokens_per_step} (effective batch x sequence length)")
        return "\n".join(lines)


def mesh_from(accelerate: dict, world_size: int) -> dict:
    """The mesh sizes, validated by Accelerate's ParallelismConfig when the config has a parallelism_config."""
    pc = parallelism(accelerate)
    if pc is None:
        # Without a parallelism config every process is a data-parallel rank (replicas for DDP and ZeRO).
        mesh = {name: 1 for name in MESH_KEYS}
        mesh["dp_shard" if accelerate.get("distributed_type") == "FSDP" else "dp_replicate"] = world_size
        return mesh
    return {name: getattr(pc, f"{name}_size") for name in MESH_KEYS}


def strategy_name(accelerate: dict, mesh: dict) -> tuple[str, int | None]:
    dist = accelerate.get("distributed_type", "NO")
    stage = None
    if dist == "DEEPSPEED":
        ds = accelerate.get("deepspeed_config") or {}
        stage = int(ds.get("zero_stage", 0))
        name = f"DeepSpeed ZeRO-{stage}"
        if ds.get("offload_optimizer_device", "none") not in ("none", None) or ds.get(
            "offload_param_device", "none"
        ) not in ("none", None):
            name += " + CPU offload"
    elif dist == "FSDP":
        version = (accelerate.get("fsdp_config") or {}).get("fsdp_version", 1)
        name = f"FSDP{version}"
    elif dist in ("MULTI_GPU", "MULTI_CPU"):
        name = "DDP"
    else:
        name = dist
    if mesh.get("cp", 1) > 1:
        name += f" + ring-attention CP (cp={mesh['cp']})"
    if mesh.get("sp", 1) > 1:
        name += f" + Ulysses SP (sp={mesh['sp']})"
    return name, stage


def make_plan(accelerate: dict, training: dict) -> Plan:
    world = int(accelerate.get("num_processes", 1))
    machines = int(accelerate.get("num_machines", 1) or 1)
    mesh = mesh_from(accelerate, world)
    strategy, stage = strategy_name(accelerate, mesh)
    # dp world size: the ranks that see different data. CP, SP and TP ranks share their data
    # (ParallelismConfig.non_data_parallel_size).
    split = mesh["cp"] * mesh["sp"] * mesh["tp"]
    dp_world = max(world // split, 1)
    bs = int(training.get("per_device_train_batch_size", 8))
    ga = int(training.get("gradient_accumulation_steps", 1))
    max_length = training.get("max_length")
    plan = Plan(
        strategy=strategy,
        distributed_type=str(accelerate.get("distributed_type", "NO")),
        zero_stage=stage,
        num_machines=machines,
        world_size=world,
        mesh=mesh,
        dp_world_size=dp_world,
        per_device_train_batch_size=bs,
        gradient_accumulation_steps=ga,
        effective_batch=bs * dp_world * ga,
    )
    if max_length:
        plan.max_length = int(max_length)
        plan.per_rank_seq_len = int(max_length) / (mesh["cp"] * mesh["sp"])
        plan.tokens_per_step = plan.effective_batch * int(max_length)
    return plan

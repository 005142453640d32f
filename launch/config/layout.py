"""The layout of a run: strategy, ZeRO stage, offload, mesh, data-parallel size, batch, sequence length, the
per-rank length, and what every global sequence length must be a multiple of. Built once while resolving a run
(`launch.run.resolve`) from the two configs and the overrides; the rules, the runner, the plan printout, the summary and
the memory model (whose `RunShape` holds this object) all read it, and nothing else derives these facts.

Modelled on torchtitan's `ParallelDims`: one object holds the mesh, validated by Accelerate's own
`ParallelismConfig` where the config has one, and answers the derived questions (data-parallel size, the
sequence-length divisor, the group the model states are sharded over). `ParallelismConfig` validates the sizes
(each >= 1, CP and SP exclusive, CP/TP not on pure replication); its own `total_size == num_processes` check runs
only in the ranks and is skipped for DeepSpeed SP, so `processes_problem` here keeps that one (for the run's rule
`launch.checks.rules.processes_fit_layout` and for `plan`). Nothing here starts a process; `python -m launch RECIPE
--dry-run` prints it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import asdict, dataclass, replace

from launch.constants import MESH_KEYS
from launch.errors import LaunchError
from launch.switches import is_on

# Accelerate's DeepSpeedPlugin default when a deepspeed_config names no zero_stage (accelerate/utils/dataclasses.py).
ACCELERATE_DEFAULT_ZERO_STAGE = 2

# What shards the model states, by kind: DeepSpeed's ZeRO partitions them, FSDP (1 and 2) shards them, DDP and a
# single process keep a whole copy on every rank.
SHARDING = {"deepspeed": "zero", "fsdp2": "fsdp", "fsdp1": "fsdp", "ddp": "replicated", "single": "replicated"}


@functools.cache
def _sft_defaults() -> dict:
    # Imported only when a config leaves a field out: a resolved run's training dict holds every field already (the
    # recipe's own TrlParser filled in the defaults, `launch.config.training_args.merge`); a recipe's raw config.yaml
    # may not.
    from trl import SFTConfig

    return {f.name: f.default for f in dataclasses.fields(SFTConfig)}


def training_value(training: dict, key: str):
    """A training field as the ranks get it: the value in `training`, or the default of TRL's SFTConfig (with
    transformers' TrainingArguments under it) when `training` leaves it out. The one source of the defaults."""
    return training[key] if key in training else _sft_defaults()[key]


@dataclass(frozen=True)
class Layout:
    kind: str  # "ddp" | "deepspeed" | "fsdp2" | "fsdp1" | "single": what shards the model states (`SHARDING`)
    distributed_type: str  # Accelerate's distributed_type as written
    zero_stage: int | None  # DeepSpeed only; Accelerate's default (2) when the config names none
    offload_optimizer: bool
    offload_params: bool
    num_machines: int
    world_size: int
    mesh: dict  # dp_replicate, dp_shard, tp, cp, sp
    # No defaults here: `from_configs` takes the ranks' own (`training_value`), so each fact has one.
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    max_length: int | None  # global sequence length (before the CP / SP split); None: no truncation
    pad_to_multiple_of: int  # 1: no padding multiple

    def __post_init__(self):
        if self.kind not in SHARDING:
            raise ValueError(f"unknown layout kind {self.kind!r}; expected one of {tuple(SHARDING)}")

    # ---- built from the configs --------------------------------------------------------------------------------
    @classmethod
    def from_configs(cls, accelerate: dict, training: dict) -> "Layout":
        """`accelerate`: the Accelerate config with this run's overrides; `training`: the merged training fields."""
        dist = str(accelerate.get("distributed_type", "NO"))
        world = int(accelerate.get("num_processes", 1) or 1)
        ds = accelerate.get("deepspeed_config") or {}
        fsdp = accelerate.get("fsdp_config") or {}
        stage, offload_opt, offload_par = None, False, False
        if dist == "DEEPSPEED":
            kind = "deepspeed"
            stage = int(ds.get("zero_stage", ACCELERATE_DEFAULT_ZERO_STAGE))
            offload_opt = is_on(ds.get("offload_optimizer_device"))
            offload_par = is_on(ds.get("offload_param_device"))
        elif dist == "FSDP":
            kind = "fsdp2" if int(fsdp.get("fsdp_version", 1) or 1) == 2 else "fsdp1"
            offload_opt = offload_par = is_on(fsdp.get("fsdp_offload_params", False))  # the step runs on the host copy
        elif dist in ("MULTI_GPU", "MULTI_CPU"):
            kind = "ddp"
        else:
            kind = "single"
        max_length = training_value(training, "max_length")
        return cls(
            kind=kind,
            distributed_type=dist,
            zero_stage=stage,
            offload_optimizer=offload_opt,
            offload_params=offload_par,
            num_machines=int(accelerate.get("num_machines", 1) or 1),
            world_size=world,
            mesh=mesh_from(accelerate, world),
            per_device_train_batch_size=int(training_value(training, "per_device_train_batch_size")),
            gradient_accumulation_steps=int(training_value(training, "gradient_accumulation_steps") or 1),
            max_length=int(max_length) if max_length else None,
            pad_to_multiple_of=int(training.get("pad_to_multiple_of") or 1),
        )

    def with_length(self, max_length: int) -> "Layout":
        return replace(self, max_length=int(max_length))

    # ---- the mesh ----------------------------------------------------------------------------------------------
    @property
    def cp(self) -> int:
        return int(self.mesh.get("cp", 1))

    @property
    def sp(self) -> int:
        return int(self.mesh.get("sp", 1))

    @property
    def tp(self) -> int:
        return int(self.mesh.get("tp", 1))

    @property
    def processes_per_machine(self) -> int:
        return max(self.world_size // max(self.num_machines, 1), 1)

    @property
    def dp_world_size(self) -> int:
        """The ranks that see different data: CP, SP and TP ranks share theirs
        (ParallelismConfig.non_data_parallel_size)."""
        return max(self.world_size // (self.cp * self.sp * self.tp), 1)

    @property
    def sharding(self) -> str:
        """What shards the model states: "zero" (DeepSpeed), "fsdp" (FSDP1 or FSDP2) or "replicated" (DDP, one
        process)."""
        return SHARDING[self.kind]

    @property
    def shard_group(self) -> int:
        """Ranks one copy of the model states is split over: ZeRO partitions over all ranks but TP (DeepSpeed's
        seq_data_parallel_group, i.e. dp x sp); FSDP over the dp_shard x cp mesh; DDP over none."""
        if self.sharding == "zero":
            return max(self.world_size // max(self.tp, 1), 1)
        if self.sharding == "fsdp":
            return max(int(self.mesh.get("dp_shard", 1) or 1) * self.cp, 1)
        return 1

    @property
    def seq_multiple(self) -> int:
        """What every global sequence length must be a multiple of: pad_to_multiple_of, 2 x cp under CP (load
        balancing splits each sequence into 2 x cp chunks), sp under SP."""
        m = self.pad_to_multiple_of
        if self.cp > 1:
            m = math.lcm(m, 2 * self.cp)
        if self.sp > 1:
            m = math.lcm(m, self.sp)
        return m

    # ---- batch and tokens --------------------------------------------------------------------------------------
    @property
    def effective_batch(self) -> int:
        return self.per_device_train_batch_size * self.dp_world_size * self.gradient_accumulation_steps

    @property
    def per_rank_length(self) -> int | None:
        """Tokens of one sequence that one rank holds: the global length split over the CP x SP ranks, an integer,
        rounded up. Rounded up because the rank with the largest share sets the memory: a length that does not divide
        (the planner's length search tries such lengths) leaves some rank ceil(length / ranks) tokens. The CP / SP
        rules keep a run's lengths multiples of `seq_multiple`, which CP x SP divides, so for a valid run this is the
        exact share. None without a max_length (no truncation)."""
        return math.ceil(self.max_length / (self.cp * self.sp)) if self.max_length else None

    @property
    def tokens_per_rank(self) -> int | None:
        """Tokens one rank holds in a micro-batch: per-device batch x per-rank length."""
        return self.per_device_train_batch_size * self.per_rank_length if self.max_length else None

    @property
    def tokens_per_step(self) -> int | None:
        return self.effective_batch * self.max_length if self.max_length else None

    # ---- how it reads ------------------------------------------------------------------------------------------
    @property
    def strategy(self) -> str:
        if self.kind == "deepspeed":
            offload = " + CPU offload" if self.offload_optimizer or self.offload_params else ""
            name = f"DeepSpeed ZeRO-{self.zero_stage}" + offload
        elif self.kind in ("fsdp1", "fsdp2"):
            name = self.kind.upper()
            replicas, shard = int(self.mesh.get("dp_replicate", 1)), int(self.mesh.get("dp_shard", 1))
            if replicas > 1 and shard > 1:
                name += f" HSDP (dp_replicate={replicas} x dp_shard={shard})"
            if self.offload_params:
                name += " + CPU offload"
        elif self.kind == "ddp":
            name = "DDP"
        else:
            name = self.distributed_type
        if self.cp > 1:
            name += f" + ring-attention CP (cp={self.cp})"
        if self.sp > 1:
            name += f" + Ulysses SP (sp={self.sp})"
        return name

    @property
    def mesh_size(self) -> int:
        """dp_replicate x dp_shard x tp x cp x sp: the processes the mesh takes."""
        return math.prod(int(self.mesh.get(name, 1)) for name in MESH_KEYS)

    def mesh_for(self, processes: int) -> dict:
        """The mesh sizes to change so that this mesh takes `processes` processes: its largest dimension (tp is never
        resized) scaled to the processes the others leave ({} when they do not divide `processes`)."""
        sizes = {name: int(self.mesh.get(name, 1)) for name in MESH_KEYS if name != "tp"}
        largest = max(sizes, key=lambda name: sizes[name])
        others = self.mesh_size // sizes[largest]
        if processes % others or processes // others == sizes[largest]:
            return {}
        return {largest: processes // others}

    def as_dict(self) -> dict:
        derived = ("strategy", "dp_world_size", "shard_group", "seq_multiple", "effective_batch", "per_rank_length",
                   "tokens_per_step")
        return {**asdict(self), **{name: getattr(self, name) for name in derived}}

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
            lines.append(f"length multiple          {self.seq_multiple} (every global length must be one)")
            lines.append(f"per-rank sequence length {self.per_rank_length} tokens")
            lines.append(f"tokens per step          at most {self.tokens_per_step} (effective batch x sequence length)")
        return "\n".join(lines)


def mesh_from(accelerate: dict, world_size: int) -> dict:
    """The mesh sizes, validated by Accelerate's ParallelismConfig when the config has a parallelism_config."""
    pc = parallelism(accelerate)
    if pc is None:
        # Without a parallelism config every process is a data-parallel rank (replicas for DDP and ZeRO).
        mesh = {name: 1 for name in MESH_KEYS}
        mesh["dp_shard" if accelerate.get("distributed_type") == "FSDP" else "dp_replicate"] = world_size
        fsdp = accelerate.get("fsdp_config") or {}
        if accelerate.get("distributed_type") == "FSDP" and int(fsdp.get("fsdp_version", 1) or 1) == 1:
            # FSDP1 says its mesh with its sharding strategy (torch's ShardingStrategy): HYBRID_SHARD shards within a
            # machine and replicates across machines, NO_SHARD replicates everything (FSDP2 ignores the key, and
            # rules.fsdp2_without_fsdp1_settings refuses it there)
            strategy = str(fsdp.get("fsdp_sharding_strategy") or "FULL_SHARD").upper()
            machines = max(int(accelerate.get("num_machines", 1) or 1), 1)
            if strategy in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "4", "5") and world_size % machines == 0:
                mesh.update(dp_replicate=machines, dp_shard=world_size // machines)
            elif strategy in ("NO_SHARD", "3"):
                mesh.update(dp_replicate=world_size, dp_shard=1)
        return mesh
    return {name: getattr(pc, f"{name}_size") for name in MESH_KEYS}


def parallelism(accelerate: dict):
    """Accelerate's ParallelismConfig for this config's `parallelism_config` (None when it has none); its own
    validation errors become LaunchErrors."""
    pc = accelerate.get("parallelism_config") or {}
    if not pc:
        return None
    from accelerate.parallelism_config import ParallelismConfig

    sizes = {f"{dim}_size": _int(pc.get(key, 1), key) for dim, key in MESH_KEYS.items()}
    try:
        return ParallelismConfig(**sizes, cp_backend=pc.get("parallelism_config_cp_backend") or "torch",
                                 sp_backend=pc.get("parallelism_config_sp_backend") or "deepspeed")
    except ValueError as e:
        raise LaunchError(f"The parallel layout is invalid (Accelerate's ParallelismConfig: {e}).") from None


def _int(value, key) -> int:
    try:
        return int(value if value is not None else 1)
    except (TypeError, ValueError):
        raise LaunchError(f"`{key}` is {value!r}; expected an integer.") from None


def processes_problem(layout: Layout, accelerate: dict) -> tuple[str, str] | None:
    """(what, why) the run's processes cannot hold its layout, `what` being "machines" or "mesh"; None when they can.
    They must spread evenly over its machines, and with a `parallelism_config` the mesh must take exactly them
    (Accelerate checks that in the ranks only, and not at all for DeepSpeed SP, whose num_processes is per node). The
    one check of it: the run's rule (`launch.checks.rules.processes_fit_layout`) and `python -m launch plan` call it,
    each adding how to fix it in its own flags."""
    if layout.world_size % layout.num_machines:
        return "machines", f"{layout.world_size} processes cannot be spread evenly over {layout.num_machines} machines"
    if accelerate.get("parallelism_config") and layout.mesh_size != layout.world_size:
        dims = " x ".join(f"{k}={v}" for k, v in layout.mesh.items())
        return "mesh", (f"The recipe's parallel layout ({dims} = {layout.mesh_size}) does not use "
                        f"{layout.world_size} processes: dp_replicate x dp_shard x tp x cp x sp must equal the number "
                        "of processes on all machines together.")
    return None

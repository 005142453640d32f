"""The one layout object (launch/config/layout.py): built once while resolving a run; the rules, the plan printout and
the memory model read the same values from it."""

from __future__ import annotations

import yaml

from helpers.launcher import launch_in_process
from launch.checks import rules
from launch.config.layout import ACCELERATE_DEFAULT_ZERO_STAGE, Layout
from launch.memory.plan import run_shape
from launch.config.options import Options
from launch.recipe.discovery import find_recipe
from launch.run.resolve import resolve
from launch.switches import is_on
from helpers.rule_checks import facts, make_recipe, messages

QWEN2_05B = {"num_attention_heads": 14, "num_key_value_heads": 2}  # the alst-ulysses-4gpu GPU default (its heads)


def test_a_deepspeed_config_without_zero_stage_is_accelerates_default_everywhere(tmp_path):
    """A latent bug: without `zero_stage` the plan said ZeRO-0 (and SP was refused as "stage 0
    crashes") while the run and the memory model used Accelerate's default, stage 2."""
    acc = yaml.safe_load(find_recipe("alst-ulysses-4gpu").accelerate_config_path.read_text())
    del acc["deepspeed_config"]["zero_stage"]
    folder = make_recipe(tmp_path, base="alst-ulysses-4gpu", accelerate=acc)
    setup = resolve(Options(recipe=str(folder), smoke=True, cpu=True))
    assert ACCELERATE_DEFAULT_ZERO_STAGE == 2
    assert setup.layout.zero_stage == 2 and setup.layout.strategy.startswith("DeepSpeed ZeRO-2 ")
    assert run_shape(setup).layout is setup.layout  # the memory model reads the same object
    assert rules.sp_zero_stage(setup, facts(model_config=QWEN2_05B)) is None  # the rule
    assert messages(setup, facts(model_config=QWEN2_05B)) == []
    proc = launch_in_process(folder, "--smoke", "--cpu", "--dry-run")  # the plan printout
    assert "strategy                 DeepSpeed ZeRO-2 + Ulysses SP (sp=2)" in proc.stdout


def test_the_layout_answers_the_derived_questions():
    ring = resolve(Options(recipe="ring-cp-8gpu")).layout
    assert (ring.kind, ring.cp, ring.dp_world_size, ring.shard_group) == ("fsdp2", 8, 1, 8)
    assert ring.seq_multiple == 16 and ring.max_length % ring.seq_multiple == 0  # 2 x cp (load balancing)
    assert ring.per_rank_length == ring.max_length // 8 and ring.tokens_per_rank == ring.per_rank_length
    alst = resolve(Options(recipe="alst-ulysses-4gpu")).layout
    assert (alst.kind, alst.zero_stage, alst.sp, alst.dp_world_size, alst.shard_group) == ("deepspeed", 3, 2, 2, 4)
    assert alst.seq_multiple % 2 == 0
    ddp = Layout.from_configs({"distributed_type": "MULTI_GPU", "num_processes": 4}, {"max_length": 100})
    assert (ddp.mesh["dp_replicate"], ddp.dp_world_size, ddp.shard_group, ddp.seq_multiple) == (4, 4, 1, 1)
    assert ddp.effective_batch == 8 * 4  # TrainingArguments' per-device default 8


def test_the_per_rank_length_is_one_integer_rounded_up():
    """One per-rank length for the printout and the memory model: the largest rank's share of a length that does
    not divide (the planner's search tries such lengths), the exact share of one that does."""
    sp4 = Layout.from_configs({"distributed_type": "DEEPSPEED", "num_processes": 4,
                               "deepspeed_config": {"zero_stage": 3},
                               "parallelism_config": {"parallelism_config_sp_size": 4,
                                                      "parallelism_config_dp_shard_size": 1}},
                              {"max_length": 4097, "per_device_train_batch_size": 2})
    assert sp4.sp == 4 and sp4.per_rank_length == 1025 and sp4.tokens_per_rank == 2050
    assert sp4.with_length(4096).per_rank_length == 1024
    assert "per-rank sequence length 1025 tokens" in sp4.describe()


def test_defaults_are_trls_and_switches_read_one_way():
    """A config that leaves a training field out gets SFTConfig's default (read from TRL's dataclass, not typed
    here); the offload switches read booleans, flag words and DeepSpeed's device names the same way everywhere."""
    from trl import SFTConfig

    layout = Layout.from_configs({"distributed_type": "MULTI_GPU", "num_processes": 2}, {})
    upstream = SFTConfig.__dataclass_fields__
    assert layout.max_length == upstream["max_length"].default
    assert layout.per_device_train_batch_size == upstream["per_device_train_batch_size"].default
    assert layout.gradient_accumulation_steps == upstream["gradient_accumulation_steps"].default

    def offload(optimizer, params):
        ds = {"zero_stage": 3, "offload_optimizer_device": optimizer, "offload_param_device": params}
        got = Layout.from_configs({"distributed_type": "DEEPSPEED", "num_processes": 2, "deepspeed_config": ds}, {})
        return got.offload_optimizer, got.offload_params

    assert offload("cpu", "nvme") == (True, True) and offload(" CPU ", "none") == (True, False)
    assert offload(None, "") == (False, False)
    for on in (True, 1, "true", "True", "yes", "on", "1", "y", "t", "cpu", "nvme"):
        assert is_on(on), on
    for off in (None, False, 0, "", "none", "false", "no", "off", "0", "FULL_SHARD"):
        assert not is_on(off), off



def test_fsdp1_sharding_strategy_is_its_mesh_and_fsdp2_uses_parallelism_config():
    """FSDP1 says HSDP with its sharding strategy (HYBRID_SHARD: shard within a machine, replicate across machines);
    FSDP2 with parallelism_config's dp_replicate x dp_shard. Either way the states are split over the shard group."""
    fsdp1 = {"distributed_type": "FSDP", "num_processes": 16, "num_machines": 2,
             "fsdp_config": {"fsdp_version": 1, "fsdp_sharding_strategy": "HYBRID_SHARD"}}
    layout = Layout.from_configs(fsdp1, {})
    assert (layout.mesh["dp_replicate"], layout.mesh["dp_shard"], layout.shard_group) == (2, 8, 8)
    no_shard = {**fsdp1, "fsdp_config": {"fsdp_version": 1, "fsdp_sharding_strategy": "NO_SHARD"}}
    assert Layout.from_configs(no_shard, {}).shard_group == 1
    fsdp2 = {"distributed_type": "FSDP", "num_processes": 16, "num_machines": 2, "fsdp_config": {"fsdp_version": 2},
             "parallelism_config": {"parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 8}}
    layout = Layout.from_configs(fsdp2, {})
    assert (layout.mesh["dp_replicate"], layout.shard_group, layout.dp_world_size) == (2, 8, 16)
    assert layout.strategy == "FSDP2 HSDP (dp_replicate=2 x dp_shard=8)"
    # SHARD_GRAD_OP keeps every unit gathered from its forward to its backward (FSDP2: reshard_after_forward false)
    grad_op = {**fsdp1, "fsdp_config": {"fsdp_version": 1, "fsdp_sharding_strategy": "SHARD_GRAD_OP"}}
    assert run_shape_of(grad_op).fsdp_reshard_after_forward is False
    assert run_shape_of(fsdp1).fsdp_reshard_after_forward is True


def run_shape_of(accelerate: dict):
    from launch.memory import RunShape

    return RunShape.from_configs(accelerate, {"max_length": 1024})

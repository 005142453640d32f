"""FSDP: parameter offload on CPU, FSDP2 (and HSDP through parallelism_config), and the state-dict type, which
decides whether the final weights are written (templates/train.py, launch/rank/consolidate.py).
"""

from __future__ import annotations


from accelerate.utils.constants import FSDP_STATE_DICT_TYPE

from launch.checks.rules.registry import Facts, _fsdp2, rule
from launch.switches import is_on

@rule(doc=(
    "no `fsdp_offload_params: true` on a CPU run (FSDP1 or FSDP2, with or without CP)",
    "torch: \"Cannot access accelerator device when none is available\", in every rank after loading"))
def fsdp_param_offload_not_on_cpu(setup, facts: Facts):
    # any FSDP run on CPU, not only CP ones (measured: FSDP2 without CP, and FSDP1, fail the same way)
    fsdp = setup.accelerate.get("fsdp_config") or {}
    if setup.layout.sharding == "fsdp" and setup.options.cpu and is_on(fsdp.get("fsdp_offload_params")):
        return (f"fsdp_offload_params: true moves {setup.layout.kind.upper()}'s parameters from the accelerator to "
                "host memory; on a CPU run there is no accelerator and every rank fails after loading (torch: \"Cannot "
                "access accelerator device when none is available\"). Set fsdp_offload_params: false in the "
                "Accelerate config's fsdp_config for CPU runs (the parameters are in host memory already).")
    return None


# Accelerate's FullyShardedDataParallelPlugin reads FSDP1's keys under fsdp_version 2 in the ranks only, after the
# model has loaded, and there it only warns and drops most of them ("Multiple deprecation warnings due to FSDP2
# conversion", accelerate/utils/dataclasses.py): a sharding strategy other than full sharding is silently lost.
FSDP1_STRATEGY_IN_FSDP2 = {
    "HYBRID_SHARD": "HSDP in FSDP2 is parallelism_config: parallelism_config_dp_replicate_size (replicas, e.g. one "
                    "per node) x parallelism_config_dp_shard_size (GPUs that shard one copy)",
    "HYBRID_SHARD_ZERO2": "HSDP in FSDP2 is parallelism_config (dp_replicate x dp_shard), plus "
                           "fsdp_reshard_after_forward: false",
    "SHARD_GRAD_OP": "FSDP2 spells it fsdp_reshard_after_forward: false",
    "NO_SHARD": "an unsharded run is DDP (distributed_type: MULTI_GPU)",
}


@rule(feature="fsdp2", doc=(
    "with `fsdp_version: 2`, no FSDP1-only setting (`fsdp_sharding_strategy` other than FULL_SHARD, "
    "`fsdp_forward_prefetch`, an FSDP1 strategy name as `fsdp_reshard_after_forward`)",
    "Accelerate drops the strategy with a warning (full sharding instead), or raises in every rank after loading"))
def fsdp2_without_fsdp1_settings(setup, facts: Facts):
    if not _fsdp2(setup):
        return None
    fsdp = setup.accelerate.get("fsdp_config") or {}
    found = []
    strategy = str(fsdp.get("fsdp_sharding_strategy") or "FULL_SHARD").upper()
    if strategy not in ("FULL_SHARD", "1"):
        meaning = FSDP1_STRATEGY_IN_FSDP2.get(strategy, "not an FSDP2 setting")
        found.append(f"fsdp_sharding_strategy: {strategy} ({meaning})")
    if is_on(fsdp.get("fsdp_forward_prefetch")):
        found.append("fsdp_forward_prefetch: true (Accelerate: \"forward_prefetch is not yet implemented in FSDP2\"; "
                     "FSDP2 prefetches the next layer's all-gather by itself)")
    raf = fsdp.get("fsdp_reshard_after_forward")
    if isinstance(raf, str) and raf.strip().lower() not in ("true", "false", "1", "0", "yes", "no"):
        found.append(f"fsdp_reshard_after_forward: {raf} (an FSDP1 strategy name; FSDP2 takes true or false)")
    if not found:
        return None
    return ("The Accelerate config asks for FSDP2 (fsdp_version: 2) with FSDP1-only settings that FSDP2 ignores or "
            "refuses in the ranks after the model has loaded: " + "; ".join(found) + ". Change them in the "
            "Accelerate config's fsdp_config (or use fsdp_version: 1).")


@rule(feature="fsdp2", doc=(
    "with FSDP2 and a `parallelism_config` on more than one process, a mesh dimension to shard over: `dp_shard` or "
    "`cp` above 1",
    "Accelerate: \"FSDP is enabled but the parallelism config has no dimension for FSDP to shard across\", in "
    "every rank"))
def fsdp2_has_a_shard_dimension(setup, facts: Facts):
    # Accelerate's ParallelismConfig checks this only in the ranks (_validate_accelerator), after start-up;
    # a single process is exempt there (no distributed setup: a valid config, e.g. a one-GPU fsdp2 run)
    m = setup.layout.mesh
    if (not _fsdp2(setup) or not setup.accelerate.get("parallelism_config") or m["dp_shard"] > 1 or m["cp"] > 1
            or setup.layout.world_size == 1):
        return None
    return (f"The mesh gives FSDP2 nothing to shard over: dp_shard {m['dp_shard']} and cp {m['cp']} (with dp_replicate "
            f"{m['dp_replicate']}), and FSDP2 shards the model over dp_shard x cp; Accelerate refuses it in every rank "
            "(\"FSDP is enabled but the parallelism config has no dimension for FSDP to shard across\"). Give FSDP2 a "
            "shard group, with dp_replicate x dp_shard still the processes (e.g. --dp-replicate-size 1 --dp-shard-size "
            f"{m['dp_replicate']}: one copy sharded over all of them), or, to keep a whole copy of the model on every "
            "process, use DDP (distributed_type: MULTI_GPU).")


# torch's StateDictType by value (1, 2, 3), in Accelerate's own list (an unknown name is refused earlier, with the
# Accelerate config's other enum values: launch.config.accelerate_config)
STATE_DICT_TYPES = tuple(FSDP_STATE_DICT_TYPE)


def fsdp_state_dict_type(accelerate: dict) -> str | None:
    """The state-dict type an Accelerate config gives the ranks' FSDP plugin (None: not FSDP), as Accelerate 1.15's
    `FullyShardedDataParallelPlugin.set_state_dict_type` reads it: `fsdp_state_dict_type` by name (any case) or by
    StateDictType value; absent, FULL_STATE_DICT under FSDP1 and SHARDED_STATE_DICT under FSDP2. An unknown value is
    returned as written, in upper case."""
    if accelerate.get("distributed_type") != "FSDP":
        return None
    fsdp = accelerate.get("fsdp_config") or {}
    value = str(fsdp.get("fsdp_state_dict_type") or "").strip().upper()
    if not value:
        return STATE_DICT_TYPES[0] if str(fsdp.get("fsdp_version") or 1) == "1" else STATE_DICT_TYPES[2]
    if value.isdigit() and 1 <= int(value) <= len(STATE_DICT_TYPES):
        return STATE_DICT_TYPES[int(value) - 1]
    return value


@rule(doc=(
    "under FSDP, `fsdp_state_dict_type` FULL_STATE_DICT or SHARDED_STATE_DICT",
    "LOCAL_STATE_DICT: no final weights are written (FSDP2 refuses it in every rank)"))
def fsdp_state_dict_type_saves_weights(setup, facts: Facts):
    kind = fsdp_state_dict_type(setup.accelerate)
    if kind in (None, "FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        return None
    path = setup.recipe.accelerate_config_path
    why = ("each rank would save only its own flat shard of FSDP1's parameters, which neither transformers' "
           "save_model nor train.py turns into weights: the run would end with no weights in final/ (and FSDP2 "
           "refuses LOCAL_STATE_DICT in every rank, after the model has loaded)")
    return (f"fsdp_state_dict_type {kind} in {path}: {why}. Use SHARDED_STATE_DICT (every rank writes its shard; at "
            "the end train.py consolidates the shards into safetensors files, a few GB per process at a time) or "
            "FULL_STATE_DICT (the whole model gathered in the first process's host memory at every save).")

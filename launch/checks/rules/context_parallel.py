"""Ring-attention context parallelism (FSDP2): FSDP2, lengths, SDPA, full causal attention, no packing.
"""

from __future__ import annotations



from launch.checks.rules.registry import Facts, _cp, _fsdp2, length_multiple_problem, rule
from launch.constants import CP_ATTENTION

@rule(feature="context_parallel", doc=(
    "FSDP version 2",
    "Accelerate: \"Using `cp_size>1` requires FSDP2, but the provided `fsdp_plugin` is using FSDP1.\""))
def cp_needs_fsdp2(setup, facts: Facts):
    if _cp(setup) > 1 and not _fsdp2(setup):
        return ("Ring-attention context parallelism runs on FSDP2 only: set distributed_type: FSDP and "
                "fsdp_config.fsdp_version: 2 in the Accelerate config (Accelerate: \"Using `cp_size>1` requires "
                "FSDP2\").")
    return None


@rule(feature="context_parallel", doc=(
    "`pad_to_multiple_of` a multiple of 2 x cp",
    "a length not divisible by cp: uneven shards and the collectives fail; divisible by cp but not 2 x cp: torch "
    "silently turns load balancing off"))
def cp_sequence_divisible(setup, facts: Facts):
    cp = _cp(setup)
    if cp <= 1:
        return None
    return length_multiple_problem(setup, 2 * cp, (
        f"With cp_size={cp} every sequence length must be divisible by 2 x cp_size = {2 * cp}: torch's head-tail "
        "load balancing cuts it into 2 x cp chunks (a length not divisible by cp makes the collectives fail; one "
        "divisible by cp only silently unbalances the work)"))


@rule(feature="context_parallel", doc=(
    "`attn_implementation: sdpa`",
    "Trainer: \"Context parallelism is supported only with SDPA attention, you are using ...\""))
def cp_attention_sdpa(setup, facts: Facts):
    attn = setup.training.get("attn_implementation")
    if _cp(setup) > 1 and attn != CP_ATTENTION:
        return (f"Ring-attention context parallelism supports SDPA attention only, not {attn} (transformers: "
                "\"Context parallelism is supported only with SDPA attention\"). Set attn_implementation: sdpa.")
    return None


@rule(needs_model=True, feature="context_parallel", applies=lambda setup: _cp(setup) > 1, doc=(
    "a full-attention model (no sliding-window layers)",
    "CP computes full causal attention: the window would silently widen (accelerate PR #4177 refuses it)"))
def cp_causal_only(setup, facts: Facts):
    cfg = facts.model_config
    layer_types = getattr(cfg, "layer_types", None) or []
    sliding = getattr(cfg, "use_sliding_window", False) or any("sliding" in str(t) for t in layer_types)
    if sliding:
        return (f"The model ({setup.training.get('model_name_or_path')}) uses sliding-window attention; context "
                "parallelism only computes full causal attention and would silently widen the window (accelerate PR "
                "#4177 refuses it). Use a model without sliding-window layers, or Ulysses SP.")
    return None


@rule(feature="context_parallel", doc=(
    "`packing: false`",
    "TRL: \"Packing is not compatible with context parallelism (`cp_size > 1`). ...\""))
def cp_no_packing(setup, facts: Facts):
    if _cp(setup) > 1 and (setup.training.get("packing") or setup.training.get("padding_free")):
        return ("Packing is not compatible with context parallelism (TRL: \"Packing is not compatible with context "
                "parallelism (`cp_size > 1`)\"): CP drops the per-layer attention mask, so packed documents would "
                "attend to each other. Set packing: false and use samples as long as the sequence length.")
    return None

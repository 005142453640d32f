"""Sequence parallelism (ALST/Ulysses, DeepSpeed): heads, lengths, attention, packing, ZeRO stage, and the ALST
settings (tiled MLP, activation offloading).
"""

from __future__ import annotations



from launch.checks.rules.registry import Facts, _sp, length_multiple_problem, rule
from launch.constants import SP_ATTENTION, SP_ATTENTION_KEY

@rule(needs_model=True, feature="sequence_parallel", applies=lambda setup: _sp(setup) > 1, doc=(
    "query heads divisible by sp; KV heads divide sp or are divisible by it",
    "DeepSpeed: \"Attention head count ... is not divisible by SP size ...\""))
def sp_heads_divisible(setup, facts: Facts):
    sp = _sp(setup)
    cfg = facts.model_config
    q = getattr(cfg, "num_attention_heads", None)
    kv = getattr(cfg, "num_key_value_heads", None) or q
    problems = []
    if q and q % sp:
        problems.append(f"its {q} query heads are not divisible by sp_size={sp}")
    if kv and kv % sp and sp % kv:
        problems.append(f"its {kv} KV heads neither divide sp_size={sp} nor are divisible by it")
    if problems:
        return (f"Ulysses sequence parallelism splits attention heads across the sp group, and the model "
                f"({setup.training.get('model_name_or_path')}) does not allow sp_size={sp}: {'; '.join(problems)}. "
                "Choose an sp_size that divides the query heads (--sp-size).")
    return None


@rule(feature="sequence_parallel", doc=(
    "`pad_to_multiple_of` a multiple of sp",
    "DeepSpeed: \"batch's seqlen=L isn't divisible by sp-size=S\""))
def sp_sequence_divisible(setup, facts: Facts):
    sp = _sp(setup)
    if sp <= 1:
        return None
    if problem := length_multiple_problem(setup, sp, (
            f"With sp_size={sp} every batch's sequence length must be divisible by {sp} (DeepSpeed: \"batch's "
            f"seqlen=L isn't divisible by sp-size={sp}\")")):
        return problem
    t = setup.training
    # synthetic rows are always exactly max_length tokens (launch.rank.synthetic): equal shapes without padding
    synthetic = bool(getattr(setup.options, "synthetic", False) or t.get("synthetic"))
    if setup.options.cpu and not synthetic and int(t["pad_to_multiple_of"]) != int(t.get("max_length") or 0):
        return ("On CPU, gloo all-gathers only equal shapes (\"ProcessGroupGloo::allgather: invalid tensor size\"), so "
                "every SP batch must have the same length: set pad_to_multiple_of equal to max_length "
                f"({t.get('max_length')}).")
    return None


@rule(feature="sequence_parallel", doc=(
    "`attn_implementation` FlashAttention 2/3 or SDPA, equal to `parallelism_config_sp_attn_implementation`",
    "DeepSpeed refuses eager and flex attention, and a mismatch (\"core_attn_implementation ... does not match\")"))
def sp_attention_supported(setup, facts: Facts):
    if _sp(setup) <= 1:
        return None
    model_attn = setup.training.get("attn_implementation")
    sp_attn = (setup.accelerate.get("parallelism_config") or {}).get(SP_ATTENTION_KEY, model_attn)
    if model_attn not in SP_ATTENTION or sp_attn not in SP_ATTENTION:
        return (f"Ulysses sequence parallelism needs FlashAttention 2/3 or SDPA; got attn_implementation="
                f"{model_attn}, {SP_ATTENTION_KEY}={sp_attn}. Eager and flex attention are "
                "refused (their 4D attention mask is dropped).")
    if model_attn != sp_attn:
        return (f"attn_implementation ({model_attn}) and {SP_ATTENTION_KEY} ({sp_attn}) must be "
                "the same (DeepSpeed: \"core_attn_implementation ... does not match model config "
                "attn_implementation\").")
    return None


@rule(feature="sequence_parallel", doc=(
    "`packing_strategy: wrapped` (or no packing), `padding_free` off",
    "IndexError in DeepSpeed's UlyssesSPDataLoaderAdapter.refill (bfd packing's 1-D cu_seq_lens cannot be sharded)"))
def sp_packing_safe(setup, facts: Facts):
    if _sp(setup) <= 1:
        return None
    t = setup.training
    if t.get("padding_free") or (t.get("packing") and t.get("packing_strategy", "bfd") != "wrapped"):
        return ("With sequence parallelism, use `packing_strategy: wrapped` (or no packing) and padding_free off: "
                "TRL's "
                "bfd packing and padding-free batches carry 1-D cu_seq_lens that DeepSpeed's SP data loader cannot "
                "shard (IndexError in UlyssesSPDataLoaderAdapter.refill). Wrapped rows are plain fixed-length token "
                "windows; with SDPA, documents that share a row attend to each other, as in any wrapped packing.")
    return None


@rule(feature="sequence_parallel", doc=(
    "DeepSpeed ZeRO stage 1, 2 or 3",
    "stage 0 crashes (DeepSpeed #7833)"))
def sp_zero_stage(setup, facts: Facts):
    if _sp(setup) > 1 and setup.layout.zero_stage not in (1, 2, 3):
        return (f"Ulysses sequence parallelism runs on DeepSpeed ZeRO stage 1, 2 or 3 (stage {setup.layout.zero_stage} "
                "crashes, DeepSpeed #7833): use distributed_type DEEPSPEED with zero_stage 1-3.")
    return None


@rule(feature="alst", doc=("`tiled_mlp` only with DeepSpeed",
                          "wrong gradients: DDP and FSDP would reduce a partial one"))
def tiled_mlp_needs_deepspeed(setup, facts: Facts):
    if setup.training.get("tiled_mlp") and setup.layout.kind != "deepspeed":
        return ("`tiled_mlp` needs DeepSpeed (ZeRO stage 1-3): DeepSpeed's TiledMLP accumulates each weight's gradient "
                "over the tiles and hands it to ZeRO only after the last tile; DDP and FSDP would reduce a partial "
                "one.")
    return None


@rule(feature="alst", doc=("no TRL `activation_offloading` with ZeRO-3 "
                          "(use `gradient_checkpointing_kwargs: {offload: true}`)",
           "AttributeError: 'Tensor' object has no attribute 'ds_status' in TRL's fused loss"))
def activation_offloading_without_zero3(setup, facts: Facts):
    if setup.training.get("activation_offloading") and setup.layout.zero_stage == 3:
        return ("activation_offloading cannot be combined with DeepSpeed ZeRO-3 here: TRL's offloader works through "
                "PyTorch saved-tensor hooks, which hand a saved parameter back to the backward as a new tensor object; "
                "TRL's fused loss saves the lm_head weight and, under ZeRO-3, reads DeepSpeed's `ds_status` from it in "
                "the backward (\"AttributeError: 'Tensor' object has no attribute 'ds_status'\" in "
                "trl/kernels/chunked_logprob.py). Set `activation_offloading: false` (gradient checkpointing stays), "
                "or "
                "use ZeRO stage 1/2.")
    return None

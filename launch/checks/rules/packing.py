"""Packing (TRL's `bfd` and `bfd_split` packing, `padding_free: true`): what keeps the conversations of a packed row
apart, refused where nothing does.

TRL 1.16 turns padding-free batches on for `packing: true` with strategy `bfd` or `bfd_split`, or for `padding_free:
true` (SFTTrainer: `args.padding_free or (args.packing and args.packing_strategy in {"bfd", "bfd_split"})`). Its
collator then concatenates the micro-batch into one row with no attention mask, `position_ids` restarting at 0 at
each conversation and `cu_seq_lens_q/k` at the same boundaries. In transformers 5.23 the attention keeps the
conversations apart through those, and nothing else:

- sdpa, eager, flex_attention: `masking_utils.create_causal_mask` finds the conversations from the position_ids
  (`find_packed_sequence_indices`) and builds a block-diagonal causal mask, when the batch has no attention mask and
  no cache (TRL's compute_loss and its fused LM head pass `use_cache=False`);
- flash_attention_2/3/4, and the Hub FlashAttention kernels of transformers' own table (FLASH_ATTN_KERNEL_VERSIONS,
  wrapped in the same `_flash_attention_forward`): the varlen kernel over the collator's cu_seq_lens (or, without
  them, the ones derived from position_ids);
- anything else (`paged|eager`, another Hub kernel, an attention registered by the user) gets no mask function of
  transformers' (`_preprocess_mask_arguments` returns the mask it was given: none), so it would run over the whole
  flat row.

Context and sequence parallelism refuse padding-free batches themselves (cp_no_packing, sp_packing_safe); wrapped
packing has no boundaries to keep (its rows are token windows, chosen as such).
"""

from __future__ import annotations

from launch.checks.rules.registry import Facts, _cp, _sp, rule
# TRL 1.16's reading of padding-free batches, shared with the memory and throughput models
from launch.config.training_args import PADDING_FREE_STRATEGIES, packs_by_conversation, padding_free_batches  # noqa: F401

# transformers 5.23's attentions that take the conversation boundaries from position_ids / cu_seq_lens (above)
BOUNDARY_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4")


def model_attention(training: dict) -> str | None:
    """The attention the model is loaded with: train.py lets `model_init_kwargs` override `attn_implementation`."""
    return (training.get("model_init_kwargs") or {}).get("attn_implementation") or training.get("attn_implementation")


def keeps_boundaries(attn: str) -> bool:
    if attn in BOUNDARY_ATTENTION:
        return True
    # a Hub kernel (`org/name`, optionally `@revision`), not one function of it (`org/name:function`)
    repo = attn.split("@", 1)[0].strip()
    if "/" not in repo or ":" in attn:
        return False
    from transformers.modeling_flash_attention_utils import FLASH_ATTN_KERNEL_VERSIONS

    return repo in FLASH_ATTN_KERNEL_VERSIONS


@rule(feature="packing", doc=(
    "padding-free batches (`packing: true` with `bfd`/`bfd_split`, or `padding_free: true`) with an attention that "
    "reads the boundaries: sdpa, eager, flex_attention, flash_attention_2/3/4",
    "any other attention gets no mask from transformers: every conversation of a row attends to the earlier ones"))
def packed_attention_keeps_conversations_apart(setup, facts: Facts):
    t = setup.training
    # CP and SP refuse padding-free batches with their own rule (cp_no_packing, sp_packing_safe)
    if not padding_free_batches(t) or _cp(setup) > 1 or _sp(setup) > 1:
        return None
    attn = model_attention(t)
    if attn is None or keeps_boundaries(attn):  # None: transformers picks sdpa (eager where sdpa is missing)
        return None
    return (f"Padding-free batches (packing_strategy {t.get('packing_strategy')} with packing: "
            f"{str(bool(t.get('packing'))).lower()}, padding_free: {str(bool(t.get('padding_free'))).lower()}) put "
            f"several conversations in one row with no attention mask, and attn_implementation {attn} does not read "
            "their boundaries from the position_ids: transformers 5.23 builds a block-diagonal mask for sdpa, eager "
            "and flex_attention, and FlashAttention (flash_attention_2/3/4, its Hub kernels) runs varlen over the "
            "collator's cu_seq_lens; with any other attention each conversation would attend to the ones before it "
            "in the row. Set attn_implementation to one of those (sdpa runs everywhere), or packing: false and "
            "padding_free: false.")


@rule(feature="packing", doc=(
    "`eval_packing: true` only with `packing: true` (or `padding_free: true`)",
    "TRL packs the eval set but builds a padded collator: all-ones mask, no position_ids, conversations attend"))
def eval_packing_keeps_conversations_apart(setup, facts: Facts):
    t = setup.training
    # the eval set reaches SFTTrainer only when evaluation runs (train.py)
    if str(t.get("eval_strategy") or "no") == "no" or not packs_by_conversation(t, "eval_packing"):
        return None
    if padding_free_batches(t):
        return None
    return (f"eval_packing: true packs the eval set ({t.get('packing_strategy', 'bfd')}) while packing: false "
            "leaves TRL's collator padded (SFTTrainer turns padding-free on from `packing` and `padding_free` only): "
            "each packed eval row would get an all-ones attention mask and no position_ids, so its conversations "
            "would attend to each other and the eval loss would not be the model's. Set packing: true (the train "
            "set packed too) or padding_free: true, or eval_packing: false.")

"""Adapters (LoRA / QLoRA: launch.config.adapter): rank, alpha, dropout, quantization, target modules, sharding
a quantized base, and whether a finished run's adapter may be merged.
"""

from __future__ import annotations

import dataclasses


from launch.checks.rules.registry import Facts, probes, rule
from launch.facts import meta_model
from launch.config.adapter import Adapter
from launch.switches import is_on

def _adapter(setup):
    return Adapter.from_training(setup.training)


def _storage_shards(setup) -> bool:
    """Whether the layout shards parameters themselves (FSDP, ZeRO-3), so that a quantized base must be stored in a
    dtype the sharding can split."""
    return setup.layout.sharding == "fsdp" or (setup.layout.sharding == "zero" and setup.layout.zero_stage == 3)


@rule(feature="adapters", doc=(
    "`lora_r` at least 1",
    "PEFT refuses the rank in every rank, after the base model has loaded"))
def lora_rank_positive(setup, facts: Facts):
    a = _adapter(setup)
    if a is None or a.r >= 1:
        return None
    return (f"lora_r is {a.r}: a LoRA rank is the number of columns of the low-rank update, at least 1 (PEFT's "
            "LoraConfig refuses it in every rank after the base model has loaded). Set lora_r to a positive integer "
            "(8-64 is usual; the recipes use 16).")


# Adapter settings that PEFT, TRL or transformers refuse only in the ranks, after the model has loaded, or that
# train nothing and exit 0
@rule(feature="adapters", doc=(
    "`lora_alpha` positive",
    "0: the adapter's update is scaled by 0, nothing trains (grad_norm 0), the untrained adapter is saved, exit 0"))
def lora_alpha_positive(setup, facts: Facts):
    # PEFT accepts any alpha. 0 scales the update B A x by alpha / r = 0: both gradients are 0 and the run saves an
    # untrained adapter, exit 0. A negative alpha trains exactly the run of |alpha| mirrored (B becomes -B: SGD and
    # Adam are odd in the gradient), so it is never needed; refused too, so that one run has one alpha in its resume
    # identity (launch.config.adapter.Adapter.identity) and a slip of the sign is caught.
    a = _adapter(setup)
    if a is None or a.alpha > 0:
        return None
    why = ("makes every gradient of lora_A and lora_B 0 (grad_norm 0 at every step, DoRA's magnitudes aside): the "
           "untrained adapter would be saved as final/, with exit status 0") if a.alpha == 0 else (
           "only flips the sign of the update, which training undoes (it trains the run of the positive alpha, with "
           "lora_B negated)")
    return (f"lora_alpha is {a.alpha}: LoRA scales its update B A x by lora_alpha / lora_r (lora_alpha / sqrt(lora_r) "
            f"with use_rslora), so {a.alpha} {why}. Set lora_alpha to a positive integer (the recipes use 2 x lora_r, "
            f"here {max(2 * a.r, 1)}).")


@rule(feature="adapters", doc=(
    "`lora_dropout` in [0, 1)",
    "outside [0, 1]: torch's \"dropout probability has to be between 0 and 1\" in every rank after loading; 1: "
    "the adapter sees only zeros and trains nothing, exit 0"))
def lora_dropout_in_range(setup, facts: Facts):
    a = _adapter(setup)
    if a is None or 0 <= a.dropout < 1:
        return None
    why = ("torch.nn.Dropout refuses it in every rank after the base model has loaded (\"dropout probability has to "
           "be between 0 and 1\")") if not 0 <= a.dropout <= 1 else (
           "a dropout of 1 zeroes the adapter's input at every training step, so its gradients are 0 and the untrained "
           "adapter would be saved, with exit status 0")
    return (f"lora_dropout is {a.dropout:g}: it is the probability that LoRA drops each input element of the adapter "
            f"during training, and {why}. Set lora_dropout in [0, 1): 0.05 is TRL's default, 0 turns it off.")


@rule(feature="adapters", doc=(
    "`load_in_4bit` / `load_in_8bit` only with an adapter (`use_peft: true`)",
    "transformers: \"You cannot perform fine-tuning on purely quantized models\", in every rank after loading"))
def quantized_base_needs_adapter(setup, facts: Facts):
    t = setup.training
    bits = [b for b in (4, 8) if is_on(t.get(f"load_in_{b}bit", False))]
    if not bits or _adapter(setup) is not None:
        return None
    return (f"load_in_{bits[0]}bit is on but use_peft is off: TRL would load the base quantized "
            f"({bits[0]}-bit weights, which cannot be trained) and train no adapter on it, and transformers' Trainer "
            "refuses that in every rank after the model has loaded (\"You cannot perform fine-tuning on purely "
            "quantized models\"). Add `--use_peft true` (QLoRA: a LoRA adapter on the quantized base), or drop "
            f"load_in_{bits[0]}bit for a full fine-tune.")


@rule(feature="adapters", doc=(
    "at most one of `load_in_4bit` and `load_in_8bit`",
    "TRL: \"You can't use 8 bit and 4 bit precision at the same time\", in every rank"))
def quantization_one_kind(setup, facts: Facts):
    t = setup.training
    if not (is_on(t.get("load_in_4bit", False)) and is_on(t.get("load_in_8bit", False))):
        return None
    return ("load_in_4bit and load_in_8bit are both on: a base is quantized one way, and TRL's ModelConfig refuses "
            "both in every rank (\"You can't use 8 bit and 4 bit precision at the same time\"). Keep load_in_4bit "
            "(QLoRA, the recipes' choice) or load_in_8bit, and set the other false.")


@rule(needs_model=True, feature="adapters",
      applies=lambda setup: _adapter(setup) is not None, doc=(
          "`lora_target_modules` match at least one layer LoRA can wrap, and nothing else",
          "PEFT: \"Target modules ... not found in the base model\" (or \"Target module ... is not supported\"), "
          "in every rank after loading"))
def lora_targets_match(setup, facts: Facts):
    # The module names are the model's own, from the model built on the meta device (launch.facts.meta_model), so any
    # model
    # type is checked; a model that cannot be built here (custom code) is left to PEFT in the ranks.
    found = meta_model.modules(facts.model_config)
    if found is None:
        return None
    a = _adapter(setup)
    model = setup.training.get("model_name_or_path")
    if a.target_modules is None and (default := meta_model.default_targets(found.model_type)) is None:
        return (f"lora_target_modules is not set and PEFT has no default targets for the model type "
                f"{found.model_type!r} of {model} (it would stop every rank after loading: \"Please specify "
                "`target_modules` in `peft_config`\"). Name its layers, or use all-linear; its linear layers are "
                f"{', '.join(found.layer_linears())}.")
    targets = a if a.target_modules is not None else dataclasses.replace(a, target_modules=default)
    matched = targets.targets(found.kinds, output_layer=(found.output_layer or "lm_head").rsplit(".", 1)[-1])
    if a.all_linear:
        matched = [n for n in matched if n in found.linear]
    unsupported = sorted({f"{n.rsplit('.', 1)[-1]} ({found.kinds[n]})" for n in matched if not found.wrappable(n)})
    if matched and not unsupported:
        return None
    shown = list(a.target_modules) if isinstance(a.target_modules, tuple) else a.target_modules
    layers = ", ".join(found.layer_linears())
    if not matched:
        return (f"lora_target_modules {shown!r} match none of the linear layers of {model} (PEFT would stop every rank "
                "after loading with \"Target modules ... not found in the base model\"). Its linear layers are "
                f"{layers}; name some of them (a list matches a module whose name ends with an entry; a single string "
                "is a regular expression over the whole name), or use all-linear.")
    return (f"lora_target_modules {shown!r} match module(s) of {model} that LoRA cannot wrap: {', '.join(unsupported)} "
            "(PEFT would stop every rank after loading with \"Target module ... is not supported\"). Name linear "
            f"layers instead: {layers}; or use all-linear.")


@rule(feature="adapters", doc=(
    "a quantized base under FSDP or ZeRO-3: `load_in_4bit` with `bnb_4bit_quant_storage` equal to `dtype` "
    "(e.g. both bfloat16); no `load_in_8bit`",
    "FSDP shards only floating-point storage: Accelerate leaves uint8 4-bit weights whole on every GPU (a warning), "
    "mixed dtypes fail to flatten"))
def quantized_base_shardable(setup, facts: Facts):
    a = _adapter(setup)
    if a is None or a.quantization is None or not _storage_shards(setup):
        return None
    q = a.quantization
    where = setup.layout.strategy
    if q.bits == 8:
        return (f"load_in_8bit cannot be sharded by {where}: LLM.int8 weights are int8 tensors with their own "
                "statistics, which FSDP and ZeRO-3 cannot split. Use QLoRA's 4-bit base (load_in_4bit: true, "
                "bnb_4bit_quant_storage: bfloat16, dtype: bfloat16) or a layout that keeps the weights whole (DDP).")
    load = str(setup.training.get("dtype") or "float32").replace("torch.", "")
    if q.storage_dtype == load and load in ("bfloat16", "float16", "float32"):
        return None
    return (f"load_in_4bit under {where} needs bnb_4bit_quant_storage equal to the model's dtype (now "
            f"{q.storage_dtype} and {load}): FSDP and ZeRO-3 shard only floating-point tensors of one dtype, so "
            "bitsandbytes must pack the 4-bit weights into that dtype (PEFT's and bitsandbytes' FSDP-QLoRA docs). With "
            "uint8 storage Accelerate keeps every 4-bit weight whole on every GPU instead. Set "
            "bnb_4bit_quant_storage: bfloat16 and dtype: bfloat16.")


@rule(feature="adapters", doc=(
    "QLoRA (`load_in_4bit`) on CPU only where bitsandbytes' 4-bit path trains on CPU "
    "(`launch.config.adapter.quantization_on_cpu_supported`)",
    "bitsandbytes fails in the ranks after loading"))
def quantized_base_on_cpu(setup, facts: Facts):
    a = _adapter(setup)
    if a is None or a.quantization is None or not setup.options.cpu or probes().quantization_on_cpu_supported():
        return None
    return (f"A {a.quantization.bits}-bit base (load_in_{a.quantization.bits}bit) was asked for on CPU, where "
            "bitsandbytes' quantized training does not run at our pins (launch/config/adapter.py "
            "`quantization_on_cpu_supported` says why). Run it on a GPU, or drop load_in_4bit / load_in_8bit for a "
            "CPU check of the LoRA run (the same adapter on an unquantized base).")


@rule(feature="adapters", doc=(
    "an adapter under FSDP checkpoints with the training config's `activation_checkpointing` (or "
    "`gradient_checkpointing`), not `fsdp_activation_checkpointing`",
    "the adapter is saved EMPTY (0 tensors in final/ and in every checkpoint), silently"))
def adapter_with_fsdp_activation_checkpointing(setup, facts: Facts):
    if _adapter(setup) is None or setup.layout.sharding != "fsdp" or not setup.checkpointing.fsdp:
        return None
    why = ("FSDP's checkpointing wraps each decoder layer in torch's checkpoint_wrapper, so module names gain "
           "`._checkpoint_wrapped_module.`, which PEFT's get_peft_model_state_dict does not strip (it strips "
           "`_fsdp_wrapped_module.` only): final/ and every checkpoint's adapter_model.safetensors would hold 0 "
           "tensors, silently (measured with peft 0.21.2, accelerate 1.15).")
    return (f"A LoRA / QLoRA run under FSDP cannot use fsdp_activation_checkpointing: true. {why} Set "
            "fsdp_activation_checkpointing: false in the Accelerate config and activation_checkpointing: true in "
            "config.yaml (transformers' checkpointing: the adapter is saved whole).")


@rule(feature="adapters", doc=(
    "no `optim: paged_adamw_8bit` for QLoRA under FSDP",
    "PEFT's FSDP docs: it fails when the checkpoint is saved"))
def qlora_fsdp_optimizer(setup, facts: Facts):
    a = _adapter(setup)
    if (a is None or a.method != "qlora" or setup.layout.sharding != "fsdp"
            or str(setup.training.get("optim") or "") != "paged_adamw_8bit"):
        return None
    return ("optim: paged_adamw_8bit with QLoRA under FSDP fails when the first checkpoint is saved, after the "
            "training time spent to reach it (a caveat of PEFT's FSDP-QLoRA docs, peft docs/source/accelerate/"
            "fsdp.md). Use optim: adamw_torch_fused, the default: the adapter's optimizer states are small anyway.")


def merge_problems(identity: dict | None, allow_quantized: bool = False) -> list[str]:
    """Why the adapter of a finished run cannot be merged into its base (`python -m launch merge`), from the run's
    recorded identity (`launch.run.checkpoints.identity`: its "adapter" entry is `Adapter.identity()`). Merging runs in
    one process on the unsharded base (PEFT's `merge_and_unload` is not supported under FSDP, PEFT's FSDP docs), so
    the training layout itself never stops it; what does: no adapter, or a quantized base, whose merge into the
    unquantized weights is not the model that was trained (unless asked for)."""
    adapter = (identity or {}).get("adapter")
    if not adapter:
        return ["This run trained the whole model (its recorded identity has no adapter): its final folder is already "
                "a full model that loads in transformers, so there is nothing to merge."]
    quant = adapter.get("quantization")
    if quant and not allow_quantized:
        return [f"This adapter was trained on a {quant.get('bits')}-bit base ({adapter.get('method')}): PEFT merges it "
                "into the unquantized weights, which the adapter never saw, so the merged model differs from the "
                "trained one by the quantization error (its eval loss will not reproduce the run's). Merge anyway with "
                "`python -m launch merge RUN_DIR --allow-quantized`, or use the adapter on the 4-bit base as trained."]
    return []

"""Precision: fp16 on CPU, and pure 16-bit training whose Adam updates round away.
"""

from __future__ import annotations

import math


from launch.checks.rules.registry import Facts, rule
from launch.config.adapter import Adapter
from launch.config.precision import Precision, half_step
from launch.switches import is_on

@rule()
def precision_fits_device(setup, facts: Facts):
    if setup.options.cpu and is_on(setup.training.get("fp16")):
        return (
            "fp16 mixed precision was asked for a CPU run; Accelerate has no fp16 autocast on CPU (the Accelerator "
            "would stop with \"fp16 mixed precision requires a device in ...\"). Drop --fp16: the CPU path trains in "
            "fp32, or in bf16 with `-- --bf16 true` (torch's CPU autocast, the recipe's own load dtype)."
        )
    return None


# The typical magnitudes the pure-16-bit rule checks an update against: RMSNorm scales start at 1.0 (the largest
# weights of a decoder, so the first whose updates round away), and a trained linear layer's weights are of the size of
# its initialisation, std 0.02 (transformers' `initializer_range` default, Llama / Qwen configs).
NORM_SCALE = 1.0
LINEAR_WEIGHT = 0.02


def _adapter_magnitude(setup, facts: Facts) -> float | None:
    """Typical |weight| of a LoRA A matrix at initialisation: PEFT's kaiming_uniform(a=sqrt(5)) draws from
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), mean |w| = 1/(2 sqrt(fan_in)), fan_in = hidden_size (B starts at zero, where
    no update rounds away). None when the model's config.json was not read."""
    hidden = getattr(facts.model_config, "hidden_size", None)
    return 1 / (2 * math.sqrt(hidden)) if hidden else None


@rule(doc=(
    "trainable weights with an fp32 master copy (fp32 `dtype` under DDP), or --pure-bf16",
    "pure bf16 training silently rounds away every Adam update below half a bf16 step of its weight "
    "(at 1.0: lr < 2^-8)"))
def pure_16bit_update_rounds_away(setup, facts: Facts):
    precision = setup.precision
    if precision.load_dtype == "auto" and facts.model_config is not None:  # `dtype: auto`: the checkpoint's own
        checkpoint = getattr(facts.model_config, "dtype", None) or getattr(facts.model_config, "torch_dtype", None)
        precision = Precision.resolve(setup.layout.kind, setup.accelerate, setup.training,
                                      Adapter.from_training(setup.training), "cpu" if setup.options.cpu else "gpu",
                                      checkpoint_dtype=str(checkpoint or ""), sp=setup.layout.sp)
    if not precision.pure_16bit or setup.options.pure_bf16:
        return None
    lr = float(setup.training.get("learning_rate") or 0)
    dtype = precision.trainable_dtype
    if precision.adapter:
        magnitude = _adapter_magnitude(setup, facts)
        if magnitude is None:
            return None
        what = f"of the LoRA A weights at their typical size ({magnitude:.2g} at initialisation)"
    else:
        magnitude = NORM_SCALE
        what = "of the weights near 1.0 (the RMSNorm scales)"
    half = half_step(dtype, magnitude)
    if lr >= half:
        return None
    return _rounds_away_message(setup, precision, lr, what, half)


def _rounds_away_message(setup, precision, lr: float, what: str, half: float) -> str:
    """The refusal of `pure_16bit_update_rounds_away`: what is lost at this learning rate (only what is), the dtype as
    the user gave it, and the fix for this run's 16-bit type and mixed precision."""
    dtype = precision.trainable_dtype
    # as the user wrote it (`auto` stays `auto`): model_init_kwargs' dtype over ModelConfig's, as train.py merges them
    given = (setup.training.get("model_init_kwargs") or {}).get("dtype") or setup.training.get("dtype") \
        or setup.precision.load_dtype
    where = f"`dtype: {given}`" + (f" ({setup.explicit['dtype'][1]})" if "dtype" in setup.explicit else "")
    if str(given).strip().lower() == "auto":
        where += f", which loads the checkpoint's own {precision.load_dtype} (its config.json),"
    trained = "adapter" if precision.adapter else "model"
    autocast = "mixed precision is off" if precision.mixed == "no" else \
        f"`{precision.mixed}` mixed precision only autocasts"
    also = ""
    if not precision.adapter:
        linear = half_step(dtype, LINEAR_WEIGHT)
        also = (f", and most updates of weights of typical size {LINEAR_WEIGHT} (half a step there is {linear:.2g})"
                if lr < linear else
                f"; the updates of weights of typical size {LINEAR_WEIGHT} (half a step there is {linear:.2g}) are "
                "kept at this rate, but the weights near 1.0 stop training")
    if precision.mixed == "no":
        then, autocast_too = ("the run then computes in fp32 and Adam updates fp32 weights",
                              "; `-- --bf16 true` adds bf16 autocast over them")
    else:
        then, autocast_too = (f"the Trainer's `{precision.mixed}: true` then computes in {precision.compute_dtype} "
                              "under autocast and Adam updates fp32 masters", "")
    fix = ("Train the adapter in fp32: PEFT does unless the base is quantized; TRL 1.16 casts a quantized model's "
           "adapter to bf16, which FSDP1 with mixed precision upcasts again (qlora-fsdp), or use a larger "
           "learning_rate" if precision.adapter else
           f"Load the model in fp32 (`dtype: float32` in config.yaml, or `-- --dtype float32`): {then} "
           f"({precision.bytes_per_param} bytes per parameter now, 16 then: `python -m launch plan` shows "
           f"what fits{autocast_too}); or use a strategy that keeps fp32 masters (DeepSpeed ZeRO, FSDP)")
    if dtype == "float16" and precision.mixed == "fp16":
        # torch.amp.GradScaler.unscale_ raises on float16 gradients; Accelerate's fp16 scaler unscales at every
        # optimizer step (clip_grad_norm_, scaler.step)
        on_purpose = ("Pure float16 does not train under `fp16: true` at all, --pure-bf16 or not: the fp16 loss "
                      "scaler (torch's GradScaler) refuses float16 gradients (\"Attempting to unscale FP16 "
                      "gradients.\") at the first optimizer step; fp16 training needs fp32 weights (the fix above).")
    elif dtype == "float16":
        on_purpose = ("To train pure float16 on purpose (no loss scaling, so small gradients may underflow), pass "
                      "--pure-bf16: it allows pure 16-bit training in either 16-bit type.")
    else:
        on_purpose = f"To train pure {dtype} on purpose, pass --pure-bf16."
    return (
        f"This run trains pure {dtype}: {where} under {setup.layout.strategy} keeps the trainable {trained} weights, "
        f"their gradients and Adam's states in {dtype} and updates the weights in place, with no fp32 master copy "
        f"({autocast}). An Adam update is about the learning rate in size, and one smaller than half a {dtype} step "
        f"of its weight rounds back to the weight: at learning_rate {lr:g} every update {what} is lost (half a step "
        f"there is {half:.2g}){also}, so the run silently trains less than it says. {fix}. {on_purpose}"
    )

"""The run's precision, resolved once from its two configs: the dtype the model is loaded in, the mixed precision it
computes in, and, per strategy, the dtype its trainable parameters, gradients and optimizer states are kept in and
where the fp32 master weights the optimizer updates live (or that there are none: pure 16-bit training).

Precision is a property of the run like the adapter: `Precision.resolve` reads it once; `Setup.precision`
(launch.run.resolve) holds it for the rules (`launch.checks.rules.pure_16bit_update_rounds_away`) and the dry run,
and the memory model's `RunShape.precision` is the same resolution (its bytes per parameter come from here).

What each strategy does with a model loaded in `dtype` under the Trainer's `bf16: true`, read in the pinned sources
(accelerate 1.15, deepspeed 0.19.8, torch 2.13, peft 0.21.2, trl 1.16):
- DDP and one process: Accelerate's `prepare_model` wraps the forward in `torch.autocast(bf16)` and nothing else, so
  the parameters, their gradients and AdamW's states (`zeros_like(param)`) stay in the load dtype. Loaded in fp32,
  the parameters are the fp32 masters; loaded in bf16, the run trains pure bf16 (no master: an Adam update smaller
  than half a bf16 step of its weight is rounded away). DDP reduces the gradients in their own dtype.
- DeepSpeed ZeRO 1-3 (bf16 enabled by the Trainer's `deepspeed_plugin.set_mixed_precision`): the engine keeps the
  module in bf16 and its ZeRO optimizer an fp32 copy of each partition (stage_1_and_2.py
  `single_partition_of_fp32_groups`, stage3.py `fp32_partitioned_groups_flat`) with fp32 Adam states: fp32 masters
  whatever the load dtype. Gradients are accumulated in `grad_accum_dtype` (default: the model dtype, bf16) and
  reduced in `communication_data_type` (default: bf16); an Accelerate YAML without a DeepSpeed JSON cannot set
  either.
- FSDP2: with mixed precision on, Accelerate's `fsdp2_prepare_model` upcasts every trainable parameter to fp32 before
  `fully_shard` ("Upcast to fp32 master weights"; not when the model holds bitsandbytes 4-bit weights), and
  `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)` (Accelerate's `set_mixed_precision`) casts the
  all-gathered copy for compute and reduce-scatters the gradients in bf16 into fp32 shards.
- FSDP1: each unit's FlatParameter holds one dtype; with mixed precision on, Accelerate's `prepare_model` upcasts every
  trainable FlatParameter to fp32 ("we follow DeepSpeed's strategy to hold the parameters in full precision",
  accelerator.py) and `MixedPrecision(param_dtype=bf16, reduce_dtype=bf16)` casts it for compute; frozen units keep
  their dtype.
- Adapters (LoRA): PEFT's `get_peft_model(autocast_adapter_dtype=True)` makes bf16/fp16 adapter weights fp32 (the
  base stays in its dtype, frozen); TRL 1.16's SFTTrainer passes `autocast_adapter_dtype=False` under ZeRO-3 (the
  adapter takes the base's dtype; DeepSpeed still keeps fp32 masters) and casts a quantized model's adapter to bf16
  after `get_peft_model` (QLoRA paper; trl/trainer/sft_trainer.py). Under FSDP1 with mixed precision Accelerate's
  upcast makes that adapter fp32 again: PEFT's FSDP wrap policy (transformers `update_fsdp_plugin_peft`) gives
  every LoRA layer a unit of its own, so its fp32 FlatParameter does not share a unit with the 16-bit (and 4-bit)
  base. Under FSDP2 Accelerate skips its upcast when the model holds 4-bit weights: a QLoRA adapter stays bf16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launch.switches import is_on

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LOW = ("bfloat16", "float16")
# Significand bits (the implicit one included) of the 16-bit float types: a value in [2**e, 2**(e+1)) is a multiple
# of 2**(e + 1 - bits), so an update smaller than half that step rounds back to the value.
SIGNIFICAND_BITS = {"bfloat16": 8, "float16": 11}
MIXED_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "no": None}

# Where the fp32 weights the optimizer updates live (`Precision.master`), by what keeps them
MASTER_PARAMETERS = "the trainable parameters themselves (fp32)"
MASTER_DEEPSPEED = "DeepSpeed's ZeRO optimizer (an fp32 copy of each partition)"
MASTER_FSDP2 = "FSDP2's shards (Accelerate upcasts the trainable parameters to fp32)"
MASTER_FSDP1 = "FSDP1's flat parameters (Accelerate upcasts the trainable ones to fp32)"


def dtype_name(value, default: str = "float32") -> str:
    """A dtype as config files and transformers spell it ("bf16", "torch.bfloat16", "half", ...), named as torch
    does ("bfloat16"); "auto" stays "auto" (the checkpoint's own dtype, known only once loaded)."""
    v = str(value or default).replace("torch.", "").strip().lower()
    return {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}.get(v, v)


def mixed_precision(accelerate: dict, training: dict) -> str:
    """"bf16", "fp16" or "no": the Trainer's `bf16` / `fp16` win over the Accelerate config's `mixed_precision`
    (transformers TrainingArguments.__post_init__ sets `mixed_precision` from them, and the Trainer passes it to the
    Accelerator); SFTConfig's `bf16` defaults to true unless `fp16` is set."""
    if is_on(training.get("fp16", False)):
        return "fp16"
    bf16 = training.get("bf16")
    if bf16 is None or is_on(bf16):  # None: SFTConfig's default, true when fp16 is not set
        return "bf16"
    return str(accelerate.get("mixed_precision", "no") or "no")


def load_dtype(training: dict, checkpoint_dtype: str | None = None) -> str:
    """The dtype train.py loads the model in: `model_init_kwargs.dtype` over ModelConfig's `dtype` (default float32),
    as templates/train.py merges them; `auto` is the checkpoint's own (`checkpoint_dtype`, when known)."""
    kwargs = training.get("model_init_kwargs") or {}
    load = dtype_name(kwargs.get("dtype") or training.get("dtype"))
    return dtype_name(checkpoint_dtype) if load == "auto" and checkpoint_dtype else load


def _deepspeed_reduce(dtype: str, sp: int) -> str:
    """The dtype DeepSpeed reduces gradients in: `communication_data_type` (default: the model dtype), which the
    engine replaces by `seq_parallel_communication_data_type` (default fp32, deepspeed/runtime/constants.py) when a
    sequence-parallel group is registered (Accelerate registers Ulysses SP's, sp > 1: engine.py)."""
    return "float32" if sp > 1 else dtype


def half_step(dtype: str, magnitude: float) -> float:
    """Half the spacing of `dtype` at `magnitude`: an update smaller than this rounds back to the weight (round to
    nearest even). 0 for fp32 (an update this code ever checks does not round away there)."""
    bits = SIGNIFICAND_BITS.get(dtype)
    if bits is None or magnitude <= 0:
        return 0.0
    return 2.0 ** (math.floor(math.log2(magnitude)) + 1 - bits) / 2


@dataclass(frozen=True)
class Precision:
    """A run's precision: `resolve` reads it off the run's layout and configs."""

    load_dtype: str  # the weights as loaded (`dtype`): "float32", "bfloat16", "float16" or "auto"
    mixed: str  # "bf16" | "fp16" | "no": autocast (DDP, FSDP), FSDP's param_dtype, DeepSpeed's 16-bit module
    trainable_dtype: str  # the trainable parameters as the optimizer's step sees them (or their 16-bit copy)
    gradient_dtype: str  # gradients as accumulated over micro-batches
    reduce_dtype: str  # gradients as reduced across data-parallel ranks
    master: str | None  # where the fp32 weights the optimizer updates live; None: nowhere (pure 16-bit)
    adapter: bool = False  # the trainable parameters are a LoRA adapter's (the base is frozen in `load_dtype`)

    # ---- reading it -----------------------------------------------------------------------------------------------
    @classmethod
    def resolve(cls, kind: str, accelerate: dict, training: dict, adapter=None, device: str = "gpu",
                checkpoint_dtype: str | None = None, sp: int = 1) -> Precision:
        """The precision of a run: its strategy (`Layout.kind`), its Accelerate config, its merged training arguments
        (a missing key is the default the ranks get: ModelConfig's `dtype` float32, SFTConfig's bf16) and its adapter
        (`launch.config.adapter.Adapter`, read from the same arguments; None: a full fine-tune).
        On CPU the CPU profile's arguments decide, as on a GPU (fp32 unless the run asks for bf16); fp16 there is
        refused before start (`rules.precision_fits_device`). `checkpoint_dtype`: the model's config.json dtype,
        what `dtype: auto` loads (unknown otherwise)."""
        training = training or {}
        mixed = mixed_precision(accelerate or {}, training)
        if device == "cpu" and mixed == "fp16":
            mixed = "no"
        return cls.of(kind, load_dtype(training, checkpoint_dtype), mixed, adapter, sp)

    @classmethod
    def of(cls, kind: str, load: str, mixed: str, adapter=None, sp: int = 1) -> Precision:
        """The precision of a run of strategy `kind` ("ddp", "single", "deepspeed", "fsdp1", "fsdp2": `Layout.kind`)
        loaded in `load` under mixed precision `mixed` ("bf16", "fp16", "no"), training `adapter` (a
        `launch.config.adapter.Adapter`, or None), with Ulysses sequence parallelism over `sp` ranks: the module
        docstring says where each answer comes from. (Plain values, not the Layout and Adapter classes: this module sits
        below both the memory model and the resolver.)"""
        load = dtype_name(load)
        low = MIXED_DTYPE[mixed]
        if adapter is not None:
            return cls._adapter(kind, load, mixed, adapter, sp)
        if kind == "deepspeed":
            if low:  # the engine's 16-bit module, fp32 partitions in the ZeRO optimizer
                return cls(load, mixed, low, low, _deepspeed_reduce(low, sp), MASTER_DEEPSPEED)
            param = load if load in LOW else "float32"
            return cls(load, mixed, param, param, param, MASTER_DEEPSPEED)
        if kind in ("fsdp1", "fsdp2") and low:
            return cls(load, mixed, "float32", "float32", low, MASTER_FSDP2 if kind == "fsdp2" else MASTER_FSDP1)
        param = "float32" if load == "auto" else load  # "auto": unknown until loaded; counted as fp32
        reduce = low if (kind in ("fsdp1", "fsdp2") and low) else param
        return cls(load, mixed, param, param, reduce, MASTER_PARAMETERS if param == "float32" else None)

    @classmethod
    def _adapter(cls, kind: str, load: str, mixed: str, adapter, sp: int = 1) -> Precision:
        low = MIXED_DTYPE[mixed]
        if kind == "deepspeed":
            # ZeRO-3 without quantization: TRL's autocast_adapter_dtype=False, the adapter in the base's dtype; the
            # engine's module is 16-bit under bf16 either way, with fp32 partitions in the ZeRO optimizer
            dtype = low or ("float32" if load == "auto" else load)
            return cls(load, mixed, dtype, dtype, _deepspeed_reduce(dtype, sp), MASTER_DEEPSPEED, adapter=True)
        if kind == "fsdp1" and low:  # Accelerate upcasts the adapter's own FlatParameters
            return cls(load, mixed, "float32", "float32", low, MASTER_FSDP1, adapter=True)
        # TRL casts a quantized model's adapter to bf16 (FSDP2 keeps it: no upcast with 4-bit weights); PEFT's
        # autocast_adapter_dtype makes any other adapter fp32
        dtype = "bfloat16" if adapter.quantization is not None else "float32"
        reduce = low if (kind in ("fsdp1", "fsdp2") and low) else dtype
        if kind == "fsdp1" and adapter.quantization is not None and adapter.quantization.storage_dtype in LOW:
            reduce = adapter.quantization.storage_dtype  # transformers' update_fsdp_plugin_peft: the storage dtype
        return cls(load, mixed, dtype, dtype, reduce, MASTER_PARAMETERS if dtype == "float32" else None,
                   adapter=True)

    # ---- what the memory model reads -------------------------------------------------------------------------------
    @property
    def compute_dtype(self) -> str:
        """The matmuls' dtype: the mixed-precision dtype, else the trainable parameters'."""
        return MIXED_DTYPE[self.mixed] or self.trainable_dtype

    @property
    def forward_weight_dtype(self) -> str:
        """The trainable weights as the modules hold them in the forward: FSDP's all-gathered copy in its param_dtype,
        else the parameters themselves (DDP's fp32 masters reach a custom autograd Function, TRL's fused LM head, as
        fp32; autocast casts only inside the ops it lists)."""
        if self.master in (MASTER_FSDP1, MASTER_FSDP2):
            return self.compute_dtype
        return self.trainable_dtype

    @property
    def residual_dtype(self) -> str:
        """The hidden states between the layers (the residual stream): under autocast the embedding lookup and the
        residual adds are not autocast ops, so they keep the dtype of the weights the forward holds: fp32 for a DDP
        or one-process run loaded in fp32 (an fp32 + bf16 sum is fp32), the 16-bit one where DeepSpeed's module or
        FSDP's param_dtype is 16-bit. Without mixed precision, the compute dtype."""
        low = MIXED_DTYPE[self.mixed]
        if not low:
            return self.compute_dtype
        if self.master in (MASTER_DEEPSPEED, MASTER_FSDP1, MASTER_FSDP2):
            return low
        return "float32" if self.load_dtype in ("float32", "auto") else self.load_dtype

    @property
    def param_bytes(self) -> int:
        """Bytes of a trainable parameter as kept on the device between steps (DeepSpeed: its 16-bit copy)."""
        return BYTES.get(self.trainable_dtype, 4)

    @property
    def grad_bytes(self) -> int:
        return BYTES.get(self.gradient_dtype, 4)

    @property
    def master_bytes(self) -> int:
        """Bytes of the separate fp32 master copy per trainable parameter: 4 where the optimizer keeps one beside a
        16-bit parameter (DeepSpeed), 0 where the parameter is the master or where there is none."""
        return 4 if self.master == MASTER_DEEPSPEED and self.param_bytes < 4 else 0

    @property
    def adam_bytes(self) -> int:
        """AdamW's exp_avg and exp_avg_sq per trainable parameter: `zeros_like` the tensor the step updates (the
        fp32 master under DeepSpeed)."""
        return 8 if self.master == MASTER_DEEPSPEED else 2 * self.param_bytes

    @property
    def bytes_per_param(self) -> int:
        """Model-state bytes per trainable parameter, unsharded: parameter + gradient + master + Adam."""
        return self.param_bytes + self.grad_bytes + self.master_bytes + self.adam_bytes

    @property
    def autocast_copies(self) -> bool:
        """Whether autocast makes (and, within one forward, caches: torch's autocast weight cache) a 16-bit copy of
        every trainable weight a matmul reads: fp32 parameters under bf16/fp16 autocast where nothing else casts
        them (DDP, one process; FSDP's param_dtype and DeepSpeed's 16-bit module hand autocast 16-bit weights)."""
        return self.mixed != "no" and self.trainable_dtype == "float32" and self.master == MASTER_PARAMETERS

    # ---- what the rules read ----------------------------------------------------------------------------------------
    @property
    def pure_16bit(self) -> bool:
        """The optimizer updates 16-bit weights with no fp32 copy: updates below half a 16-bit step round away."""
        return self.master is None and self.trainable_dtype in LOW

    # ---- what the dry run prints ------------------------------------------------------------------------------------
    def describe(self) -> str:
        """Three lines for the dry run, in the layout's format."""
        mixed = f"{MIXED_DTYPE[self.mixed]} ({self.mixed} mixed precision)" if MIXED_DTYPE[self.mixed] else \
            f"{self.compute_dtype} (no mixed precision)"
        trained = "adapter" if self.adapter else "trainable parameters"
        master = self.master or f"none: the {trained} are {self.trainable_dtype}, updated in place (pure 16-bit)"
        parts = [f"{self.param_bytes} weight", f"{self.grad_bytes} gradient"]
        if self.master_bytes:
            parts.append(f"{self.master_bytes} fp32 master")
        parts.append(f"{self.adam_bytes} Adam")
        return "\n".join([
            f"precision                loaded in {self.load_dtype}, computed in {mixed}",
            f"fp32 master weights      {master}",
            (f"model states             {self.bytes_per_param} bytes per trainable parameter ({' + '.join(parts)}); "
             f"gradients accumulated in {self.gradient_dtype}, reduced in {self.reduce_dtype}"),
        ])

"""The memory terms of an adapter run (LoRA / QLoRA, `RunShape.adapter`): what is trainable, the frozen base in its
dtype or 4-bit, and what the LoRA path adds to a layer's activations. `terms.py` calls these where a full fine-tune
would count every parameter as trainable.

Read against peft 0.21 (`LoraLayer.update_layer`, `Linear.forward`: `result = base_layer(x) +
lora_B(lora_A(dropout(x))) * scaling`; `get_peft_model(autocast_adapter_dtype=True)` casts bf16/fp16 adapter weights
to fp32), bitsandbytes 0.50 (`Params4bit`: two 4-bit weights per byte, one absmax per 64-weight block, fp32, or 8-bit
with an fp32 per 256 under double quantization; `MatMul4Bit.backward` dequantizes the whole weight to compute the
input gradient) and transformers' bnb quantizer (every nn.Linear but the output embeddings is quantized)."""

from __future__ import annotations

from launch.memory.architecture import Architecture
from launch.memory.run_shape import RunShape
from launch.config.precision import BYTES


def adapter_params(arch: Architecture, run: RunShape) -> int:
    """Trainable adapter parameters: r x (in + out) per targeted linear (lora_A [r, in], lora_B [out, r]), + out per
    targeted linear with DoRA (its magnitude vector)."""
    adapter = run.adapter
    shapes = arch.linear_layers()
    n = 0
    for name in adapter.targets(arch.linear_module_names()):
        suffix = name.rsplit(".", 1)[-1]
        if suffix == "lm_head":  # a regex or an explicit list may name it
            fan_in, fan_out = arch.hidden_size, arch.vocab_size
        else:
            _parent, fan_in, fan_out = shapes[suffix]
        n += adapter.r * (fan_in + fan_out) + (fan_out if adapter.use_dora else 0)
    return n


def adapter_dtype_bytes(run: RunShape) -> int:
    """Bytes of an adapter parameter (and of its gradient; Adam's states are `zeros_like` it outside DeepSpeed):
    `run.precision`'s reading (launch.config.precision): PEFT's default `autocast_adapter_dtype=True` makes bf16/fp16
    adapters fp32; TRL 1.16's SFTTrainer keeps them in the base's dtype under DeepSpeed ZeRO-3
    (`autocast_adapter_dtype=False`) and casts a quantized model's adapter to bf16, which the recipes' train.py undoes
    where the adapter trains in FSDP1 units of its own (qlora-fsdp); DeepSpeed's module is 16-bit under bf16."""
    return run.precision.param_bytes


def lm_head_trains(arch: Architecture, run: RunShape) -> bool:
    """Whether the LM head's weight gets a gradient: always in a full fine-tune; under an adapter only when
    `lora_modules_to_save` names it (a LoRA on the head leaves its weight frozen). Otherwise TRL's fused LM head
    skips its fp32 grad_weight (`ctx.needs_input_grad`, trl/kernels/chunked_logprob.py)."""
    return run.adapter is None or "lm_head" in run.adapter.modules_to_save


def trainable_params(arch: Architecture, run: RunShape) -> int:
    """Parameters with gradients and optimizer states: all of them in a full fine-tune, the adapter's otherwise."""
    return arch.num_params if run.adapter is None else adapter_params(arch, run)


def quantized_params(arch: Architecture, run: RunShape) -> int:
    """Base weights bitsandbytes quantizes: every decoder layer's linear weights (biases and norms stay in the load
    dtype, the embeddings and the LM head are not quantized). 0 without quantization."""
    if run.adapter is None or run.adapter.quantization is None:
        return 0
    return arch.num_layers * arch.matmul_params_per_layer


def base_dtype_bytes(run: RunShape) -> int:
    """Bytes of a frozen, unquantized base element: the load dtype (nothing upcasts frozen parameters: Accelerate's
    FSDP2 fp32 upcast touches `requires_grad` parameters only, fsdp_utils.py; the CPU profile loads fp32 unless the
    run asks for bf16), 16-bit under DeepSpeed bf16/fp16 (the engine casts the whole module)."""
    if run.layout.sharding == "zero" and run.precision.mixed in ("bf16", "fp16"):
        return 2
    return BYTES.get(run.precision.load_dtype, 4)


def frozen_bytes(arch: Architecture, run: RunShape) -> dict:
    """One whole copy of the frozen base, split into what FSDP can shard and what it cannot: {"shardable",
    "unshardable"}. Accelerate's FSDP2 leaves 4-bit weights stored as uint8 (bitsandbytes' default storage) out of
    `fully_shard` (fsdp_utils.py: "Default uint8 quant_storage cannot survive fully_shard's DTensor conversion"), so
    each rank keeps all of them; a floating storage dtype (`bnb_4bit_quant_storage: bfloat16`) shards."""
    if run.adapter is None:
        return {"shardable": 0.0, "unshardable": 0.0}
    q = quantized_params(arch, run)
    rest = (arch.num_params - q) * base_dtype_bytes(run)
    if not q:
        return {"shardable": float(rest), "unshardable": 0.0}
    quant = q * run.adapter.quantization.bytes_per_weight
    floating = run.adapter.quantization.storage_dtype in ("bfloat16", "float16", "float32")
    if run.layout.sharding == "fsdp" and not floating:
        return {"shardable": float(rest), "unshardable": quant}
    return {"shardable": rest + quant, "unshardable": 0.0}


def frozen_layer_bytes(arch: Architecture, run: RunShape) -> float:
    """One decoder layer's frozen weights as FSDP gathers them: 4-bit packed (+ quantization state) or the compute
    dtype; the adapter's own weights are tiny and counted with the trainable parameters."""
    a = BYTES[run.precision.compute_dtype] if run.precision.mixed != "no" else base_dtype_bytes(run)
    if quantized_params(arch, run):
        rest = arch.params_per_layer - arch.matmul_params_per_layer
        return arch.matmul_params_per_layer * run.adapter.quantization.bytes_per_weight + rest * a
    return arch.params_per_layer * a


def lora_saved_bytes_per_token(arch: Architecture, run: RunShape, parent: str) -> float:
    """Bytes per local token that one layer's LoRA paths (of `parent`: "self_attn" or "mlp") save for the backward.
    PEFT's `lora.Linear.forward` runs `lora_B(lora_A(dropout(x)))` per targeted linear on `x` cast to the adapter's
    dtype (`_cast_input_dtype`; `adapter_dtype_bytes`), one per targeted linear although q/k/v share their input.
    Saved: lora_A's input (`in` wide: in the autocast dtype under bf16/fp16 mixed precision, which casts it again,
    else the adapter's dtype), dropout's mask (lora_dropout > 0: on a GPU CUDA's fused kernel keeps a bool mask, 1
    byte per element; on a CPU torch multiplies by a mask in the input's dtype, the adapter's: aten `_dropout_impl`),
    and lora_B's input (`r` wide, same dtype). Counted as a new tensor even without dropout: the dtype cast or
    autocast's makes one."""
    adapter = run.adapter
    if adapter is None:
        return 0.0
    autocast = run.precision.mixed != "no"
    a = BYTES[run.precision.compute_dtype] if autocast else adapter_dtype_bytes(run)
    mask = 0 if adapter.dropout <= 0 else 1 if run.device == "gpu" else adapter_dtype_bytes(run)
    shapes = arch.linear_layers()
    suffixes = {n.rsplit(".", 1)[-1] for n in adapter.targets(arch.linear_module_names())} - {"lm_head"}
    total = 0.0
    for suffix in suffixes:
        if shapes[suffix][0] != parent:
            continue
        fan_in = shapes[suffix][1]
        total += (a + mask) * fan_in + a * adapter.r
    return total


def dequantized_weight_bytes(arch: Architecture, run: RunShape) -> float:
    """QLoRA's backward through a 4-bit linear dequantizes its whole weight in the compute dtype (bitsandbytes
    `MatMul4Bit.backward`: `F.dequantize_4bit(B, quant_state).to(dtype)`): the largest linear of a layer, once."""
    if not quantized_params(arch, run):
        return 0.0
    a = BYTES.get(run.precision.compute_dtype, 4)
    return a * max(fan_in * fan_out for _p, fan_in, fan_out in arch.linear_layers().values())
